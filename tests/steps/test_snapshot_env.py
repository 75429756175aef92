"""snapshot_env, run for real by the asyncio walker: the upstream quickstart task (item-store env
+ the replay agent standing in for ``a2a-default``), a snapshot loaded back into a fresh env, and
a failing export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.runner import run_dir, run_plan
from agentenv_dagster.runtime.base import artifact_store
from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.runtime.processes import is_running
from projects import FIXTURES

QUICKSTART = FIXTURES / "agentenv" / "item_store_snapshot.json"
CONFIG = """
[stores]
state_dir = "state"
artifact_dirs = []

[model]
api_key = ""  # no judge offline, whatever the environment holds

[envs.registry.copy]
kind = "item-store"

[agents.registry.a2a-default]
kind = "replay"

[[agents.registry.a2a-default.episodes]]
match = "add one item named 'readme'"
reply = "The item store holds: readme"
actions = [{ tool = "add_item", arguments = { name = "readme" } }, { tool = "list_items" }]
"""


def run(plan, config, run_id: str, context: TaskStepContext | None = None) -> TaskStepContext:
    """Run to the end, then check every server the run started is gone."""
    ctx = asyncio.run(run_plan(plan, config, context=context, run_id=run_id))
    pids = [e["pid"] for e in Ledger.of_run(run_dir(config, run_id)).entries().values() if e.get("pid")]
    assert pids and not [pid for pid in pids if is_running(pid)]
    return ctx


def plan_of(folder: Path, config, name: str, steps: list[dict]):
    path = folder / f"{name}.json"
    path.write_text(json.dumps(steps))
    return load_plan(path, config)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The quickstart task, run once: ``<env-id>`` comes from the seed, as in ``task run-batch``."""
    root = tmp_path_factory.mktemp("project")
    (root / ".agentenv").mkdir()
    (root / ".agentenv" / "config.toml").write_text(CONFIG)
    config = load_config(root)
    seeded = TaskStepContext(metadata={"seed": {"env-id": "item-store"}})
    return root, config, run(load_plan(QUICKSTART, config), config, "quickstart", seeded)


def test_quickstart_runs_offline_and_snapshots_the_store(quickstart):
    _, config, ctx = quickstart

    assert "failed_steps" not in ctx.metadata
    assert [e.env_id for e in ctx.deployed_envs] == ["item-store"]
    [response] = ctx.prompt_responses
    assert (response.prompt_id, response.response) == ("p1", "The item store holds: readme")
    rubric = ctx.metadata["verifications"]["rubric"]
    assert (rubric["graded"], rubric["score"], rubric["results"]) == (False, None, [])
    assert "no judge configured" in rubric["reason"]

    ref = ctx.metadata["env_snapshotted_universes"]["snapshot"]
    assert ref == {"id": f"{ctx.instance_id}-snapshot-snapshot", "version": 1}
    universe = artifact_store(config).get(ref["id"], ref["version"])
    assert (universe.type, universe.environment_name) == ("environment_universe", "item-store")
    assert universe.metadata == {"env_id": "item-store", "snapshot_step_id": "snapshot"}
    files = universe.files
    assert list(files) == ["item-store.json"]
    assert json.loads(files["item-store.json"].read_text()) == {"items": ["readme"]}


def test_a_snapshot_loads_back_into_a_fresh_env(quickstart):
    root, config, first = quickstart
    ref = first.metadata["env_snapshotted_universes"]["snapshot"]
    plan = plan_of(root, config, "reload", [
        {"id": "deploy", "type": "deploy_env", "env_id": "copy"},
        {"id": "load", "type": "load_artifact", "env_id": "copy", "artifacts": [ref]},
        {"id": "again", "type": "snapshot_env", "snapshot_id": "reloaded",
         "original_universe_artifact_id": ref["id"]},
        {"id": "again2", "type": "snapshot_env", "env_id": "copy", "snapshot_id": "reloaded"},
    ])
    ctx = run(plan, config, "reload")

    assert ctx.metadata["env_snapshotted_universes"] == {
        "again": {"id": "reloaded", "version": 1}, "again2": {"id": "reloaded", "version": 2},
    }
    store = artifact_store(config)
    for version in (1, 2):
        copy = store.get("reloaded", version)
        assert json.loads(copy.files["item-store.json"].read_text()) == {"items": ["readme"]}
    assert store.get("reloaded", 1).metadata["env_id"] == "copy"


def test_a_failed_export_fails_the_step(quickstart):
    root, config, _ = quickstart
    plan = plan_of(root, config, "gone", [
        {"id": "deploy", "type": "deploy_env", "env_id": "copy"},
        {"id": "stop", "type": "teardown_sandboxes", "env_ids": ["copy"]},
        {"id": "snapshot", "type": "snapshot_env", "env_id": "copy", "fail_task_on_error": False},
    ])
    ctx = run(plan, config, "gone")

    [failure] = ctx.metadata["failed_steps"]
    assert (failure["step_id"], failure["is_fatal"]) == ("snapshot", False)
    assert failure["error"].startswith("data/get failed:")
    assert "env_snapshotted_universes" not in ctx.metadata
