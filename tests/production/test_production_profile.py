"""The production profile for real: deploy/dagster.yaml on PostgreSQL, the S3 IO manager and
artifact store on a moto server, its run queue's limits and pools under a real daemon, and the
same job under the Celery executor (Redis broker, a worker on loopback)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from projects import REPO, dagster_daemon, leaked_servers, make_project
import services

pytestmark = pytest.mark.slow

PREFIX = "prod-test"


def s3_project(tmp_path, s3, *, extra: str = ""):
    """A copy of the checkout whose stores are the bucket, with deploy/dagster.yaml as its
    instance (DAGSTER_HOME)."""
    root = make_project(tmp_path / "project")
    config = root / ".agentenv" / "config.toml"
    text = re.sub(r"^\[stores\]\n(?:(?!\[).*\n?)*", "", config.read_text(), flags=re.MULTILINE)
    config.write_text(text + f'''
[stores]
state_dir = ".agentenv/state"
artifact_dirs = ["artifacts"]
backend = "s3"
bucket = "{s3.bucket}"
prefix = "{PREFIX}/{tmp_path.name}"
endpoint_url = "{s3.endpoint_url}"
region = "us-east-1"
{extra}''')
    shutil.copy(REPO / "definitions.py", root / "definitions.py")
    home = root / ".dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    return root


def environment(root, pg, s3, **extra: str) -> dict[str, str]:
    """The profile's environment for the CLIs, daemons and workers the tests start: the
    project's folder first on the path (its definitions.py), then the path the tests got."""
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **pg.env, **s3.env, "DAGSTER_HOME": str(root / ".dagster_home"),
            "PYTHONPATH": path, **extra}


def materializations(pg, run_id: str) -> list[str]:
    """Asset keys materialized by the run, read from PostgreSQL's event log."""
    rows = pg.query("SELECT asset_key FROM event_logs WHERE run_id = %s AND dagster_event_type = 'ASSET_MATERIALIZATION'",
                    run_id)
    paths = [json.loads(key) for (key,) in rows]  # AssetKey.to_string(): a JSON list
    return sorted("/".join(path["path"] if isinstance(path, dict) else path) for path in paths)


def run_status(pg, run_id: str) -> str:
    ((status,),) = pg.query("SELECT status FROM runs WHERE run_id = %s", run_id)
    return status


def bucket_run_ids(s3, root) -> set[str]:
    prefix = f"{PREFIX}/{root.parent.name}/runs/"
    return {key[len(prefix):].split("/")[0] for key in s3.keys(prefix)}


def bucket_streams(s3, root, run_id: str) -> dict[str, list[dict]]:
    """The run's row streams in the bucket (``runs/<run_id>/context/<step key>/<n>.jsonl``,
    appended in name order): each step key's records."""
    prefix = f"{PREFIX}/{root.parent.name}/runs/{run_id}/context/"
    streams: dict[str, list[dict]] = {}
    for key in sorted(s3.keys(prefix)):
        body = s3.client().get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        streams.setdefault(key[len(prefix):].split("/")[0], []).extend(json.loads(line) for line in body.splitlines())
    return streams


def final_context(s3, root, run_id: str, row: str = "") -> dict:
    """A row's final context: its record in the teardown op's stream."""
    (teardown,) = [records for name, records in bucket_streams(s3, root, run_id).items()
                   if name.endswith(".teardown_run")]
    return next(r for r in reversed(teardown) if r.get("row") == row)["context"]


def test_reply_to_dana_on_postgres_with_s3_io_manager_and_artifacts(tmp_path, pg, s3):
    root = s3_project(tmp_path, s3)
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/reply_to_dana.json", "--output-dir", "out"],
        cwd=root, env=environment(root, pg, s3), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    context = json.loads((root / "out" / "context.json").read_text())
    assert context["metadata"]["verifications"]["sent"]["score"] == 1.0
    run_id = context["metadata"]["run_group_id"]

    # the run and its verification materialization are in PostgreSQL
    assert run_status(pg, run_id) == "SUCCESS"
    assert {"verifications/reply_to_dana/sent", "verifications/reply_to_dana/tone",
            "artifacts/reply_to_dana/collect"} <= set(materializations(pg, run_id))

    # the contexts between ops are objects in the bucket (none on local disk), and so are the
    # collected files and the trajectory
    base = f"{PREFIX}/{tmp_path.name}"
    streams = bucket_streams(s3, root, run_id)
    assert {f"reply_to_dana_steps.{step}" for step in ("email", "reply", "sent", "teardown_run")} <= set(streams)
    assert not (root / ".agentenv" / "state" / "runs" / run_id / "context").exists()
    assert final_context(s3, root, run_id)["metadata"]["verifications"]["sent"]["score"] == 1.0
    collected = context["metadata"]["collected_artifacts"]["collect"]["artifacts"]
    assert collected and all(url.startswith(f"s3://{s3.bucket}/{base}/artifacts/") for url in collected.values())
    assert any(k.startswith(f"{base}/objects/") for k in s3.keys(base))
    trajectory = context["prompt_responses"][0]["agent_trajectory_object_url"]
    assert trajectory.startswith(f"s3://{s3.bucket}/{base}/objects/")
    assert leaked_servers(root / ".agentenv" / "state") == []


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of (start, end) spans open at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    open_now = most = 0
    for _, change in edges:  # an end sorts before a start at the same instant
        open_now += change
        most = max(most, open_now)
    return most


