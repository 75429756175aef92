"""Agent hosts forked from one import: each a whole host of its own, adopted by its run."""

from __future__ import annotations

import asyncio
import os
import select
import threading
from pathlib import Path

import httpx
import pytest

from agentenv_dagster.builtin import serving
from agentenv_dagster.runtime import local
from agentenv_dagster.runtime.a2a_client import A2AClient
from agentenv_dagster.runtime.local import end_forked_hosts, fork_agent_hosts
from agentenv_dagster.runtime.processes import (
    FORKED_FILE, PROMPTED_FILE, READY_FILE, ServerStartError, adopt_server, forked_pid, is_running,
)
from fakes.messages_api import text_reply

pytestmark = pytest.mark.anyio


async def test_hosts_forked_from_one_import_serve_their_own_agents_in_their_own_sessions(tmp_path, fake_messages_api):
    keys = {"agent-host-a": "key-a", "agent-host-b": "key-b"}  # a key is per process: a host per key
    forked = fork_agent_hosts({host_id: ({"ANTHROPIC_API_KEY": key}, 120) for host_id, key in keys.items()},
                              2, tmp_path / "forked")
    try:
        assert [sorted(run["hosts"]) for run in forked] == [sorted(keys)] * 2  # each run its own of each
        servers = {(run, host_id): adopt_server(Path(folder), forked[run]["starter"])
                   for run in range(2) for host_id, folder in forked[run]["hosts"].items()}
        assert len({s.pid for s in servers.values()}) == len({s.url for s in servers.values()}) == 4
        assert all(os.getsid(s.pid) == s.pid for s in servers.values())  # each its own session: ended as a group
        fake_messages_api.enqueue(*[text_reply(f"answer {i}") for i in range(4)])
        async with httpx.AsyncClient(timeout=30) as http:
            replies = []
            for (run, host_id), server in servers.items():
                created = await http.post(f"{server.url}/agents", json={
                    "id": "agent", "sandbox": str(tmp_path / f"sandbox-{run}-{host_id}"),
                    "config": {"kind": "anthropic", "model": "claude-test", "base_url": fake_messages_api.base_url}})
                assert created.status_code == 201
                replies.append((await A2AClient(http).send_and_wait(created.json()["url"], "hi", timeout_seconds=20)).text)
    finally:
        end_forked_hosts(forked)
    assert replies == [f"answer {i}" for i in range(4)]
    for path in (tmp_path / "forked").rglob("*"):  # the keys went through a pipe, not to disk
        assert not path.is_file() or b"key-" not in path.read_bytes(), path
    # each host's agent called the model with its own host's key: each has its own environment
    assert [r.headers["authorization"] for r in fake_messages_api.requests] == [f"Bearer {keys[h]}" for _, h in servers]
    assert not any(is_running(s.pid) for s in servers.values())


def test_a_starter_that_cannot_fork_fails_its_hosts_adoption_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(local, "AGENT_SERVER_MODULE", "agentenv_dagster.builtin.no_such_module")
    (forked,) = fork_agent_hosts({"agent-host-a": ({}, 60)}, 1, tmp_path / "forked")
    folder = Path(forked["hosts"]["agent-host-a"])
    with pytest.raises(ServerStartError, match="(?s)was never forked: .*No module named agentenv_dagster.builtin.no_such_module"):
        adopt_server(folder, forked["starter"], ready_timeout=60)
    assert forked_pid(folder) is None
    end_forked_hosts([forked])  # nothing to end: no error


def test_the_hosts_no_run_adopted_end_with_the_runs(tmp_path):
    forked = fork_agent_hosts({"agent-host-a": ({}, 120)}, 2, tmp_path / "forked")
    adopted = adopt_server(Path(forked[0]["hosts"]["agent-host-a"]), forked[0]["starter"])
    end_forked_hosts(forked)  # also before the second is up: it waits for the starter to be done forking
    pids = [forked_pid(Path(run["hosts"]["agent-host-a"])) for run in forked]
    assert adopted.pid == pids[0]
    assert not any(is_running(pid) for pid in pids)


