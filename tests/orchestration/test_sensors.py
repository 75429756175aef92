"""Nothing leaks on failed or cancelled runs: the teardown sensors end what a run left running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.resources import RESOURCE_KEY, AgentEnvResource
from agentenv_dagster.orchestration.review_tags import REVIEW_TAGS_SENSOR
from agentenv_dagster.orchestration.sensors import (
    CANCELED_RUNS_SENSOR, FAILED_RUNS_SENSOR, REAPER_SENSOR, RETRY_SENSOR, TAG_TORN_DOWN, TASK_FILES_SENSOR, end_run_deployments,
    teardown_sensors,
)
from agentenv_dagster.orchestration.staleness import STALE_SCORES_SENSOR
from agentenv_dagster.runtime.local import Ledger, LocalProvider
from agentenv_dagster.runtime.processes import is_running
from projects import REPO, leaked_servers, make_project, servers_left_after_their_owner

FAILED, CANCELED = teardown_sensors()[:2]


def resources(project) -> dict:
    return {RESOURCE_KEY: AgentEnvResource(project_dir=str(project))}


def engine_messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [
        e.message for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        if e.message.startswith("agentenv:")
    ]


def deploy_for_run(project, run_id: str) -> dict[str, int]:
    """A real env and a real agent (in the run's agent host) recorded in the run's ledger, as
    a run deploys them; {instance id: pid} of the server processes."""
    config = load_config(project)
    provider = LocalProvider(config, config.state_dir / "runs" / run_id)
    provider.deploy_env("email", step_id="email", ttl_seconds=120)
    provider.deploy_agent("claude-code", agent_name="assistant", ttl_seconds=120)
    return {iid: e["pid"] for iid, e in provider.ledger.entries().items() if e.get("pid")}


def sensor_tick(sensor, instance, project, cursor=None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources(project))
    return sensor.evaluate_tick(context)


def test_the_teardown_sensors_run_by_default_and_the_file_sensor_does_not(project):
    defs = build_definitions(project / "tasks")
    status = {s.name: s.default_status for s in defs.sensors}
    assert status == {
        FAILED_RUNS_SENSOR: dg.DefaultSensorStatus.RUNNING,
        CANCELED_RUNS_SENSOR: dg.DefaultSensorStatus.RUNNING,
        REAPER_SENSOR: dg.DefaultSensorStatus.RUNNING,  # runs whose process died: their deployments ended
        RETRY_SENSOR: dg.DefaultSensorStatus.RUNNING,  # retry_config spans re-executed in child runs
        TASK_FILES_SENSOR: dg.DefaultSensorStatus.STOPPED,
        STALE_SCORES_SENSOR: dg.DefaultSensorStatus.STOPPED,  # stale scores re-run once turned on
        REVIEW_TAGS_SENSOR: dg.DefaultSensorStatus.RUNNING,  # a review decided by a run tag
        "agentenv_suites": dg.DefaultSensorStatus.RUNNING,  # tasks/triage_tickets.yaml's suite kept current
    }
    assert isinstance(defs.get_repository_def().get_sensor_def(FAILED_RUNS_SENSOR), dg.RunStatusSensorDefinition)


def test_a_failed_run_s_servers_are_ended_by_the_failure_sensor_tick(project):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job, tags=job.tags)
        try:
            started = sensor_tick(FAILED, instance, project)  # the first tick only sets the cursor
            servers = deploy_for_run(project, run.run_id)
            assert len(servers) == 2 and all(is_running(pid) for pid in servers.values())
            instance.report_run_failed(run)
            tick = sensor_tick(FAILED, instance, project, started.cursor)
            assert [r.dagster_run.run_id for r in tick.dagster_run_reactions] == [run.run_id]
            assert not any(is_running(pid) for pid in servers.values())
            ended = sorted(Ledger.of_run(project / ".agentenv/state/runs" / run.run_id).entries())
            assert len(ended) == 3  # the env, the agent host and the agent in it
            assert instance.get_run_by_id(run.run_id).tags[TAG_TORN_DOWN] == "3"
            (message,) = engine_messages(instance, run.run_id)
            assert message == f"agentenv: the failed run left 3 deployment(s) running; ended: {', '.join(ended)}"
            # a later tick does not see the run again
            again = sensor_tick(FAILED, instance, project, tick.cursor)
            assert again.dagster_run_reactions == [] and len(engine_messages(instance, run.run_id)) == 1
        finally:
            Ledger.of_run(project / ".agentenv/state/runs" / run.run_id).close()


def test_a_cancelled_run_s_servers_are_ended_by_the_cancel_sensor(project):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job, tags=job.tags)
        try:
            servers = deploy_for_run(project, run.run_id)
            instance.report_run_canceled(run)
            canceled = instance.get_run_by_id(run.run_id)
            (event,) = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_CANCELED)
            context = dg.build_run_status_sensor_context(
                sensor_name=CANCELED_RUNS_SENSOR, dagster_event=event.dagster_event, dagster_instance=instance,
                dagster_run=canceled, resources=resources(project),
            )
            CANCELED(context)
            assert not any(is_running(pid) for pid in servers.values())
            (message,) = engine_messages(instance, run.run_id)
            assert message.startswith("agentenv: the canceled run left 3 deployment(s) running; ended: agent-host-")
            # the ledger is closed: the run cannot deploy anything more
            with pytest.raises(RuntimeError, match="run is tearing down"):
                deploy_for_run(project, run.run_id)
        finally:
            Ledger.of_run(project / ".agentenv/state/runs" / run.run_id).close()


def test_a_run_that_never_ran_in_this_project_is_left_alone(project, tmp_path):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(job, tags=job.tags)
        instance.report_run_failed(run)
        failed = instance.get_run_by_id(run.run_id)
        assert end_run_deployments(instance, failed, AgentEnvResource(project_dir=str(project))) is None
        assert not (project / ".agentenv/state/runs" / run.run_id).exists()
        assert TAG_TORN_DOWN not in instance.get_run_by_id(run.run_id).tags


def test_the_run_s_own_project_dir_from_its_run_config_is_honoured(project, tmp_path):
    other = make_project(tmp_path / "other")
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    with dg.instance_for_test() as instance:
        run = instance.create_run_for_job(
            job, tags=job.tags, run_config={"resources": {RESOURCE_KEY: {"config": {"project_dir": str(other)}}}},
        )
        try:
            servers = deploy_for_run(other, run.run_id)
            instance.report_run_failed(run)
            ended = end_run_deployments(instance, instance.get_run_by_id(run.run_id), AgentEnvResource(project_dir=str(project)))
            assert len(ended) == 3 and not any(is_running(pid) for pid in servers.values())
        finally:
            Ledger.of_run(other / ".agentenv/state/runs" / run.run_id).close()


# -- real runs of the `dagster` CLI, stopped mid-step ------------------------------------------

SLEEP_STEP = textwrap.dedent('''
    import asyncio, pathlib
    from agentenv_dagster.steps.base import TaskStep

    class SleepStep(TaskStep):
        """Says it started (a file), then sleeps: a run stopped here has live servers."""
        type_name = "sleep"
        seconds: float = 1.0

        async def execute(self, ctx, rt):
            pathlib.Path("sleeping").write_text(self.id)
            await asyncio.sleep(self.seconds)
''')


@pytest.fixture
def long_project(tmp_path, monkeypatch):
    """A task that deploys an env and an agent, then sleeps two minutes; DAGSTER_HOME set."""
    root = make_project(tmp_path / "p", extra_config='[task_steps]\nimpls = ["slow_steps:SleepStep"]\n', tasks={
        "long.json": [
            {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
            {"id": "assistant", "type": "deploy_agent", "env_ids": ["email"], "a2a_agent_id": "claude-code",
             "agent_name": "assistant"},
            {"id": "wait", "type": "sleep", "seconds": 120},
        ]})
    (root / "slow_steps.py").write_text(SLEEP_STEP)
    shutil.copy(REPO / "definitions.py", root / "definitions.py")
    (root / ".dagster_home").mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(root / ".dagster_home"))
    yield root
    for run_dir in (root / ".agentenv/state/runs").glob("*"):  # whatever a failed assertion left
        Ledger.of_run(run_dir).close()


def start_run_until_mid_step(project) -> subprocess.Popen:
    """`dagster job execute` in its own process group, once its sleep step has started."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "job", "execute", "-f", "definitions.py", "-j", "long"],
        cwd=project, env={**os.environ, "PYTHONPATH": str(project)}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (project / "sleeping").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"the run did not reach its sleep step (exit {proc.returncode})")
        time.sleep(0.1)
    return proc


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.mark.slow
def test_a_run_cancelled_mid_step_leaves_no_server(long_project):
    state = long_project / ".agentenv" / "state"
    with dg.DagsterInstance.get() as instance:
        proc = start_run_until_mid_step(long_project)
        try:
            started = sensor_tick(CANCELED, instance, long_project)
            assert len(leaked_servers(state)) == 2  # the env and the agent host, alive mid-step
            (run,) = instance.get_runs()
            # what "Terminate" in the UI does: ask for cancellation, then interrupt the worker
            instance.report_run_canceling(run)
            os.kill(proc.pid, signal.SIGINT)
            proc.wait(60)
        finally:
            stop(proc)
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.CANCELED
        assert servers_left_after_their_owner(state) == []
        tick = sensor_tick(CANCELED, instance, long_project, started.cursor)
        assert [r.dagster_run.run_id for r in tick.dagster_run_reactions] == [run.run_id]
        assert engine_messages(instance, run.run_id) == ["agentenv: the canceled run left nothing running"]


@pytest.mark.slow
def test_a_run_whose_worker_was_killed_is_torn_down_by_the_failure_sensor(long_project):
    state = long_project / ".agentenv" / "state"
    with dg.DagsterInstance.get() as instance:
        proc = start_run_until_mid_step(long_project)
        started = sensor_tick(FAILED, instance, long_project)
        assert len(leaked_servers(state)) == 2  # the env and the agent host, alive mid-step
        stop(proc)  # SIGKILL to the worker and its step processes: nothing of it can clean up
        # the servers live in their own sessions, but watch the run's worker and end with it
        assert servers_left_after_their_owner(state) == []
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.STARTED
        instance.report_run_failed(run, "run worker died")  # what Dagster's run monitoring does
        tick = sensor_tick(FAILED, instance, long_project, started.cursor)
        assert [r.dagster_run.run_id for r in tick.dagster_run_reactions] == [run.run_id]
        (message,) = engine_messages(instance, run.run_id)
        assert message == "agentenv: the failed run left nothing running"  # its ledger is closed all the same
