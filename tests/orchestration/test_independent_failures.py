"""One fatal failure does not cascade: 14 independent verifiers of one deployed env, one of
which fails fatally. The other 13 still reach the env and grade, the run fails naming only
the failed step (and the teardown's summary of it), and nothing is left running once the
steps that needed the env are done — under the task's default executor (it branches, so the
side-by-side ``agentenv`` one), Dagster's in-process executor and its multiprocess one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.execute import execute_plan
from agentenv_dagster.orchestration.executors import agentenv_executor, job_executor
from agentenv_dagster.orchestration.io_manager import final_context
from projects import REPO, leaked_servers, make_project, node_of

VERIFIERS = [f"v{i:02d}" for i in range(14)]
BROKEN, OTHERS = VERIFIERS[0], VERIFIERS[1:]


def fourteen_verifiers(root):
    """A project whose task deploys the email env and grades it with 14 independent
    verifiers. The broken one notes that it ran, then fails (fatal: the default); each other
    waits for that note (and, when it was not there yet, a moment more: the failed step has
    ended by then), then reads the env's state through its data plane: a verifier graded once
    the run had ended its deployments would fail to connect."""
    failed_note = root / "broken-check-ran"
    steps = [{"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []}]
    steps += [{"id": v, "type": "env_outcome_verifier", "env_id": "email", "verifier_id": v,
               "file_artifact_id": "broken_check" if v == BROKEN else "reads_env_check", "depends_on": ["email"]}
              for v in VERIFIERS]
    make_project(root, tasks={"fourteen.json": steps})
    checks = {
        "broken_check": f"""
from pathlib import Path

async def verify(mcp_url):
    Path({str(failed_note)!r}).write_text("ran")
    raise ValueError("the check itself is broken")
""",
        "reads_env_check": f"""
import asyncio
from pathlib import Path

import httpx

async def verify(mcp_url):
    note = Path({str(failed_note)!r})
    if not note.exists():  # the broken check runs beside this one: let it fail and its step end
        for _ in range(600):
            if note.exists():
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    async with httpx.AsyncClient(timeout=30) as http:
        reply = await http.post(base + "/agentenv", json={{"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {{}}}})
    reply.raise_for_status()
    return [{{"id": "env_answered", "result": True, "score": 1.0, "weight": 1}}]
""",
    }
    for name, script in checks.items():
        (root / "artifacts" / name).mkdir()
        (root / "artifacts" / name / "artifact.json").write_text('{"type": "file"}')
        (root / "artifacts" / name / "verify.py").write_text(script)
    return root


def step_ends(instance, run_id):
    """Each step's last end event in the run (success, failure, skip), by node."""
    records = instance.get_records_for_run(run_id, of_type={
        dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_SKIPPED}).records
    return {node_of(r.event_log_entry.step_key): r.event_log_entry.dagster_event_type.value for r in records}


def failure_messages(instance, run_id):
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE).records
    return {node_of(r.event_log_entry.step_key): r.event_log_entry.dagster_event.event_specific_data.error.message
            for r in records}


def assert_only_the_broken_check_failed(instance, run_id, state):
    scores = {v: instance.get_latest_materialization_event(dg.AssetKey(["verifications", "fourteen", v]))
              for v in VERIFIERS}
    assert scores[BROKEN] is None
    assert {v: e.asset_materialization.metadata["score"].value for v, e in scores.items() if e} == dict.fromkeys(OTHERS, 1.0)
    context = final_context(state / "runs", run_id)
    assert [(f["step_id"], f["error"]) for f in context.metadata["failed_steps"]] == [
        (BROKEN, "verify.py: verify() failed: ValueError: the check itself is broken")]
    assert leaked_servers(state) == []


@pytest.mark.slow
def test_under_the_default_executor_the_others_grade_and_only_the_failure_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTENV_DAGSTER_EXECUTOR", raising=False)
    root = fourteen_verifiers(tmp_path / "p")
    config = load_config(root)
    plan = load_plan(root / "tasks" / "fourteen.json", config)
    assert job_executor(config, plan) is agentenv_executor  # it branches: its steps run side by side
    with dg.instance_for_test() as instance:
        run = execute_plan(plan, config, instance=instance)
        assert not run.success
        ends = step_ends(instance, run.run_id)
        assert ends == {"email": "STEP_SUCCESS", BROKEN: "STEP_FAILURE", **dict.fromkeys(OTHERS, "STEP_SUCCESS"),
                        "teardown_run": "STEP_FAILURE"}
        messages = failure_messages(instance, run.run_id)
        assert messages[BROKEN].endswith(
            f"step '{BROKEN}' (env_outcome_verifier) failed: verify.py: verify() failed: ValueError: "
            "the check itself is broken\n")
        assert "1 of 1 rows stopped at a failing step" in messages["teardown_run"]
        assert_only_the_broken_check_failed(instance, run.run_id, root / ".agentenv" / "state")


@pytest.mark.slow
def test_under_the_in_process_executor_the_deployments_end_after_the_last_independent_step(tmp_path):
    """One step after another: the broken check fails first, Dagster skips what descends
    from it (the teardown op), and the 13 others still run; the last of them ends the run's
    deployments (no safety net here: ``execute_in_process`` in a process that lives on)."""
    root = fourteen_verifiers(tmp_path / "p")
    job = build_definitions(root / "tasks").resolve_job_def("fourteen")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success
        ends = step_ends(instance, result.run_id)
        assert {k: v for k, v in ends.items() if v != "STEP_SUCCESS"} == {BROKEN: "STEP_FAILURE"}
        assert set(ends) == {"email", *VERIFIERS}  # (the teardown op was not run: its upstream failed)
        assert_only_the_broken_check_failed(instance, result.run_id, root / ".agentenv" / "state")


@pytest.mark.slow
def test_under_the_multiprocess_executor_the_others_grade(tmp_path):
    """A process per step (``dagster job execute``): the teardown op is not run after a
    failure; the deployments end with the run's process."""
    root = fourteen_verifiers(tmp_path / "p")
    shutil.copy(REPO / "definitions.py", root / "definitions.py")
    home = root / ".dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(root), "AGENTENV_DAGSTER_EXECUTOR": "multiprocess"}
    done = subprocess.run([sys.executable, "-m", "dagster", "job", "execute", "-f", "definitions.py", "-j", "fourteen"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode != 0
    assert "Multiprocess executor" in done.stderr + done.stdout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.FAILURE
        ends = step_ends(instance, run.run_id)
        assert ends == {"email": "STEP_SUCCESS", BROKEN: "STEP_FAILURE", **dict.fromkeys(OTHERS, "STEP_SUCCESS")}
        assert_only_the_broken_check_failed(instance, run.run_id, root / ".agentenv" / "state")
