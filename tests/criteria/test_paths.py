"""Reading the agent's sandbox within bounds (docs/input-limits.md): a glob's ``**`` never
follows a symlink (so a symlink loop ends), a walk stops at ``MAX_GLOB_ENTRIES``, and a
criterion reads only regular files up to ``MAX_SANDBOX_FILE_BYTES``. The sandboxes are built
here, symlink loops and pipes included."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import pytest
from criteria_helpers import context, grade, write

from agentenv_dagster.criteria import paths
from agentenv_dagster.criteria.paths import MAX_SANDBOX_FILE_BYTES, glob_paths


@pytest.fixture
def looped(tmp_path) -> Path:
    """``ln -s . src/l1`` three times, as an agent did: a plain glob walks it for ever."""
    write(tmp_path, {"src/a.md": "# a", "src/sub/b.md": "# b", "src/c.py": ""})
    for name in ("l1", "l2", "l3"):
        os.symlink(".", tmp_path / "src" / name)
    return tmp_path


@pytest.mark.timeout(60)  # the unbounded walk never ends
def test_a_symlink_loop_does_not_trap_a_recursive_glob(looped):
    result = grade({"type": "file_exists", "path": "src/**/*.md"}, context(looped, []))
    assert (result.score, result.details) == (1.0, "File 'src/**/*.md' exists (src/a.md, src/sub/b.md)")
    assert glob_paths(looped, "src/**") == ["src", "src/a.md", "src/c.py", "src/l1", "src/l2", "src/l3",
                                            "src/sub", "src/sub/b.md"]


def test_a_symlink_is_still_followed_where_the_pattern_names_a_level(looped):
    assert glob_paths(looped, "src/l1/*.md") == ["src/l1/a.md"]
    assert glob_paths(looped, "src/*/b.md") == ["src/sub/b.md"]


@pytest.mark.parametrize("pattern", [
    "*", "**", "src/**", "**/*.md", "src/**/*.md", "src/*", "src/*/", "*/sub/*.md", "src/.*", "src/**/.hidden/*",
    "src/[ab].md", "src/?.md", "./src/a.md", "src//a.md", "nothing/**/x", "src/sub/b.md",
])
def test_without_symlinks_it_matches_what_glob_matches(tmp_path, pattern):
    write(tmp_path, {"src/a.md": "", "src/b.md": "", "src/.dot.md": "", "src/sub/b.md": "", "src/sub/.hidden/c.md": "",
                     ".top": "", "z.txt": ""})
    expected = sorted({os.path.normpath(p) for p in glob.glob(pattern, root_dir=tmp_path, recursive=True)} - {"."})
    assert [os.path.normpath(p) for p in glob_paths(tmp_path, pattern)] == expected


def test_a_walk_stops_at_the_entry_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(paths, "MAX_GLOB_ENTRIES", 50)
    write(tmp_path, {f"f{i}.txt": "" for i in range(60)})
    result = grade({"type": "file_exists", "path": "*.txt"}, context(tmp_path, []))
    assert (result.score, result.error) == (
        0.0, "GlobLimitError: '*.txt' met more than 50 directory entries; a glob walk stops there")


@pytest.mark.timeout(60)  # opening a pipe with no writer blocks for ever
def test_a_pipe_in_place_of_a_file_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "answer.txt")
    result = grade({"type": "file_contains", "path": "answer.txt", "includes": ["42"]}, context(tmp_path, []))
    assert (result.score, result.error) == (0.0, "UnreadableFileError: 'answer.txt' is not a regular file (a pipe, device or socket)")


def test_a_file_past_the_read_limit_fails_the_criterion(tmp_path):
    with open(tmp_path / "out.log", "wb") as handle:
        handle.truncate(MAX_SANDBOX_FILE_BYTES + 1)  # sparse: nothing is written
    result = grade({"type": "file_contains", "path": "out.log", "includes": ["done"]}, context(tmp_path, []))
    assert (result.score, result.error) == (
        0.0, "UnreadableFileError: 'out.log' is larger than 64 MiB, the most a criterion reads")
