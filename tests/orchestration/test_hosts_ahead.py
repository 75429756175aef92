"""A run's agent host starts beside its first op: the deploy_agent op finds it ready instead of
starting it after the ops before it (``orchestration/hosts_ahead.py``)."""

from __future__ import annotations

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.config import load_config
from agentenv_dagster.runtime.local import Ledger, LocalProvider
from agentenv_dagster.steps.deploy import DeployAgentStep
from projects import leaked_servers, make_project

ENV_THEN_AGENT = [
    {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "a2a_agent_id": "replay",
     "agent_name": "a", "depends_on": ["email"]},
]


def _run(tmp_path, steps):
    root = make_project(tmp_path / "p", tasks={"t.json": steps})
    with dg.instance_for_test() as instance:
        result = build_definitions(root / "tasks").get_job_def("t").execute_in_process(
            instance=instance, raise_on_error=False)
        started = {e.step_key: e.timestamp for e in instance.all_logs(result.run_id)
                   if e.dagster_event and e.dagster_event.event_type_value == "STEP_START"}
    return root, result, started


def test_the_agent_host_is_up_before_the_deploy_agent_op_starts(tmp_path):
    root, result, started = _run(tmp_path, ENV_THEN_AGENT)
    assert result.success
    state = root / ".agentenv" / "state"
    ledger = Ledger.of_run(state / "runs" / result.run_id)
    entries = ledger.entries()
    (host,) = [iid for iid, e in entries.items() if e["kind"] == "agent" and e["pid"]]
    recorded = (ledger.folder / f"{host}.json").stat().st_mtime
    assert recorded < started["agent"]  # started (and recorded once ready) during the env's op
    assert [e["host"] for e in entries.values() if e["kind"] == "agent" and not e["pid"]] == [host]
    assert leaked_servers(state) == []


def test_a_run_that_fails_in_its_first_op_leaves_no_host_running(tmp_path):
    steps = [dict(s) for s in ENV_THEN_AGENT]
    steps[0] = {**steps[0], "env_id": "no-such-env"}
    steps[1] = {**steps[1], "env_ids": ["no-such-env"]}
    root, result, _ = _run(tmp_path, steps)
    assert not result.success
    state = root / ".agentenv" / "state"
    entries = Ledger.of_run(state / "runs" / result.run_id).entries()
    assert [e["kind"] for e in entries.values()] == ["agent"]  # the host had started, and ended with the run
    assert leaked_servers(state) == []


def test_a_host_a_row_could_change_is_not_started_ahead(tmp_path):
    config = load_config(make_project(tmp_path / "p", tasks={}))
    fixed = DeployAgentStep(id="agent", type="deploy_agent", env_vars={"MODE": "fast"})
    assert fixed.host_ahead(config) == {"agent_id": config.agents.default_a2a_agent_id, "ttl_seconds": 7200,
                                        "env_vars": {"MODE": "fast"}, "overrides": {}}
    for per_row in ({"env_vars": {"MODE": "${row.mode}"}}, {"a2a_agent_id": "${row.agent}"},
                    {"agent_config": {"delay_seconds": "${row.delay}"}}):
        assert DeployAgentStep(id="agent", type="deploy_agent", **per_row).host_ahead(config) is None


@pytest.mark.parametrize("agent_id", ["no-such-agent", "a2a-default"], ids=["not registered", "needs an API key"])
def test_an_agent_its_step_would_refuse_starts_no_host_ahead(tmp_path, monkeypatch, agent_id):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    root = make_project(tmp_path / "p", tasks={})
    config = load_config(root)
    provider = LocalProvider(config, config.state_dir / "runs" / "r1")
    assert provider.start_agent_host(agent_id, ttl_seconds=60) is False
    assert provider.ledger.entries() == {}
