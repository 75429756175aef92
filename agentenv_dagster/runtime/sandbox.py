"""A local sandbox: a folder that stands in for an agent's container filesystem.

Steps and agents name files by their in-container path (``/app/artifact/q3.png``), mapped under the root (a
path that would escape it is refused); a sandbox backed by a container is probed inside it (:class:`ContainerFiles`).
"""

from __future__ import annotations

import errno
import os
import posixpath
import shlex
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from .shell import HostShell, ShellResult

if TYPE_CHECKING:
    from .containers import ContainerSandbox, ExecResult


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
        if not Path(os.path.realpath(host)).is_relative_to(self._real_root):  # a symlink out of the root is refused
            raise SandboxPathError(f"path {container_path!r} leaves the sandbox")
        return host

    @cached_property
    def _real_root(self) -> Path:
        """The root with its symlinks resolved, once (every file an agent writes resolves a path)."""
        return Path(os.path.realpath(self.root))


@dataclass(frozen=True)
class FolderFiles:
    """The sandbox's host folder; commands run there with ``bash`` (see :class:`HostShell`)."""

    sandbox: LocalSandbox

    async def exists(self, path: str) -> bool:
        return self.sandbox.resolve(path).exists()

    async def is_dir(self, path: str) -> bool:
        return self.sandbox.resolve(path).is_dir()

    async def read_text(self, path: str) -> str:
        return self.sandbox.resolve(path).read_text(errors="replace")

    async def run(self, command: str, cwd: str, timeout: float) -> ShellResult:
        return await HostShell(self.sandbox.resolve(cwd)).run(command, timeout)

    def close(self) -> None:
        pass


class ContainerFiles:
    """The sandbox's container, through execs: in-sandbox ``/app/x`` is ``<mount>/app/x`` (``..`` may not leave the
    mounted host folder), or without a ``mount`` the container's own path."""

    def __init__(self, container: ContainerSandbox, mount: str | None, timeout: float):
        self.container = container
        self.mount = mount
        self.timeout = timeout

    @classmethod
    def attach(cls, container_id: str, mount: str | None, timeout: float) -> "ContainerFiles":
        from .containers import ContainerSandbox  # the docker SDK only when a container is used

        return cls(ContainerSandbox.attach(container_id, mount or "/"), mount, timeout)

    def path(self, sandbox_path: str) -> str:
        parts = PurePosixPath("/", sandbox_path).parts[1:]
        if self.mount is None:
            return posixpath.normpath(posixpath.join("/", *parts))
        if ".." in parts:
            raise SandboxPathError(f"path {sandbox_path!r} leaves the sandbox")
        return posixpath.join(self.mount, *parts)

    async def _exec(self, command: str) -> ExecResult:
        result = await self.container.exec(command, self.timeout)
        if result.timed_out:
            raise TimeoutError(f"`{command}` in the container timed out after {self.timeout}s")
        return result

    async def exists(self, path: str) -> bool:
        return (await self._exec(f"test -e {shlex.quote(self.path(path))}")).exit_code == 0

    async def is_dir(self, path: str) -> bool:
        return (await self._exec(f"test -d {shlex.quote(self.path(path))}")).exit_code == 0

    async def read_text(self, path: str) -> str:
        result = await self._exec(f"cat -- {shlex.quote(self.path(path))}")
        if result.exit_code != 0:
            raise OSError(errno.ENOENT, result.stderr.strip() or f"exit {result.exit_code}")
        return result.stdout

    async def run(self, command: str, cwd: str, timeout: float) -> ShellResult:
        """``bash -c`` where the image has bash, else ``sh -c``, in ``cwd``."""
        quoted = shlex.quote(command)
        line = f"if command -v bash >/dev/null 2>&1; then exec bash -c {quoted}; fi; exec sh -c {quoted}"
        result = await self.container.exec(line, timeout, workdir=self.path(cwd))
        return ShellResult(None if result.timed_out else result.exit_code, result.stdout, result.stderr)

    def close(self) -> None:
        self.container.close()


SandboxFiles = FolderFiles | ContainerFiles  # a sandbox's files and shell by in-sandbox path (verify_sandbox)
