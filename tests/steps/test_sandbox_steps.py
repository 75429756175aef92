"""deploy_sandbox, load_artifact into a sandbox and verify_sandbox, run for real by the asyncio
walker: the upstream ``hello`` example, its failing twin, and each probe kind."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import psutil
import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runner import run_plan
from agentenv_dagster.steps.execution import StepFailed

HELLO = Path("/work/shared/corpus/agentenv/hello.json")
SLEEP_MARK = "29.125"  # a sleep duration no other process uses, to find leftovers by


def project(tmp_path: Path, check_exit: int = 0):
    """A project whose bundle artifact ``greeting`` holds hello.txt and check.sh."""
    (tmp_path / ".agentenv").mkdir()
    (tmp_path / ".agentenv" / "config.toml").write_text(
        '[stores]\nstate_dir = "state"\nartifact_dirs = ["bundles"]\n'
    )
    greeting = tmp_path / "bundles" / "greeting"
    greeting.mkdir(parents=True)
    (greeting / "hello.txt").write_text("hello, world\n")
    (greeting / "check.sh").write_text(f"grep -q world hello.txt\nexit {check_exit}\n")
    return load_config(tmp_path)


def plan_of(tmp_path: Path, config, steps: list[dict]):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(steps))
    return load_plan(path, config)


def run(plan, config):
    return asyncio.run(run_plan(plan, config))


def test_hello_example_passes(tmp_path):
    config = project(tmp_path)
    ctx = run(load_plan(HELLO, config), config)

    assert "failed_steps" not in ctx.metadata
    [sandbox] = ctx.deployed_sandboxes
    assert (sandbox.sandbox_name, sandbox.sandbox_mode, sandbox.sandbox_type) == ("box", "vm", "local")
    root = Path(sandbox.sandbox_root)
    assert root.parent == config.state_dir / "runs" / ctx.metadata["run_group_id"] / "sandboxes"
    assert (root / "app" / "greeting" / "hello.txt").read_text() == "hello, world\n"
    assert ctx.metadata["loaded_file_artifact_universes"] == [{
        "id": "greeting", "version": 1, "artifact_type": "file_artifact_universe", "env_id": None,
        "agent_name": None, "sandbox_name": "box", "destination_path": "/app/greeting",
        "files": ["check.sh", "hello.txt"],
    }]
    entry = ctx.metadata["verifications"]["hello"]
    assert (entry["score"], entry["score_aggregator"], entry["graded"]) == (1.0, "all_pass", True)
    greets, check = entry["results"]
    assert greets == {
        "type": "probe_file_contains", "criterion": "greets", "paths": ["hello.txt"], "expected": "hello",
        "criterion_index": 0, "score": 1.0, "result": True, "justification": "contains 'hello'",
        "skipped": False,
    }
    assert (check["criterion_index"], check["result"], check["justification"]) == (1, True, "exit=0; output=")


def test_hello_example_scores_zero_when_its_check_fails(tmp_path):
    config = project(tmp_path, check_exit=1)
    ctx = run(load_plan(HELLO, config), config)

    entry = ctx.metadata["verifications"]["hello"]
    assert entry["score"] == 0.0
    assert [r["result"] for r in entry["results"]] == [True, False]
    assert entry["results"][1]["justification"].startswith("exit=1")


def test_each_probe_kind_and_skipped_criteria(tmp_path):
    config = project(tmp_path)
    steps = [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container",
         "image": "python:3.11", "port": 8000},
        {"id": "load", "type": "load_artifact", "sandbox_name": "box", "artifact_id": "greeting"},
        {"id": "check", "type": "verify_sandbox", "sandbox_name": "box", "base_dir": "/loaded",
         "shell_timeout_seconds": 1, "score_aggregator": "weighted_average", "criteria": [
             {"type": "probe_file_exists", "paths": ["hello.txt", "/loaded/check.sh"]},
             {"type": "probe_dir_exists", "paths": ["/loaded"]},
             {"type": "probe_file_exists", "paths": ["hello.txt", "gone.txt"]},
             {"type": "probe_file_contains", "paths": ["hello.txt"], "value": "^hello, w"},
             {"type": "response_contains", "needles": ["hi"]},
             {"type": "bash_cmd_succeeds", "bash_cmd": f"sleep {SLEEP_MARK} & sleep {SLEEP_MARK}"},
             {"type": "probe_file_exists", "paths": ["../../escape"]},
         ]},
    ]
    started = time.monotonic()
    ctx = run(plan_of(tmp_path, config, steps), config)

    # A sleep left holding the output pipe would keep the run waiting for it.
    assert time.monotonic() - started < 10
    rows = ctx.metadata["verifications"]["check"]["results"]
    assert [r.get("result") for r in rows] == [True, True, False, True, None, False, False]
    assert rows[2]["justification"] == "Missing: ['gone.txt']"
    assert rows[4]["skipped"] is True and "score" not in rows[4]
    assert rows[5]["justification"] == "timed out after 1.0s"
    assert rows[6]["justification"].startswith("evaluator error: path")
    # The skipped row is left out: 3 of 6 scored rows pass.
    assert ctx.metadata["verifications"]["check"]["score"] == 0.5
    assert ctx.metadata["loaded_file_artifact_universes"][0]["destination_path"] == "/loaded"
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", SLEEP_MARK]]
    assert leftovers == []


def test_a_second_sandbox_of_one_name_fails_the_run(tmp_path):
    config = project(tmp_path)
    box = {"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"}
    plan = plan_of(tmp_path, config, [{"id": "a", **box}, {"id": "b", **box}])

    with pytest.raises(StepFailed, match="Sandbox 'box' is already deployed"):
        run(plan, config)


@pytest.mark.parametrize(("step", "message"), [
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container", "image": "x"},
     "container-mode sandbox requires `image` and `port`"),
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "pod"}, "'vm' or 'container'"),
    ({"type": "verify_sandbox", "sandbox_name": "box", "agent_name": "a"},
     "set either `agent_name` or `sandbox_name`, not both"),
    ({"type": "verify_sandbox", "sandbox_name": "box"}, "no step it depends on deploys sandbox 'box'"),
])
def test_documents_refused_at_load(tmp_path, step, message):
    config = project(tmp_path)
    with pytest.raises(TaskLoadError, match=message):
        plan_of(tmp_path, config, [{"id": "s", **step}])
