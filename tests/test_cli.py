"""The ``agentenv-dagster`` CLI, run for real in a subprocess, with its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from projects import leaked_servers, make_project


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project")
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def cli(project: Path, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), **(env or {})}
    environment.pop("ANTHROPIC_API_KEY", None) if "ANTHROPIC_API_KEY" not in (env or {}) else None
    return subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=environment,
        capture_output=True, text=True, timeout=timeout,
    )


def test_validate_accepts_the_examples(project):
    done = cli(project, "validate", "tasks")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(list((project / 'tasks').iterdir()))} task document(s) valid" in done.stdout


def test_validate_accepts_the_upstream_agentenv_corpus(project, upstream_corpus):
    done = cli(project, "validate", str(upstream_corpus / "agentenv"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "task document(s) valid" in done.stdout


def test_validate_reports_one_line_per_problem_and_exits_1(project):
    bad = project / "bad.json"
    bad.write_text(json.dumps([
        {"id": "a", "type": "deploy_env", "env_id": "email", "depends_on": ["b"]},
        {"id": "b", "type": "prompt_agent", "promt": "hi"},
    ]))
    done = cli(project, "validate", str(bad))
    assert done.returncode == 1
    assert done.stdout.strip().splitlines() == [
        f"{bad}: step 'b': field 'promt': unknown field (did you mean 'prompt'?)",
        f"{bad}: step 'a': field 'depends_on': Step 'a' at position 0 declares depends_on 'b', which doesn't "
        "come before it (forward refs are not allowed: a step depends only on the steps before it)",
    ]


def test_run_writes_the_redacted_context_and_prints_where_things_are(project, tmp_path):
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/reply_to_dana.json", "--output-dir", str(out),
               "-D", "metadata.user_overrides.litellm_api_key=sk-test-never-stored")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"context:          {out / 'context.json'}" in done.stdout
    assert "verification sent: 1.000" in done.stdout
    assert "verification tone: not graded" in done.stdout
    context = json.loads((out / "context.json").read_text())
    assert context["metadata"]["verifications"]["sent"]["score"] == 1.0
    assert "litellm_api_key" not in json.dumps(context)
    assert context["metadata"]["user_overrides"] == {}


@pytest.mark.slow
def test_the_monday_example_runs_through_dagster_on_its_virtual_clock(project, tmp_path):
    """tasks/monday_dana.json end to end, offline: Monday 9:00 on the env's clock, Dana's email
    sets off the env trigger that prompts the assistant, Dana (a user agent whose lines are
    agent triggers) chats with it; both verifications are graded by deterministic checks."""
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/monday_dana.json", "--output-dir", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    context = json.loads((out / "context.json").read_text())
    verifications = context["metadata"]["verifications"]
    assert {k: v["score"] for k, v in verifications.items()} == {"answered": 1.0, "chat_checked": 1.0}
    (clock,) = context["metadata"]["clock_configurations"]
    assert clock["virtual_time"] == "2026-11-30T09:00:00Z"
    assert context["metadata"]["agent_trigger_firings"]
    assert leaked_servers(project / ".agentenv" / "state") == []


def test_run_exit_codes(project):
    missing = cli(project, "run", "tasks/nope.json")
    assert missing.returncode == 2 and "cannot read file" in missing.stderr
    (project / "tasks" / "fails.json").write_text(json.dumps([
        {"id": "email", "type": "deploy_env", "env_id": "no-such-env"},
    ]))
    failed = cli(project, "run", "tasks/fails.json")
    assert failed.returncode == 1
    assert "Env 'no-such-env' is not registered" in failed.stdout


def test_task_create_adds_versions_and_task_run_regrades_a_saved_context(project, tmp_path):
    first = cli(project, "task", "create", "tasks/reply_to_dana.json", "--id", "dana")
    second = cli(project, "task", "create", "tasks/reply_to_dana.json", "--id", "dana")
    assert first.stdout.strip() == "Created task 'dana' version 1"
    assert second.stdout.strip() == "Created task 'dana' version 2"
    stored = json.loads((project / ".agentenv/state/tasks/dana/1.json").read_text())
    assert stored["type"] == "task" and stored["steps"][1]["depends_on"] == [{"task_step_id": "email"}]

    out = tmp_path / "full"
    assert cli(project, "task", "run", "--id", "dana", "--output-dir", str(out)).returncode == 0
    saved = json.loads((out / "context.json").read_text())

    # Re-run only `collect` (index 6) against the saved context: nothing is redeployed, the
    # agent's files are still in its sandbox folder, the saved verifications are kept.
    regrade = tmp_path / "regrade"
    done = cli(project, "task", "run", "--id", "dana", "--version", "1", "--start-step", "6",
               "--context", str(out / "context.json"), "--output-dir", str(regrade))
    assert done.returncode == 0, done.stdout + done.stderr
    context = json.loads((regrade / "context.json").read_text())
    assert context["deployed_envs"] == saved["deployed_envs"]
    assert context["metadata"]["verifications"]["sent"]["score"] == 1.0
    assert context["metadata"]["collected_artifacts"]["collect"]["file_artifact_universe"]["version"] == 2


def test_task_run_refuses_bad_slices_and_unknown_tasks(project):
    assert cli(project, "task", "create", "tasks/reply_to_dana.json", "--id", "dana").returncode == 0
    out_of_range = cli(project, "task", "run", "--id", "dana", "--start-step", "7")
    assert out_of_range.returncode == 2 and "start_step=7 out of range [0, 7)" in out_of_range.stderr
    unknown = cli(project, "task", "run", "--id", "nobody")
    assert unknown.returncode == 2 and "Task 'nobody' not found" in unknown.stderr
    # a slice whose steps need names nothing provides is refused before running
    no_context = cli(project, "task", "run", "--id", "dana", "--start-step", "3")
    assert no_context.returncode == 2
    assert "step 'reply': field 'agent_name': no step it depends on deploys agent 'assistant'" in no_context.stderr


def test_validate_coder_eval_yaml_warns_on_unknown_top_level_keys_and_fails_on_nested_ones(project):
    good = project / "tasks" / "stale.yaml"
    good.write_text("task_id: s\ndescription: d\ninitial_prompt: p\nmax_iterations: 3\nagent: {type: replay, episodes: []}\n"
                    "success_criteria: [{type: file_exists, path: a.py, description: d}]\n")
    done = cli(project, "validate", str(good))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"warning: {good}: field 'max_iterations': unknown top-level field will be ignored" in done.stderr
    bad = project / "bad.yaml"
    bad.write_text(good.read_text().replace("agent: {type: replay, episodes: []}", "agent: {type: replay, episodes: [], modle: x}"))
    failed = cli(project, "validate", str(bad))
    assert failed.returncode == 1
    assert failed.stdout.startswith(f"{bad}: field 'agent.modle': unknown field")
