"""Ignore patterns for copying a workspace (template sources, an agent judge's copy).

A task lists overrides, not the whole list: a plain entry adds a pattern to the defaults, a
``!name`` entry removes a default (gitignore-style negation), so a task that vendors
``dist/`` can keep it without restating every other default.
"""

from __future__ import annotations

from collections.abc import Iterable

# Grouped as upstream's default_ignore_patterns.yaml: virtualenvs, VCS, Python build/cache,
# editors and OS files, JS, coverage, native libraries, and the harness's own CLI mocks.
DEFAULT_IGNORE_PATTERNS: tuple[str, ...] = (
    ".venv", "venv", "ENV", "env", "virtualenv",
    ".git", ".svn", ".hg",
    "__pycache__", "*.pyc", "*.pyo", "*.pyd", ".pytest_cache", ".ruff_cache", "*.egg-info",
    ".eggs", "dist", "build",
    ".vscode", ".idea", "*.swp", "*.swo", "*~", ".DS_Store", "Thumbs.db",
    "node_modules", ".npm", "bower_components",
    ".coverage", "htmlcov", ".tox", ".nox",
    "*.so", "*.dylib", "*.dll",
    "cli_mocks",
)


def normalize_ignore_pattern(raw: str) -> str:
    """One entry, stripped; an empty entry or a bare ``!`` is refused at load, not mid-run."""
    entry = raw.strip()
    if not entry:
        raise ValueError(f"ignore pattern entry is empty or whitespace-only: {raw!r}")
    if entry == "!":
        raise ValueError("ignore pattern entry '!' is bare negation with no target")
    return entry


def effective_ignore_patterns(overrides: Iterable[str]) -> frozenset[str]:
    """The defaults with a task's overrides applied: plain entries added, ``!x`` removing x."""
    patterns = set(DEFAULT_IGNORE_PATTERNS)
    for raw in overrides:
        entry = normalize_ignore_pattern(raw)
        if entry.startswith("!"):
            patterns.discard(entry[1:])
        else:
            patterns.add(entry)
    return frozenset(patterns)
