"""Faults in the production profile, for real: deploy/dagster.yaml on PostgreSQL, the S3 IO
manager, a dagster-daemon and Celery workers on Redis (deploy/celery.yaml). A Celery worker
killed in the middle of a step must not leave its run STARTED, nor what its steps started
running."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

import services
from agentenv_dagster.runtime.local import Ledger
from projects import REPO, dagster_daemon, leaked_servers
from test_production_profile import bucket_run_ids, celery_project, run_status

pytestmark = pytest.mark.slow

AGENT_SLEEPS = 900  # the agent answers long after the bound: only the fault handling can end the run
VISIBILITY_SECONDS = 15  # this test's visibility_timeout (deploy/celery.yaml's is hours)
RESTORE_SECONDS = 2  # this test's unacked_restore_interval
# a lost step runs again within VISIBILITY_SECONDS + RESTORE_SECONDS of its start once a worker
# runs; then it must fail (its agent died with the worker) and the run end: a minute's margin
# for the worker's start and the step's
BOUND_SECONDS = VISIBILITY_SECONDS + RESTORE_SECONDS + 60
# a step whose pool process died is back on the queue at once: a new pool process, the step's
# start and failure and the run's end take seconds, not a visibility timeout
REQUEUE_BOUND_SECONDS = 60
REPLY = "reply_to_dana_steps.reply"


def celery_settings(root) -> None:
    """The workers' deploy/celery.yaml with a visibility timeout of seconds, not hours."""
    path = root / "celery.yaml"
    text, found = re.subn(r"visibility_timeout: \d+", f"visibility_timeout: {VISIBILITY_SECONDS}", path.read_text())
    text, found_too = re.subn(r"unacked_restore_interval: \d+", f"unacked_restore_interval: {RESTORE_SECONDS}", text)
    assert found == found_too == 1, "deploy/celery.yaml no longer sets the redelivery of a lost worker's step"
    path.write_text(text)


def celery_executions(pg, run_id: str, step_key: str) -> list[str]:
    """The Celery workers (``name@host``) that began executing the step, in order
    (dagster-celery's events)."""
    rows = pg.query("SELECT event FROM event_logs WHERE run_id = %s AND step_key = %s AND event LIKE %s ORDER BY id",
                    run_id, step_key, "%in celery worker%")
    workers = []
    for (event,) in rows:
        entries = json.loads(event)["dagster_event"]["event_specific_data"]["metadata_entries"]
        workers += [e["entry_data"]["text"] for e in entries if e["label"] == "Celery worker"]
    return workers


def failures(pg, run_id: str) -> dict[str, str]:
    """The run's failure events: each failed step's message, and the run's (key None)."""
    rows = pg.query("SELECT step_key, event FROM event_logs WHERE run_id = %s "
                    "AND dagster_event_type IN ('STEP_FAILURE', 'PIPELINE_FAILURE', 'RUN_FAILURE') ORDER BY id", run_id)
    found = {}
    for step_key, event in rows:
        data = json.loads(event)["dagster_event"]
        error = (data.get("event_specific_data") or {}).get("error") or {}
        found[step_key] = error["message"] if step_key else data["message"]
    return found


