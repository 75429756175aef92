"""A local sandbox: a folder that stands in for an agent's container filesystem.

Steps and agents name files by their in-container path (``/app/artifact/q3.png``); the
local sandbox maps that path under its root and refuses any path that would escape it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class SandboxPathError(ValueError):
    """A path that would leave the sandbox root."""


@dataclass(frozen=True)
class LocalSandbox:
    root: Path

    def resolve(self, container_path: str) -> Path:
        """Map an absolute (or root-relative) container path to a host path under the root."""
        parts = PurePosixPath("/", container_path).parts[1:]
        if ".." in parts:
            raise SandboxPathError(f"path {container_path!r} leaves the sandbox")
        host = self.root.joinpath(*parts)
        root = self.root.resolve()
        resolved = host.resolve()
        if resolved != root and root not in resolved.parents:
            raise SandboxPathError(f"path {container_path!r} leaves the sandbox")
        return host
