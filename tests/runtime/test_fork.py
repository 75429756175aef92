"""A process forked from one that has talked to agent hosts or S3 (shard runs fork from the CLI)
opens its own connections: the cached clients are not shared with the parent.

The fork happens in a fresh interpreter, never in the test process: an xdist worker runs
threads of its own (its channel to the controller), and a child forked from it would share
that channel's descriptors and locks."""

from __future__ import annotations

import subprocess
import sys

FORKS = """
import os
from agentenv_dagster.runtime import local, s3

NOWHERE = "http://127.0.0.1:9"
parent = (local._http(), s3._client(NOWHERE, "us-east-1"))
assert (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # cached in this process
read, write = os.pipe()
child = os.fork()
if child == 0:
    try:
        mine = (local._http(), s3._client(NOWHERE, "us-east-1"))
        os.write(write, " ".join(str(a is b) for a, b in zip(mine, parent)).encode())
    finally:
        os._exit(0)
os.close(write)
shared = os.read(read, 1024).decode()
os.waitpid(child, 0)
kept = (local._http(), s3._client(NOWHERE, "us-east-1")) == parent  # the parent keeps its own
print(shared, kept)
"""


def test_a_forked_child_builds_its_own_clients():
    done = subprocess.run([sys.executable, "-c", FORKS], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]
