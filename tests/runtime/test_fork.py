"""A process forked from one that has talked to agent hosts or S3 (shard runs fork from the CLI)
opens its own connections: the cached clients are not shared with the parent."""

from __future__ import annotations

import os

from agentenv_dagster.runtime import local, s3

NOWHERE = "http://127.0.0.1:9"  # a client of its own: the other tests' cached clients stay as they are


def test_a_forked_child_builds_its_own_clients():
    parent = (local._http(), s3._client(NOWHERE, "us-east-1"))
    assert (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # cached in this process
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child reports through the pipe)
        mine = (local._http(), s3._client(NOWHERE, "us-east-1"))
        os.write(write, " ".join(str(a is b) for a, b in zip(mine, parent)).encode())
        os._exit(0)
    os.close(write)
    answer = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(child, 0)
    assert answer == "False False"
    assert (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # the parent keeps its own
