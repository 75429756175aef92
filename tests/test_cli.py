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


@pytest.mark.slow
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


@pytest.mark.slow
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


# -- hostile or mistaken input: one clean line, exit 2 (docs/input-limits.md) -----------------


def test_version(project):
    done = cli(project, "--version")
    assert (done.returncode, done.stdout.strip()) == (0, "agentenv-dagster, version 0.1.0")


def test_validate_names_the_real_cause_of_a_yaml_file_that_is_no_task(project):
    typo = project / "typo.yaml"
    typo.write_text("task_id: t\ndescription: d\ninitial_prompt: p\nsucess_criteria:\n"
                    "- {type: file_exist, path: a.py, description: d}\n")
    syntax = project / "syntax.yaml"
    syntax.write_text("task_id: t\ndescription: [d\ninitial_prompt: p\n")
    criterion = project / "criterion.yaml"
    criterion.write_text(typo.read_text().replace("sucess_criteria", "success_criteria"))
    done = cli(project, "validate", str(typo), str(syntax), str(criterion))
    assert done.returncode == 1
    lines = done.stdout.strip().splitlines()
    assert lines[:2] == [
        f"{typo}:4: field 'sucess_criteria': unknown field (did you mean 'success_criteria'? 'success_criteria' is required)",
        f"{syntax}: invalid YAML at line 3 column 15: expected ',' or ']', but got ':'",
    ]
    assert lines[2].startswith(f"{criterion}: field 'success_criteria.0.type': unknown criterion type 'file_exist' (known: [")
    assert lines[2].endswith("]); did you mean 'file_exists'?")


def test_validate_format_json_is_one_document_with_the_exit_codes_of_text(project):
    bad = project / "bad.json"
    bad.write_text(json.dumps([{"id": "a", "type": "deploy_env", "env_id": "nowhere"},
                               {"id": "b", "type": "prompt_agent", "promt": "hi"}]))
    done = cli(project, "validate", "--format", "json", str(bad), "tasks/reply_to_dana.json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout) == {
        "files": [str(bad), "tasks/reply_to_dana.json"], "valid": 1,
        "errors": [{"file": str(bad), "line": None, "step": "b", "field": "promt",
                    "message": "unknown field (did you mean 'prompt'?)"}],
        "warnings": [],
    }
    valid = cli(project, "validate", "--format", "json", "tasks/reply_to_dana.json")
    assert valid.returncode == 0 and json.loads(valid.stdout)["errors"] == []


def test_a_path_that_does_not_exist_is_bad_input(project):
    validate = cli(project, "validate", "tasks/nope.yaml")
    assert validate.returncode == 2 and "Path 'tasks/nope.yaml' does not exist" in validate.stderr
    run = cli(project, "run", "tasks/nope.yaml")
    assert (run.returncode, run.stderr) == (2, "error: tasks/nope.yaml: no such file or folder\n")


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("deep.json", b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested deeper than 100 levels"),
    ("deep.yaml", b"task_id: t\nsuccess_criteria: " + b"[" * 10_000 + b"]" * 10_000,
     "2: field 'success_criteria.0.0...': nested deeper than 100 levels"),
    ("binary.json", b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), "binary data, not a text document (a NUL byte at line 1 column 8)"),
    ("latin1.yaml", "task_id: t\ndescription: Ça va\n".encode("latin-1"),
     "not UTF-8 text: byte 0xc7 at line 2 column 14 (save the file as UTF-8)"),
], ids=["nested-json", "nested-yaml", "binary", "latin-1"])
def test_run_refuses_a_hostile_document_in_one_line(project, name, content, expected):
    (project / "tasks" / name).write_bytes(content)
    done = cli(project, "run", f"tasks/{name}")
    separator = "" if expected[0].isdigit() else " "
    assert (done.returncode, done.stderr) == (2, f"tasks/{name}:{separator}{expected}\n")


def test_task_run_refuses_a_bad_context_file_in_one_line(project):
    assert cli(project, "task", "create", "tasks/reply_to_dana.json", "--id", "dana").returncode == 0
    cases = {
        "syntax.json": ("{not json", "invalid JSON at line 1 column 2: Expecting property name enclosed in double quotes"),
        "list.json": ("[1, 2]", "a saved context is a JSON object, got list"),
        "shape.json": ('{"deployed_envs": [{"mcp_url": "http://x"}]}', "field 'deployed_envs.0.env_id': required field is missing"),
        "nan.json": ('{"metadata": {"score": NaN}}', "field 'metadata.score': nan is not a finite number (NaN and infinity are refused)"),
    }
    for name, (text, expected) in cases.items():
        (project / name).write_text(text)
        done = cli(project, "task", "run", "--id", "dana", "--start-step", "6", "--context", name)
        assert (done.returncode, done.stderr) == (2, f"error: {name}: {expected}\n"), name


def test_option_values_are_checked_before_anything_runs(project):
    sample = cli(project, "run", "tasks", "--sample", "-1")
    assert sample.returncode == 2 and "Invalid value for '--sample': -1 is not in the range x>=1." in sample.stderr
    seed = cli(project, "run", "tasks", "--sample", "2", "--seed", "x")
    assert seed.returncode == 2 and "Invalid value for '--seed': 'x' is not a valid integer." in seed.stderr
    define = cli(project, "run", "tasks/reply_to_dana.json", "-D", "metadata.limit=NaN")
    assert (define.returncode, define.stderr) == (
        2, "error: -D metadata.limit: nan is not a finite number (NaN and infinity are refused)\n")
