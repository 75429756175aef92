"""Sandbox-relative paths: validated at load, resolved (globs included) at check time.

An absolute or ``..``-escaping path in a task file is a configuration error. A path that only
escapes through a symlink at check time is the sandbox's content (possibly the agent's doing),
so it fails the criterion instead.
"""

from __future__ import annotations

import glob
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated

from pydantic import AfterValidator


class SandboxEscapeError(ValueError):
    """A path that resolves outside the sandbox."""


class AmbiguousPathError(ValueError):
    """A glob that had to name exactly one file but matched several."""


def check_relative(path: str) -> str:
    if not path.strip():
        raise ValueError("path must not be empty")
    if PurePosixPath(path).is_absolute() or PureWindowsPath(path).is_absolute():
        raise ValueError(f"path '{path}' is absolute; criterion paths are relative to the sandbox")
    depth = 0
    for part in PurePosixPath(path.replace("\\", "/")).parts:
        depth += -1 if part == ".." else (part != ".")
        if depth < 0:
            raise ValueError(f"path '{path}' escapes the sandbox")
    return path


SandboxPath = Annotated[str, AfterValidator(check_relative)]


def _contained(root: Path, candidate: Path) -> Path:
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise SandboxEscapeError(f"'{candidate.relative_to(root)}' resolves outside the sandbox")
    return candidate


def matches(root: Path, pattern: str) -> list[Path]:
    """Existing paths under ``root`` that ``pattern`` (a plain path or a glob) names, sorted."""
    if glob.has_magic(pattern):
        found = [root / hit for hit in sorted(glob.glob(pattern, root_dir=root, recursive=True))]
    else:
        found = [root / pattern] if (root / pattern).exists() else []
    return [_contained(root, path) for path in found]


def resolve_one(root: Path, pattern: str) -> Path | None:
    """The one path ``pattern`` names, None when it names none; several are an error."""
    found = matches(root, pattern)
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(root)) for p in found[:5])
        raise AmbiguousPathError(f"'{pattern}' matches {len(found)} paths, expected exactly one: {names}")
    return found[0] if found else None


def label(root: Path, pattern: str, path: Path) -> str:
    """How details name a resolved path: quoted, plus what a glob resolved to."""
    relative = path.relative_to(root).as_posix()
    return f"'{pattern}'" if relative == pattern else f"'{pattern}' (resolved: {relative})"
