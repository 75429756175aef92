"""The versioned filesystem artifact store and the object store."""

from __future__ import annotations

import json

import pytest

from agentenv_dagster.runtime.artifacts import ArtifactNotFound, FilesystemArtifactStore, ObjectStore


@pytest.fixture
def store(tmp_path):
    bundle = tmp_path / "bundles" / "greeting"
    bundle.mkdir(parents=True)
    (bundle / "hello.txt").write_text("hello")
    (bundle / "sub").mkdir()
    (bundle / "sub" / "x.txt").write_text("x")
    inbox = tmp_path / "bundles" / "inbox"
    inbox.mkdir()
    (inbox / "artifact.json").write_text(json.dumps({"type": "environment", "environment_name": "email"}))
    (inbox / "inbox.json").write_text("{}")
    return FilesystemArtifactStore(tmp_path / "store", [tmp_path / "bundles"])


def test_a_bundle_folder_is_version_1_of_a_file_universe(store):
    greeting = store.get("greeting")
    assert (greeting.version, greeting.type) == (1, "file_artifact_universe")
    assert sorted(greeting.files) == ["hello.txt", "sub/x.txt"]
    inbox = store.get("inbox")
    assert (inbox.type, inbox.environment_name, list(inbox.files)) == ("environment", "email", ["inbox.json"])


def test_put_adds_versions_and_never_overwrites(store):
    first = store.put("greeting", "file_artifact_universe", {"hello.txt": b"v1"})
    second = store.put("greeting", "file_artifact_universe", {"hello.txt": b"v2", "new.txt": b"n"})
    assert (first.version, second.version) == (1, 2)  # stored versions take over from the bundle
    assert store.get("greeting").version == 2
    assert store.get("greeting", 1).files["hello.txt"].read_bytes() == b"v1"
    assert sorted(store.get("greeting").files) == ["hello.txt", "new.txt"]
    assert second.object_url("new.txt").startswith("file://")


def test_missing_artifacts_and_versions_are_named(store):
    with pytest.raises(ArtifactNotFound, match=r"^Artifact 'nope' not found$"):
        store.get("nope")
    store.put("a", "file", {"f": b""})
    with pytest.raises(ArtifactNotFound, match=r"Artifact 'a' has no version 7 \(versions: \[1\]\)"):
        store.get("a", 7)


def test_objects_are_addressed_by_file_url_and_stay_inside_the_store(tmp_path):
    objects = ObjectStore(tmp_path / "objects")
    url = objects.put("trajectories/prompt_id=p/t.json", b"[]")
    assert ObjectStore.read(url) == b"[]"
    with pytest.raises(ValueError, match="leaves the object store"):
        objects.put("../escape", b"x")
