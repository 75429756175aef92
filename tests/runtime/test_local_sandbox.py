"""A local sandbox maps in-container paths under its root and refuses every way out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentenv_dagster.runtime.sandbox import LocalSandbox, SandboxPathError


@pytest.fixture
def sandbox(tmp_path) -> LocalSandbox:
    root = tmp_path / "sandbox"
    (root / "app").mkdir(parents=True)
    return LocalSandbox(root)


def test_container_paths_map_under_the_root(sandbox):
    assert sandbox.resolve("/app/label.txt") == sandbox.root / "app" / "label.txt"
    assert sandbox.resolve("app/new/deeper.txt") == sandbox.root / "app" / "new" / "deeper.txt"
    assert sandbox.resolve("/") == sandbox.root


def test_dot_dot_is_refused(sandbox):
    with pytest.raises(SandboxPathError, match=r"path '/app/\.\./\.\./x' leaves the sandbox"):
        sandbox.resolve("/app/../../x")


def test_a_symlink_out_of_the_root_is_refused_and_one_inside_it_is_followed(sandbox, tmp_path):
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", sandbox.root / "app" / "out")
    os.symlink(sandbox.root / "app", sandbox.root / "inside")
    with pytest.raises(SandboxPathError, match="leaves the sandbox"):
        sandbox.resolve("/app/out/secret.txt")
    assert sandbox.resolve("/inside/label.txt") == sandbox.root / "inside" / "label.txt"


def test_a_sibling_folder_whose_name_starts_with_the_roots_is_outside(sandbox, tmp_path):
    (tmp_path / "sandbox2").mkdir()
    os.symlink(tmp_path / "sandbox2", sandbox.root / "app" / "twin")
    with pytest.raises(SandboxPathError, match="leaves the sandbox"):
        sandbox.resolve("/app/twin/x.txt")


def test_a_root_reached_through_a_symlink_keeps_its_paths(sandbox, tmp_path):
    os.symlink(sandbox.root, tmp_path / "link")
    linked = LocalSandbox(tmp_path / "link")
    assert linked.resolve("/app/label.txt") == tmp_path / "link" / "app" / "label.txt"
    with pytest.raises(SandboxPathError):
        linked.resolve("/../sandbox2")


def test_the_filesystem_root_as_a_sandbox_holds_every_path():
    assert LocalSandbox(Path("/")).resolve("/etc/hostname") == Path("/etc/hostname")
