"""Ids that become paths, and the paths made from them.

Artifact, universe, task, step and variant ids name folders and files of the stores, so an id
read from a task document, a ``-D`` value or a stored context is checked against one safe
pattern (no separator, no leading dot: never ``..``), and every path built from one is checked
to stay under its store's root, symlinks followed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

SAFE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")
SEED_TOKEN = re.compile(r"<[A-Za-z0-9_.-]+>")  # a ``<key>`` the run's seed fills in (then checked again)
SAFE_ID_RULE = "letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 200 characters"


class UnsafeIdError(ValueError):
    """An id that cannot name a file or folder of a store."""


def check_id(value: object, what: str = "id") -> str:
    """``value`` when it is a safe id; else :class:`UnsafeIdError` naming ``what`` it is."""
    if isinstance(value, str) and SAFE_ID.fullmatch(value):
        return value
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
    raise UnsafeIdError(f"{what} {shown} is not a safe id ({SAFE_ID_RULE})")


def safe_id(what: str, *, templated: bool = False):
    """A pydantic type of str checked by :func:`check_id` (``what`` names it in the error);
    ``templated``: it may hold seed tokens ``<key>``, the step being validated again once the
    seed has filled them in."""
    def check(value: str) -> str:
        if not SAFE_ID.fullmatch(SEED_TOKEN.sub("x", value) if templated else value):
            check_id(value, what)  # raises, quoting the value as written
        return value

    return Annotated[str, AfterValidator(check)]


ArtifactId = safe_id("artifact id", templated=True)


def path_under(root: Path, *parts: str) -> Path:
    """``root/parts...``, refused (:class:`UnsafeIdError`) unless it lies under ``root`` once
    symlinks are resolved: the guard every store applies to what an id names."""
    path = root.joinpath(*parts)
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise UnsafeIdError(f"{'/'.join(parts)!r} leaves the store at {root}")
    return path
