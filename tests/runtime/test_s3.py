"""The S3 stores behind the filesystem stores' methods, against moto's in-process S3."""

from __future__ import annotations

import json
import threading

import pytest

from agentenv_dagster.config import AgentEnvConfig, ConfigError
from agentenv_dagster.runtime.artifacts import ArtifactNotFound, ObjectStore
from agentenv_dagster.runtime.base import artifact_store, object_store
from agentenv_dagster.runtime.s3 import S3ArtifactStore, S3Location, S3ObjectStore

moto = pytest.importorskip("moto")
BUCKET = "agentenv-unit"


@pytest.fixture
def location(monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    with moto.mock_aws():
        here = S3Location(BUCKET, "team/a", region="us-east-1")
        here.client.create_bucket(Bucket=BUCKET)
        yield here


@pytest.fixture
def store(location, tmp_path):
    bundle = tmp_path / "bundles" / "inbox"
    bundle.mkdir(parents=True)
    (bundle / "artifact.json").write_text(json.dumps({"type": "environment", "environment_name": "email"}))
    (bundle / "inbox.json").write_text("[]")
    return S3ArtifactStore(location, tmp_path / "cache", [tmp_path / "bundles"])


def test_versions_are_added_never_overwritten_and_read_back_as_files(store, location):
    first = store.put("greeting", "file_artifact_universe", {"hello.txt": b"v1", "sub/x.txt": b"x"}, note="one")
    second = store.put("greeting", "file_artifact_universe", {"hello.txt": b"v2"})
    assert (first.version, second.version, store.versions("greeting")) == (1, 2, [1, 2])
    assert first.metadata == {"note": "one"}
    assert second.object_url("hello.txt") == f"s3://{BUCKET}/team/a/artifacts/greeting/2/files/hello.txt"
    assert location.get_bytes("team/a/artifacts/greeting/1/files/sub/x.txt") == b"x"

    # another machine (an empty cache) reads the same versions from the bucket
    elsewhere = S3ArtifactStore(location, store.root.parent / "other-cache")
    old = elsewhere.get("greeting", 1)
    assert {name: path.read_bytes() for name, path in old.files.items()} == {"hello.txt": b"v1", "sub/x.txt": b"x"}
    assert (elsewhere.get("greeting").version, elsewhere.get("greeting").type) == (2, "file_artifact_universe")


def test_missing_versions_and_bundles_behave_as_on_disk(store):
    inbox = store.get("inbox")  # a bundle folder is version 1 of an id the bucket has never seen
    assert (inbox.type, inbox.environment_name, list(inbox.files)) == ("environment", "email", ["inbox.json"])
    with pytest.raises(ArtifactNotFound, match=r"^Artifact 'nope' not found$"):
        store.get("nope")
    store.put("a", "file", {"f": b""})
    with pytest.raises(ArtifactNotFound, match=r"Artifact 'a' has no version 7 \(versions: \[1\]\)"):
        store.get("a", 7)


def test_concurrent_writers_get_distinct_versions(store, monkeypatch):
    # S3 makes a conditional create (If-None-Match: *) atomic; moto checks for the key, then
    # stores it, so two requests at once could both create it (version 1 twice, once, on a
    # loaded machine). Its requests one at a time give the test S3's guarantee.
    from moto.core.botocore_stubber import BotocoreStubber

    handle, lock = BotocoreStubber.__call__, threading.Lock()

    def one_at_a_time(self, *args, **kwargs):
        with lock:
            return handle(self, *args, **kwargs)

    monkeypatch.setattr(BotocoreStubber, "__call__", one_at_a_time)
    got: list[int] = []
    threads = [threading.Thread(target=lambda i=i: got.append(store.put("race", "file", {"n": str(i).encode()}).version))
               for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(got) == [1, 2, 3, 4, 5, 6] == store.versions("race")


def test_a_claimed_version_is_invisible_until_its_manifest_is_written(store, location):
    location.put_bytes("team/a/artifacts/half/_versions/1", b"")  # a writer that died mid-upload
    assert store.versions("half") == []
    assert store.put("half", "file", {"f": b"1"}).version == 2


def test_objects_by_s3_url_and_keys_stay_inside(location):
    objects = S3ObjectStore(location)
    url = objects.put("prompt_agent_trajectories/t.json", b"[]")
    assert url == f"s3://{BUCKET}/team/a/objects/prompt_agent_trajectories/t.json"
    assert ObjectStore.read(url) == objects.read(url) == b"[]"  # the static reader the steps use
    with pytest.raises(ValueError, match="leaves the object store"):
        objects.put("../escape", b"")


def test_the_config_selects_the_stores(tmp_path, location, monkeypatch):
    monkeypatch.setenv("AGENTENV_TEST_BUCKET", BUCKET)
    config = AgentEnvConfig.model_validate({"stores": {"backend": "s3", "bucket": "env:AGENTENV_TEST_BUCKET",
                                                       "prefix": "p", "region": "us-east-1"}, "root": tmp_path})
    store, objects = artifact_store(config), object_store(config)
    assert isinstance(store, S3ArtifactStore) and isinstance(objects, S3ObjectStore)
    assert (store.location.bucket, store.location.prefix, store.root) == (BUCKET, "p", tmp_path / ".agentenv/state/cache/s3")
    with pytest.raises(ValueError, match='backend = "s3" needs a bucket'):
        AgentEnvConfig.model_validate({"stores": {"backend": "s3"}})
    monkeypatch.delenv("AGENTENV_TEST_BUCKET")
    with pytest.raises(ConfigError, match="names no bucket"):
        artifact_store(config)
    default = AgentEnvConfig(root=tmp_path)
    assert isinstance(object_store(default), ObjectStore)
    assert artifact_store(default).root == tmp_path / ".agentenv/state/artifacts"
