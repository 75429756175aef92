"""The shipped conformance tasks (tasks/env_conformance.json, tasks/agent_conformance.json), run
as they are through the CLI and aimed at other envs and agents: their ``<env_id>`` /
``<agent_id>`` tokens default to the task's ``seed`` and ``-D metadata.seed.<key>=...`` (or the
run's ``agentenv/seed`` tag, in the launchpad) overrides them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from fakes.messages_api import ThreadedServer

from agentenv_dagster import build_definitions
from agentenv_dagster.builtin.envs.base import EnvApp
from agentenv_dagster.builtin.envs.item_store import ItemStoreState
from agentenv_dagster.compiler import load_plan, step_registry
from agentenv_dagster.config import load_config
from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.orchestration.io_manager import final_context
from agentenv_dagster.orchestration.translator import TAG_SEED
from agentenv_dagster.runner import run_plan
from agentenv_dagster.spec.loader import parse_task_document
from agentenv_dagster.spec.store import TaskStore
from projects import leaked_servers, make_project

ENV_CHECKS = ("env_card", "mcp_tool_schema", "env_core_protocol")


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project")  # the repo's tasks/, as shipped
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def run_cli(project: Path, task: str, *defines: str) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    """``agentenv-dagster run tasks/<task>`` in a subprocess; the result and its context.json."""
    out = project / "out" / task
    args = [arg for define in defines for arg in ("-D", define)]
    environment = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", f"tasks/{task}", "--output-dir", str(out), *args],
        cwd=project, env={**environment, "DAGSTER_HOME": str(project / ".dagster_home")},
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads((out / "context.json").read_text())


def scores(context: dict[str, Any]) -> dict[str, float | None]:
    return {k: v["score"] for k, v in context["metadata"]["verifications"].items()}


def failed_rows(context: dict[str, Any], verifier_id: str) -> dict[str, str]:
    rows = context["metadata"]["verifications"][verifier_id]["results"]
    return {r["id"]: r["justification"] for r in rows if not r.get("skipped") and r["result"] is not True}


@pytest.mark.slow
def test_both_shipped_tasks_pass_against_their_default_env_and_agent(project):
    done, env = run_cli(project, "env_conformance.json")
    assert [e["env_id"] for e in env["deployed_envs"]] == ["email"]
    assert scores(env) == dict.fromkeys(ENV_CHECKS, 1.0)
    assert "verification env_core_protocol: 1.000" in done.stdout

    done, agent = run_cli(project, "agent_conformance.json")
    assert agent["deployed_agents"][0]["a2a_agent_id"] == "claude-code"
    verifications = agent["metadata"]["verifications"]
    assert {k: verifications[k]["score"] for k in ("a2a_agent_card", "a2a_core_protocol", "a2a_agent_mcp")} == \
        dict.fromkeys(("a2a_agent_card", "a2a_core_protocol", "a2a_agent_mcp"), 1.0)
    # the replay agent has no model: obeying a system prompt is not graded, every graded check passed
    assert verifications["a2a_system_prompt"]["graded"] is False
    assert all(failed_rows(agent, v) == {} for v in verifications)


def half_built_env() -> EnvApp:
    """A conformant card and data plane (the item store's), but a tool with no description."""
    state = ItemStoreState()
    env = EnvApp("half-built", state)

    @env.tool
    def find(name: str) -> dict[str, Any]:
        return {"found": name in state.items}

    return env


@pytest.mark.slow
def test_env_conformance_aimed_at_another_env_and_at_a_broken_one(project):
    _, store = run_cli(project, "env_conformance.json", "metadata.seed.env_id=item-store")
    assert [e["env_id"] for e in store["deployed_envs"]] == ["item-store"]
    assert scores(store) == dict.fromkeys(ENV_CHECKS, 1.0)

    with ThreadedServer(half_built_env().starlette_app()) as server:
        config = project / ".agentenv" / "config.toml"
        config.write_text(config.read_text() + f'\n[envs.registry.half-built]\nmcp_url = "{server.url}/mcp"\n')
        _, broken = run_cli(project, "env_conformance.json", "metadata.seed.env_id=half-built")
    assert scores(broken) == {"env_card": 1.0, "mcp_tool_schema": 0.0, "env_core_protocol": 1.0}
    assert failed_rows(broken, "mcp_tool_schema") == {"tool:find": "no description"}


def test_the_launchpad_retargets_a_run_through_its_seed_tag(project):
    job = build_definitions(project / "tasks").resolve_job_def("env_conformance")
    assert json.loads(job.tags[TAG_SEED]) == {"env_id": "email"}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, tags={TAG_SEED: json.dumps({"env_id": "item-store"})})
        assert result.success
        context = final_context(load_config(project).state_dir / "runs", result.run_id)
        assert [e.env_id for e in context.deployed_envs] == ["item-store"]
        assert context.metadata["seed"] == {"env_id": "item-store"}

        bad = job.execute_in_process(instance=instance, tags={TAG_SEED: "item-store"}, raise_on_error=False)
    assert not bad.success
    [failure] = [e for e in bad.all_events if e.is_step_failure]
    assert failure.step_failure_data.error.message.startswith(
        "dagster._core.definitions.events.Failure: run tag 'agentenv/seed' must be a JSON object of token values, "
        "got 'item-store'")


def test_the_seed_defaults_survive_the_store_and_the_asyncio_runner(project):
    config = load_config(project)
    plan = load_plan(project / "tasks" / "env_conformance.json", config)
    assert plan.document.seed == {"env_id": "email"}
    store = TaskStore(project / ".agentenv" / "state" / "tasks")
    stored = store.get("env_conformance", store.put("env_conformance", plan.document), step_registry(config))
    assert (stored.seed, stored.content_hash) == (plan.document.seed, plan.document.content_hash)

    given = TaskStepContext(metadata={"seed": {"env_id": "item-store", "other": "kept"}})
    ctx = asyncio.run(run_plan(plan, config, context=given))
    assert ctx.metadata["seed"] == {"env_id": "item-store", "other": "kept"}  # the run's seed wins
    assert [e.env_id for e in ctx.deployed_envs] == ["item-store"]

    with pytest.raises(TaskLoadError, match=r"x.json: field 'seed': 'seed' must map token names to strings or numbers"):
        parse_task_document({"type": "task", "seed": {"env_id": ["email"]}, "steps": []}, source="x.json",
                            default_id="x", registry=step_registry(config))
