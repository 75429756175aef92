"""The project's run launcher (``ForkingRunLauncher``) under `dagster dev`: a launch from the
UI runs in a worker forked from one warm process, Terminate stops it, and nothing it started
outlives `dagster dev`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.orchestration.run_launcher import ForkingRunLauncher
from agentenv_dagster.runtime.processes import is_running
from projects import REPO, make_project, servers_left_after_their_owner
from test_dagster_dev import dagster_dev, graphql, launch_and_wait, wait_until

SLOW_TASK = """task_id: slow-reply
description: an agent that takes a while to answer
initial_prompt: Say hello.
agent: {type: replay, delay_seconds: 120, episodes: [{match: ".", reply: hello}]}
sandbox: {driver: tempdir, python: null}
success_criteria:
  - {type: file_exists, path: nothing.txt, description: never reached}
"""
TERMINATE = """mutation ($id: String!) { terminateRun(runId: $id) { __typename } }"""


@dg.op
def nothing() -> None:
    pass


@dg.job
def quiet():
    nothing()


def a_run_whose_worker_is(instance: dg.DagsterInstance, pid: int) -> str:
    """A run of ``quiet`` on this Python whose worker has written that it started as ``pid``."""
    run = instance.create_run_for_job(quiet, job_code_origin=dg.reconstructable(quiet).get_python_origin())
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run)
    return run.run_id


def test_terminate_marks_a_live_worker_s_run_canceling_and_says_when_the_worker_is_gone():
    ended = subprocess.Popen(["true"])
    ended.wait()
    with dg.instance_for_test() as instance:
        launcher = ForkingRunLauncher()
        launcher.register_instance(instance)
        live = a_run_whose_worker_is(instance, os.getpid())
        assert launcher.terminate(live) is True  # the worker watches its run and interrupts itself
        assert instance.get_run_by_id(live).status == dg.DagsterRunStatus.CANCELING
        gone = a_run_whose_worker_is(instance, ended.pid)
        assert launcher.terminate(gone) is False  # nothing would ever stop it: the UI offers to fail it
        assert instance.get_run_by_id(gone).status == dg.DagsterRunStatus.NOT_STARTED


def warm_processes() -> set[int]:
    """Every process on the machine that is a run launcher's warm process."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agentenv_dagster.orchestration.run_launcher" in command[1:3]:
                found.add(int(entry.name))
    return found


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def worker_of(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the run's worker, from its "Started process for run" event."""
    for record in instance.all_logs(run_id):
        if found := re.match(r"Started process for run \(pid: (\d+)\)", record.message or ""):
            return int(found[1])
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_ui_launches_fork_from_one_warm_process_and_terminate_stops_the_run(tmp_path):
    project = make_project(tmp_path / "p", tasks={
        "reply_to_dana.json": (REPO / "tasks" / "reply_to_dana.json").read_text(), "slow.yaml": SLOW_TASK})
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(REPO / name, project / name)
    home = project / ".dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    before = warm_processes()
    with dagster_dev(project) as (port, _dev), dg.DagsterInstance.from_config(str(home)) as instance:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        first = launch_and_wait(client, "reply_to_dana", {})
        (warm,) = warm_processes() - before
        second = launch_and_wait(client, "reply_to_dana", {})
        assert warm_processes() - before == {warm}  # one warm process serves every launch
        assert worker_of(instance, first) != worker_of(instance, second)

        slow = client.submit_job_execution("slow_reply", repository_location_name="agentenv_tasks", run_config={})
        worker = wait_until(lambda: worker_of(instance, slow), 120, "the slow run's worker")
        assert parent_of(worker) == warm
        wait_until(lambda: client.get_run_status(slow).value == "STARTED", 60, "the slow run to start")
        assert graphql(port, TERMINATE, {"id": slow})["terminateRun"]["__typename"] == "TerminateRunSuccess"
        wait_until(lambda: client.get_run_status(slow).value == "CANCELED", 60, "the run to be cancelled")
        wait_until(lambda: not is_running(worker), 30, "the worker to exit")
    assert not is_running(warm), "the warm process outlived dagster dev"
    assert servers_left_after_their_owner(project / ".agentenv" / "state") == []
