"""A process forked from one that has talked to agent hosts or S3 (shard runs fork from the CLI)
opens its own connections: the cached clients are not shared with the parent."""

from __future__ import annotations

from agentenv_dagster.runtime import local, s3
from projects import in_forked_child

NOWHERE = "http://127.0.0.1:9"  # a client of its own: the other tests' cached clients stay as they are


def test_a_forked_child_builds_its_own_clients():
    parent = (local._http(), s3._client(NOWHERE, "us-east-1"))
    assert (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # cached in this process

    def shared() -> str:
        mine = (local._http(), s3._client(NOWHERE, "us-east-1"))
        return " ".join(str(a is b) for a, b in zip(mine, parent))

    assert in_forked_child(shared) == "False False"
    assert (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # the parent keeps its own
