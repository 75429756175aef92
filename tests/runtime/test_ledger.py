"""A run's ledger: what it deployed, written down so that any process of the run can end it.
The agents of one batch into the run's agent host are written down in one file; a server is
written down before it is started, so a run that dies while it starts one still ends it."""

from __future__ import annotations

import asyncio
import os

import httpx

from agentenv_dagster.config import load_config
from agentenv_dagster.runtime.local import SEVERAL, Ledger, LocalProvider
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate
from projects import REPO, make_project


def test_agents_deployed_in_one_batch_are_one_ledger_file_and_each_can_be_ended(tmp_path):
    config = load_config(make_project(tmp_path / "p", tasks={}))
    provider = LocalProvider(config, config.state_dir / "runs" / "r1")
    names = [f"row{i}" for i in range(5)]

    async def deploy():
        try:
            first = await provider.deploy_agent_async("claude-code", agent_name="first", ttl_seconds=60)
            together = await asyncio.gather(*(  # one turn of the loop: one batch
                provider.deploy_agent_async("claude-code", agent_name=name, ttl_seconds=60) for name in names))
            return first, together
        finally:
            await provider.aclose()

    try:
        first, together = asyncio.run(deploy())
        ledger = provider.ledger
        files = sorted(p.name for p in ledger.folder.glob("*.json"))
        entries = ledger.entries()
        (host,) = [iid for iid, e in entries.items() if e["pid"]]
        # the host, the agent that started it (on its own), and the batch of five in one file
        assert len(files) == 3 and sum(name.endswith(f"{SEVERAL}.json") for name in files) == 1
        assert {f"{host}.json", f"{first.instance_id}.json"} < set(files)
        assert sorted(entries) == sorted([host, first.instance_id, *(a.instance_id for a in together)])
        batched = together[2]
        assert entries[batched.instance_id] == {"kind": "agent", "pid": None, "container_id": None,
                                                "url": batched.a2a_url, "host": host}
        assert ledger.entry(batched.instance_id) == entries[batched.instance_id]
        token = {"Authorization": f"Bearer {ledger.token()}"}  # the run's servers answer only the run
        assert httpx.get(f"{batched.a2a_url}/.well-known/agent-card.json").status_code == 401
        assert httpx.get(f"{batched.a2a_url}/.well-known/agent-card.json", headers=token).status_code == 200
        # one agent of the batch ends on its own (as a deploy_agent step does when its set-up fails)
        assert provider.terminate(batched.instance_id) is True
        assert httpx.get(f"{batched.a2a_url}/.well-known/agent-card.json", headers=token).status_code == 404
        host_pid = entries[host]["pid"]
        assert is_running(host_pid)
    finally:
        ended = Ledger.of_run(config.state_dir / "runs" / "r1").close()
    # the teardown names every deployment (the agents of the batch too) and ends the host
    assert sorted(ended) == sorted(entries)
    assert not is_running(host_pid)


def test_a_single_deployment_keeps_a_file_of_its_own(tmp_path):
    ledger = Ledger(tmp_path / "deployments")
    ledger.record_hosted("agent-host-1", {"a1": "http://127.0.0.1:1/agents/a1"})
    ledger.record_hosted("agent-host-1", {})
    assert [p.name for p in ledger.folder.glob("*.json")] == ["a1.json"]
    assert ledger.entry("a1") == {"kind": "agent", "pid": None, "container_id": None,
                                  "url": "http://127.0.0.1:1/agents/a1", "host": "agent-host-1"}
    assert ledger.entry("a2") is None


def test_a_server_written_down_only_before_it_started_is_ended_by_the_run_s_teardown(tmp_path):
    """What a step writes before it starts a server (where the server will announce itself) is
    enough to end it: the process that started it may have died before writing its pid."""
    ledger = Ledger(tmp_path / "deployments")
    workdir = tmp_path / "envs" / "email-1"
    ledger.record("email-1", "env", workdir=str(workdir))
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    server = spawn_server("agentenv_dagster.builtin.envs", ["email"], workdir=workdir, ttl_seconds=120,
                          env={"PYTHONPATH": pythonpath}, token=ledger.token())
    try:
        assert ledger.entry("email-1")["pid"] is None  # nothing but where it announces itself
        assert ledger.close() == ["email-1"]
        assert not is_running(server.pid)
    finally:
        terminate(server.pid, started=server.started)