def test_a_step_lost_with_its_killed_worker_runs_again_on_a_restarted_one_and_the_run_fails(
        tmp_path, pg, s3, redis_url):
    """SIGKILL of a whole Celery worker (main process and pool) while the agent step runs: the
    step's task is neither acknowledged nor requeued by anyone. Redis hands it to the worker
    started after, once unacknowledged for the visibility timeout; the step runs again there,
    finds the agent that died with the first worker gone, and fails: the run ends FAILURE
    within the bound, by its own run worker, and nothing it started still runs."""
    root, env = celery_project(tmp_path, pg, s3, redis_url)
    celery_settings(root)
    shutil.copy(REPO / "workspace.yaml", root / "workspace.yaml")
    config = root / ".agentenv" / "config.toml"
    script = 'script = "agents/reply_to_dana.replay.json"\n'
    assert script in config.read_text()
    config.write_text(config.read_text().replace(script, script + f"delay_seconds = {AGENT_SLEEPS}\n"))
    run_id = str(uuid.uuid4())
    launched = subprocess.run([sys.executable, "-m", "dagster", "job", "launch", "-w", "workspace.yaml",
                               "-j", "reply_to_dana", "--run-id", run_id],
                              cwd=root, env=env, capture_output=True, text=True, timeout=180)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]

    with dagster_daemon(root, tmp_path / "daemon.log", env):
        with services.celery_worker(root, env, tmp_path / "worker.log", name="first") as first:
            services.wait_until(lambda: celery_executions(pg, run_id, REPLY), "the agent step", timeout=240,
                                interval=0.5)
            first.kill()
        killed = time.monotonic()
        assert run_status(pg, run_id) == "STARTED"
        with services.celery_worker(root, env, tmp_path / "worker.log", name="second"):
            while run_status(pg, run_id) == "STARTED" and time.monotonic() - killed < BOUND_SECONDS + 120:
                time.sleep(1)
            took = time.monotonic() - killed
            status = run_status(pg, run_id)
            assert status == "FAILURE", f"the run is {status} {took:.0f} s after its worker was killed"
            assert took <= BOUND_SECONDS, f"the run failed {took:.0f} s after its worker was killed"
        run_dir = root / ".agentenv" / "state" / "runs" / run_id
        services.wait_until(lambda: Ledger.of_run(run_dir).closed, "the run's ledger closed (teardown sensor)",
                            timeout=90, interval=1)

    # the step ran twice, the second time on the restarted worker, and failed there
    assert [worker.split("@")[0] for worker in celery_executions(pg, run_id, REPLY)] == ["first", "second"]
    failed = failures(pg, run_id)
    assert set(failed) == {REPLY, None}, failed
    assert "step 'reply' (prompt_agent) failed: All connection attempts failed" in failed[REPLY]
    assert f"Steps failed: ['{REPLY}']" in failed[None]  # the run worker ended the run itself
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_dataset_job_launched_with_no_partition_runs_the_dataset_s_selection(tmp_path, pg, s3, redis_url):
    """`dagster job launch -j triage_tickets` names no partition: the run takes the dataset's
    selection (here every row), on the Celery worker, instead of failing with pydantic's dump
    of an empty step."""
    root, env = celery_project(tmp_path, pg, s3, redis_url)
    shutil.copy(REPO / "workspace.yaml", root / "workspace.yaml")
    run_id = str(uuid.uuid4())
    launched = subprocess.run([sys.executable, "-m", "dagster", "job", "launch", "-w", "workspace.yaml",
                               "-j", "triage_tickets", "--run-id", run_id],
                              cwd=root, env=env, capture_output=True, text=True, timeout=180)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    with dagster_daemon(root, tmp_path / "daemon.log", env), \
            services.celery_worker(root, env, tmp_path / "worker.log", name="rows"):
        services.wait_until(lambda: run_status(pg, run_id) in ("SUCCESS", "FAILURE", "CANCELED"), "the run",
                            timeout=240, interval=1)
    assert run_status(pg, run_id) == "SUCCESS", failures(pg, run_id)
    rows = pg.query("SELECT event FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
                    run_id)
    verified = {json.loads(event)["dagster_event"]["event_specific_data"]["materialization"]["partition"]
                for (event,) in rows if '"verifications"' in event}
    assert verified == {"t1", "t2", "t3", "t4", "t5", "t6"}
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_step_whose_worker_process_is_killed_runs_again_at_once_and_the_run_fails(tmp_path, pg, s3, redis_url):
    """SIGKILL of the pool process running the agent step while its worker lives on (what the
    OOM killer does): the worker puts the step back on the queue at once
    (task_reject_on_worker_lost) and runs it again in a new pool process. Every step ran in
    the killed process (one a worker), so the agent died with it: the step fails the second
    time and the run ends FAILURE, without waiting for any visibility timeout."""
    root, env = celery_project(tmp_path, pg, s3, redis_url)
    config = root / ".agentenv" / "config.toml"
    script = 'script = "agents/reply_to_dana.replay.json"\n'
    config.write_text(config.read_text().replace(script, script + f"delay_seconds = {AGENT_SLEEPS}\n"))
    with services.celery_worker(root, env, tmp_path / "worker.log", name="only", concurrency=1) as worker:
        run = subprocess.Popen([sys.executable, "-m", "dagster", "job", "execute", "-f", "definitions.py",
                                "-j", "reply_to_dana"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            run_id = services.wait_until(lambda: next(iter(bucket_run_ids(s3, root)), None), "the run", timeout=120)
            services.wait_until(lambda: celery_executions(pg, run_id, REPLY), "the agent step", timeout=240,
                                interval=0.5)
            (process,) = worker.pool()
            process.kill()
            assert run.wait(timeout=REQUEUE_BOUND_SECONDS) != 0  # (the run ends within the bound, failed)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait(timeout=30)
    assert run_status(pg, run_id) == "FAILURE"
    assert [w.split("@")[0] for w in celery_executions(pg, run_id, REPLY)] == ["only", "only"]
    failed = failures(pg, run_id)
    assert set(failed) == {REPLY, None}, failed
    assert "step 'reply' (prompt_agent) failed: All connection attempts failed" in failed[REPLY]
    assert leaked_servers(root / ".agentenv" / "state") == []