def test_the_run_queue_holds_a_task_to_two_runs_and_its_agent_pool_to_its_limit(tmp_path, pg, s3):
    """deploy/dagster.yaml under a real dagster-daemon: three launches of one task run two at
    a time (``agentenv/task_id`` limit 2), and with its agent's pool set to 1 their agent
    steps, 2 s each, take turns across runs."""
    root = s3_project(tmp_path, s3)
    shutil.copy(REPO / "workspace.yaml", root / "workspace.yaml")
    config = root / ".agentenv" / "config.toml"
    script = 'script = "agents/reply_to_dana.replay.json"\n'
    assert script in config.read_text()
    config.write_text(config.read_text().replace(script, script + "delay_seconds = 2\n"))  # the agent answers in 2 s
    env = environment(root, pg, s3)
    pool = "agentenv_agent_claude_code"  # translator.get_pool: the reply step's agent

    def dagster(*args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "dagster", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    run_ids = [str(uuid.uuid4()) for _ in range(3)]
    dagster("instance", "concurrency", "set", pool, "1")
    try:
        for run_id in run_ids:
            dagster("job", "launch", "-w", "workspace.yaml", "-j", "reply_to_dana", "--run-id", run_id)
        assert {run_status(pg, r) for r in run_ids} == {"QUEUED"}  # nothing starts them but the daemon

        with dagster_daemon(root, tmp_path / "daemon.log", env) as daemon:
            deadline = time.monotonic() + 200
            while {run_status(pg, r) for r in run_ids} - {"SUCCESS", "FAILURE", "CANCELED"}:
                alive = daemon.poll() is None and time.monotonic() < deadline
                assert alive, (tmp_path / "daemon.log").read_text()[-3000:]
                time.sleep(1)
    finally:
        dagster("instance", "concurrency", "set", pool, "4")  # the profile's default_limit
    assert [run_status(pg, r) for r in run_ids] == ["SUCCESS"] * 3

    runs = pg.query("SELECT start_time, end_time FROM runs WHERE run_id IN %s", tuple(run_ids))
    assert most_at_once(runs) == 2  # the queue started two, and the third when one ended

    steps = pg.query("""SELECT run_id, dagster_event_type, extract(epoch FROM timestamp) FROM event_logs
                        WHERE run_id IN %s AND step_key = 'reply_to_dana_steps.reply'
                          AND dagster_event_type IN ('STEP_START', 'STEP_SUCCESS')""", tuple(run_ids))
    times = {(run_id, kind): float(at) for run_id, kind, at in steps}
    spans = [(times[r, "STEP_START"], times[r, "STEP_SUCCESS"]) for r in run_ids]
    assert all(end - start >= 2 for start, end in spans), spans
    assert most_at_once(spans) == 1  # the pool's one slot: never two agent steps at once
    assert leaked_servers(root / ".agentenv" / "state") == []


def celery_project(tmp_path, pg, s3, redis_url):
    """A project whose jobs use the Celery executor, with the broker and backend on
    ``redis_url`` and deploy/celery.yaml as its workers' settings; its environment."""
    root = s3_project(tmp_path, s3, extra='\n[dagster]\nexecutor = "celery"\n')
    env = environment(root, pg, s3, AGENTENV_CELERY_BROKER=f"{redis_url}/0", AGENTENV_CELERY_BACKEND=f"{redis_url}/1")
    shutil.copy(REPO / "deploy" / "celery.yaml", root / "celery.yaml")
    return root, env


@pytest.fixture
def celery_worker(tmp_path, pg, s3, redis_url):
    """A Celery project and a `dagster-celery` worker for it on loopback; stopped afterwards
    (the celery process first, then the dagster-celery parent)."""
    root, env = celery_project(tmp_path, pg, s3, redis_url)
    with services.celery_worker(root, env, tmp_path / "worker.log", name=f"agentenv-test-{os.getpid()}"):
        yield root, env


def test_reply_to_dana_under_the_celery_executor(celery_worker, pg, s3):
    root, env = celery_worker
    done = subprocess.run(
        [sys.executable, "-m", "dagster", "job", "execute", "-f", "definitions.py", "-j", "reply_to_dana"],
        cwd=root, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_id,) = bucket_run_ids(s3, root)
    assert run_status(pg, run_id) == "SUCCESS"
    # every step ran in the celery worker, its events went to PostgreSQL
    delegated = pg.query("SELECT step_key FROM event_logs WHERE run_id = %s AND event LIKE %s", run_id,
                         "%in celery worker%")
    assert {"email", "reply", "sent", "teardown_run"} <= {key.rsplit(".", 1)[-1] for (key,) in delegated}
    assert {"verifications/reply_to_dana/sent", "artifacts/reply_to_dana/collect"} <= set(materializations(pg, run_id))
    assert final_context(s3, root, run_id)["metadata"]["verifications"]["sent"]["score"] == 1.0
    assert leaked_servers(root / ".agentenv" / "state") == []