def test_the_first_runs_hosts_are_forked_first_and_the_others_a_while_after_those_listen(tmp_path, monkeypatch):
    """Each core's first run prompts first: its host starts without the later runs' hosts
    starting beside it (their start would slow its own); those follow once it has been
    prompted or, as here where none is, ``LATER_WAIT_SECONDS`` after it listens."""
    monkeypatch.setattr(serving, "LATER_WAIT_SECONDS", 0.5)  # (the starter is forked from this process)
    forked = fork_agent_hosts({"agent-host-a": ({}, 120)}, 4, tmp_path / "forked", first=2)
    try:
        servers = [adopt_server(Path(run["hosts"]["agent-host-a"]), run["starter"]) for run in forked]
        folders = [Path(run["hosts"]["agent-host-a"]) for run in forked]
        listening = [(f / READY_FILE).stat().st_mtime_ns for f in folders]
        forked_at = [(f / FORKED_FILE).stat().st_mtime_ns for f in folders]
        assert len({s.pid for s in servers}) == 4
        assert max(listening[:2]) + 0.5e9 <= min(forked_at[2:])  # the later two forked a while after
    finally:
        end_forked_hosts(forked)
    assert not any(is_running(s.pid) for s in servers)


async def test_the_later_runs_hosts_are_forked_once_the_first_ones_are_prompted(tmp_path, monkeypatch):
    """The later runs' hosts start once the first runs are past their set-up: as the first
    host's first agent task starts (it marks its folder), not while its run deploys."""
    monkeypatch.setattr(serving, "LATER_WAIT_SECONDS", 60.0)  # only the prompt lets them go
    forked = fork_agent_hosts({"agent-host-a": ({}, 120)}, 2, tmp_path / "forked", first=1)
    try:
        first, later = (Path(run["hosts"]["agent-host-a"]) for run in forked)
        server = adopt_server(first, forked[0]["starter"])
        async with httpx.AsyncClient(timeout=30) as http:
            created = await http.post(f"{server.url}/agents", json={
                "id": "agent", "sandbox": str(tmp_path / "sandbox"),
                "config": {"kind": "replay", "episodes": [{"match": ".", "reply": "hi"}]}})
            assert created.status_code == 201
            await asyncio.sleep(0.3)
            assert forked_pid(later) is None  # deployed into, not prompted: the later host waits
            reply = await A2AClient(http).send_and_wait(created.json()["url"], "hello", timeout_seconds=20)
        assert reply.text == "hi"
        adopt_server(later, forked[1]["starter"])
        assert (first / PROMPTED_FILE).stat().st_mtime_ns <= (later / FORKED_FILE).stat().st_mtime_ns
    finally:
        end_forked_hosts(forked)


@pytest.mark.parametrize("other_thread", [False, True])
def test_the_starter_is_forked_from_this_process_and_keeps_none_of_its_files(tmp_path, other_thread):
    """Where this process runs no other thread, the hosts' starter is forked from it (what it
    has imported comes along) and keeps none of the files it has open: a pipe a run waits on
    ends once this process closes its end. With another thread running, the starter is a
    process of its own (``python -m``)."""
    read, write = os.pipe()
    release = threading.Event()
    waiting = threading.Thread(target=release.wait)
    if other_thread:
        waiting.start()
    try:
        (forked,) = fork_agent_hosts({"agent-host-a": ({}, 60)}, 1, tmp_path / "forked")
    finally:
        release.set()
        if other_thread:
            waiting.join()
    try:
        server = adopt_server(Path(forked["hosts"]["agent-host-a"]), forked["starter"])
        os.close(write)
        assert select.select([read], [], [], 10)[0] and os.read(read, 1) == b""  # no other process holds it
        command = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert (command == Path("/proc/self/cmdline").read_bytes()) is not other_thread
        assert (b"agentenv_dagster.builtin.agents" in command) is other_thread
    finally:
        end_forked_hosts([forked])
        os.close(read)
