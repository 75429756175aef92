"""review: a run pauses until a person approves or rejects it with ``agentenv-dagster review``
(run for real in a subprocess), or until the wait times out."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.context import PromptResponse, TaskStepContext
from agentenv_dagster.runner import run_plan
from agentenv_dagster.runtime.review import ReviewError, RunReviews
from agentenv_dagster.steps.execution import StepFailed

GATE = {"id": "gate", "type": "review", "label": "check the reply", "timeout_seconds": 60,
        "poll_interval_seconds": 0.05}
AFTER = {"id": "after", "type": "deploy_sandbox", "sandbox_name": "approved", "sandbox_mode": "vm"}


@pytest.fixture
def config(tmp_path):
    (tmp_path / ".agentenv").mkdir()
    (tmp_path / ".agentenv" / "config.toml").write_text('[stores]\nstate_dir = "state"\n')
    return load_config(tmp_path)


def cli(cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(cwd / ".dagster_home")}
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


class BackgroundRun:
    """The task run by the plain asyncio walker in a thread, so the test can decide meanwhile."""

    def __init__(self, tmp_path: Path, config, steps: list[dict], ctx: TaskStepContext | None = None):
        path = tmp_path / "task.json"
        path.write_text(json.dumps(steps))
        self.plan, self.config = load_plan(path, config), config
        self.run_id = uuid.uuid4().hex
        self.ctx = ctx or TaskStepContext()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            asyncio.run(run_plan(self.plan, self.config, context=self.ctx, run_id=self.run_id))
        except BaseException as exc:  # handed to the test
            self.error = exc

    @property
    def reviews(self) -> RunReviews:
        return RunReviews.of_run(self.config.state_dir / "runs" / self.run_id)

    def wait_awaiting(self, deadline: float = 30) -> list[dict]:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if waiting := self.reviews.awaiting():
                return waiting
            time.sleep(0.05)
        raise AssertionError("no review became awaiting")

    def join(self, deadline: float = 30) -> TaskStepContext:
        self.thread.join(deadline)
        assert not self.thread.is_alive(), "the run did not finish"
        return self.ctx


def test_approve_from_the_cli_continues_the_run(tmp_path, config):
    reply = PromptResponse(prompt_id="p", response="the answer is 42", step_id="ask")
    run = BackgroundRun(tmp_path, config, [GATE, AFTER], TaskStepContext(prompt_responses=[reply]))
    [waiting] = run.wait_awaiting()
    assert run.thread.is_alive() and not run.ctx.deployed_sandboxes  # paused before `after`

    listed = cli(tmp_path, "review", run.run_id[:8])
    assert listed.returncode == 0, listed.stderr
    assert '"label": "check the reply"' in listed.stdout and "1 review(s) awaiting a decision" in listed.stdout

    decided = cli(tmp_path, "review", run.run_id[:8], "approve", "--note", "looks right", "--by", "ana")
    assert decided.returncode == 0, decided.stderr
    assert decided.stdout.strip() == "review 'gate': continue (ana)"
    ctx = run.join()

    assert run.error is None
    assert [s.sandbox_name for s in ctx.deployed_sandboxes] == ["approved"]
    entry = ctx.metadata["review_decisions"]["gate"]
    assert {k: entry[k] for k in ("decision", "label", "decided_by", "note", "source", "timed_out")} == {
        "decision": "continue", "label": "check the reply", "decided_by": "ana", "note": "looks right",
        "source": "cli", "timed_out": False,
    }
    assert entry["waited_seconds"] > 0 and entry["decided_at_utc"] >= entry["requested_at_utc"]
    assert waiting["upstream"] == {"step_id": "ask", "prompt_id": "p", "response": "the answer is 42"}
    assert run.reviews.awaiting() == []  # no longer listed once decided


def test_reject_fails_the_step_and_nothing_after_it_runs(tmp_path, config):
    run = BackgroundRun(tmp_path, config, [GATE, AFTER])
    run.wait_awaiting()
    decided = cli(tmp_path, "review", run.run_id, "reject", "--note", "wrong file", "--by", "bo")
    assert decided.returncode == 0, decided.stderr
    ctx = run.join()

    assert isinstance(run.error, StepFailed)
    assert str(run.error) == "step 'gate' (review) failed: review 'gate' aborted by operator (bo): wrong file"
    assert ctx.deployed_sandboxes == []
    assert ctx.metadata["review_decisions"]["gate"]["decision"] == "abort"
    [failure] = ctx.metadata["failed_steps"]
    assert (failure["error_type"], failure["is_fatal"]) == ("ReviewAbortedError", True)


def test_no_decision_within_the_timeout_fails_the_step(tmp_path, config):
    started = time.monotonic()
    run = BackgroundRun(tmp_path, config, [{**GATE, "timeout_seconds": 0.3}, AFTER])
    ctx = run.join()

    assert 0.3 <= time.monotonic() - started < 10
    assert str(run.error) == "step 'gate' (review) failed: review 'gate' timed out after 0.3s awaiting a decision"
    assert ctx.metadata["failed_steps"][0]["error_type"] == "TimeoutError"
    entry = ctx.metadata["review_decisions"]["gate"]
    assert (entry["decision"], entry["timed_out"]) == (None, True)
    assert ctx.deployed_sandboxes == [] and run.reviews.awaiting() == []


def test_a_tolerated_timeout_lets_the_run_go_on(tmp_path, config):
    run = BackgroundRun(tmp_path, config, [{**GATE, "timeout_seconds": 0.1, "fail_task_on_error": False}, AFTER])
    ctx = run.join()
    assert run.error is None
    assert [s.sandbox_name for s in ctx.deployed_sandboxes] == ["approved"]
    assert ctx.metadata["failed_steps"][0]["is_fatal"] is False


def test_a_decision_for_a_named_step_may_come_first(tmp_path, config):
    run_dir = config.state_dir / "runs" / "r1"
    RunReviews.of_run(run_dir).decide("approve", step_id="gate", decided_by="ci")
    path = tmp_path / "task.json"
    path.write_text(json.dumps([GATE]))
    ctx = asyncio.run(run_plan(load_plan(path, config), config, run_id="r1"))
    assert ctx.metadata["review_decisions"]["gate"]["decided_by"] == "ci"


def test_cli_refusals(tmp_path, config):
    (config.state_dir / "runs" / "abc123").mkdir(parents=True)
    (config.state_dir / "runs" / "abd456").mkdir(parents=True)

    missing = cli(tmp_path, "review", "zzz", "approve")
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: no run 'zzz' under {config.state_dir / 'runs'}"
    ambiguous = cli(tmp_path, "review", "ab", "approve")
    assert (ambiguous.returncode, "is ambiguous" in ambiguous.stderr) == (2, True)
    idle = cli(tmp_path, "review", "abc", "approve")
    assert idle.returncode == 2
    assert idle.stderr.strip() == "error: no review is awaiting a decision in this run (name one with --step)"
    bad = cli(tmp_path, "review", "abc", "maybe")
    assert bad.returncode == 2 and "Invalid value" in bad.stderr


def test_two_awaiting_reviews_need_a_step_and_a_row_decision_wins(tmp_path, config):
    reviews = RunReviews.of_run(tmp_path / "run")
    reviews.put_awaiting("a", "row-1", {"requested_at_utc": "1"})
    reviews.put_awaiting("b", "row-1", {"requested_at_utc": "2"})
    with pytest.raises(ReviewError, match=r"2 reviews are awaiting a decision; choose one with --step: \['a', 'b'\]"):
        reviews.decide("approve")
    reviews.decide("approve", step_id="a")
    reviews.decide("reject", step_id="a", instance_id="row-2")
    assert reviews.get("a", "row-1")["decision"] == "continue"
    assert reviews.get("a", "row-2")["decision"] == "abort"
    assert reviews.get("b", "row-1") is None


@pytest.mark.slow
def test_a_dagster_run_waits_for_the_cli_decision(tmp_path):
    from projects import leaked_servers, make_project

    root = make_project(tmp_path / "p", tasks={"gated.json": [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"},
        {**GATE, "poll_interval_seconds": 0.2},
    ]})
    env = {**os.environ, "DAGSTER_HOME": str(root / ".dagster_home")}
    process = subprocess.Popen(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/gated.json", "--output-dir", "out"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        runs = load_config(root).state_dir / "runs"
        deadline = time.monotonic() + 120
        waiting: list = []
        while not waiting and time.monotonic() < deadline and process.poll() is None:
            waiting = [p for p in runs.glob("*/reviews/awaiting/*.json")] if runs.is_dir() else []
            time.sleep(0.1)
        assert waiting, process.communicate(timeout=30)
        run_id = waiting[0].parents[2].name
        decided = cli(root, "review", run_id, "approve", "--by", "ana")
        assert decided.returncode == 0, decided.stderr
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, stdout + stderr
    context = json.loads((root / "out" / "context.json").read_text())
    assert context["metadata"]["review_decisions"]["gate"]["decided_by"] == "ana"
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_run_tag_from_the_dagster_ui_decides_the_waiting_review(tmp_path, config):
    import dagster as dg

    from agentenv_dagster.orchestration.resources import RESOURCE_KEY, AgentEnvResource
    from agentenv_dagster.orchestration.review_tags import (
        apply_review_tags,
        review_tag_sensor,
    )

    run = BackgroundRun(tmp_path, config, [GATE, AFTER])
    run.wait_awaiting()
    resource = AgentEnvResource(project_dir=str(config.root))
    with dg.instance_for_test() as instance:
        dagster_run = dg.DagsterRun(job_name="gated", run_id=run.run_id, status=dg.DagsterRunStatus.STARTED)
        instance.add_run(dagster_run)
        sensor = review_tag_sensor()
        with dg.build_sensor_context(instance=instance, resources={RESOURCE_KEY: resource}) as context:
            skipped = sensor(context)
        assert isinstance(skipped, dg.SkipReason)  # untagged: nothing decided
        assert run.thread.is_alive()

        instance.add_run_tags(run.run_id, {"agentenv/review": "rejected", "agentenv/review_note": "off by one"})
        assert apply_review_tags(instance, resource) == [(run.run_id, "gate", "abort")]
        assert apply_review_tags(instance, resource) == []  # decided once
        ctx = run.join()
    assert str(run.error).endswith("review 'gate' aborted by operator (dagster run tag agentenv/review=rejected): off by one")
    assert ctx.metadata["review_decisions"]["gate"]["source"] == "dagster-tag"
