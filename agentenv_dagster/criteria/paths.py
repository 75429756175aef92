"""Sandbox-relative paths: validated at load, resolved (globs included) at check time.

An absolute or ``..``-escaping path in a task file is a configuration error. A path that only
escapes through a symlink at check time is the sandbox's content (possibly the agent's doing),
so it fails the criterion instead.

The sandbox is the agent's, so reading it is bounded: a glob's ``**`` descends real
directories only (never a symlink, so ``ln -s . loop`` cannot make a walk endless) and a walk
stops after ``MAX_GLOB_ENTRIES`` directory entries; a file is read up to
``MAX_SANDBOX_FILE_BYTES``.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Annotated

from pydantic import AfterValidator

MAX_GLOB_ENTRIES = 100_000
MAX_SANDBOX_FILE_BYTES = 64 * 1024 * 1024


class SandboxEscapeError(ValueError):
    """A path that resolves outside the sandbox."""


class AmbiguousPathError(ValueError):
    """A glob that had to name exactly one file but matched several."""


class GlobLimitError(ValueError):
    """A glob whose walk met more than ``MAX_GLOB_ENTRIES`` directory entries."""


class UnreadableFileError(ValueError):
    """A sandbox path a criterion will not read: not a regular file (a pipe would block the
    reader forever), or larger than ``MAX_SANDBOX_FILE_BYTES``."""


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
        found = [root / hit for hit in glob_paths(root, pattern)]
    else:
        found = [root / pattern] if (root / pattern).exists() else []
    return [_contained(root, path) for path in found]


def glob_paths(root: Path, pattern: str) -> list[str]:
    """``glob.glob(pattern, root_dir=root, recursive=True)``, sorted and bounded: ``**``
    matches real directories only (a symlink is matched as an entry, never descended into),
    and :class:`GlobLimitError` ends a walk past ``MAX_GLOB_ENTRIES`` entries. Hidden names
    match only a segment that starts with a dot, as in :mod:`glob`."""
    segments = pattern.split("/")
    listing = _Listing(root, pattern)
    found: set[str] = set()
    visited: set[tuple[str, int]] = set()
    pending = [("", 0)]
    while pending:
        state = pending.pop()
        if state in visited:
            continue
        visited.add(state)
        listing.spend(1)
        relative, index = state
        if index == len(segments):
            if relative:
                found.add(relative)
            continue
        segment, last = segments[index], index == len(segments) - 1
        if segment == "**":
            pending.append((relative, index + 1))  # no directory at all
            for name, real_dir, _ in listing.entries(relative):
                if not name.startswith("."):
                    if real_dir:
                        pending.append((_join(relative, name), index))  # one more directory
                    elif last:
                        found.add(_join(relative, name))
        elif glob.has_magic(segment):
            for name, _, is_dir in listing.entries(relative):
                if (segment.startswith(".") or not name.startswith(".")) and fnmatch.fnmatchcase(name, segment) \
                        and (last or is_dir):
                    pending.append((_join(relative, name), index + 1))
        else:
            target = root / _join(relative, segment)
            if os.path.lexists(target) if last else target.is_dir():
                pending.append((_join(relative, segment), index + 1))
    return sorted(found)


class _Listing:
    """Directory listings of one walk, each read once, against one budget of entries."""

    def __init__(self, root: Path, pattern: str):
        self.root, self.pattern, self.budget = root, pattern, MAX_GLOB_ENTRIES
        self.cache: dict[str, list[tuple[str, bool, bool]]] = {}

    def spend(self, count: int) -> None:
        self.budget -= count
        if self.budget < 0:
            raise GlobLimitError(f"'{self.pattern}' met more than {MAX_GLOB_ENTRIES:,} directory entries; "
                                 "a glob walk stops there")

    def entries(self, relative: str) -> list[tuple[str, bool, bool]]:
        """(name, a directory that is not a symlink, a directory or a link to one)."""
        if relative not in self.cache:
            try:
                with os.scandir(self.root / relative) as scan:
                    listed = []
                    for entry in scan:
                        self.spend(1)
                        listed.append((entry.name, entry.is_dir(follow_symlinks=False), _is_dir(entry)))
            except OSError:
                listed = []
            self.cache[relative] = listed
        return self.cache[relative]


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _join(relative: str, name: str) -> str:
    return f"{relative}/{name}" if relative else name


def read_text(path: Path) -> str:
    """A sandbox file's text (undecodable bytes replaced), read up to
    ``MAX_SANDBOX_FILE_BYTES``; another kind of file or a larger one is an
    :class:`UnreadableFileError`."""
    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):  # a folder fails on open, with the system's reason
        raise UnreadableFileError(f"'{path.name}' is not a regular file (a pipe, device or socket)")
    with open(path, "rb") as handle:
        data = handle.read(MAX_SANDBOX_FILE_BYTES + 1)
    if len(data) > MAX_SANDBOX_FILE_BYTES:
        raise UnreadableFileError(f"'{path.name}' is larger than {MAX_SANDBOX_FILE_BYTES // (1024 * 1024)} MiB, "
                                  "the most a criterion reads")
    return data.decode(errors="replace")


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
