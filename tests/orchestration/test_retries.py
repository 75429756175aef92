"""retry_config at run time: a span retry is a child run re-executing the span from the failed
run's stored outputs (from the CLI, and from the run-failure sensor), a self-retry is the op's
RetryPolicy; both record agent-env's ``metadata.retry_resets`` marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import httpx
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.dagster_internals import IN_PROCESS_RUN_LAUNCHER, workspace_in_this_process
from agentenv_dagster.orchestration.definitions import build_job
from agentenv_dagster.orchestration.rows import task_graph_of
from agentenv_dagster.orchestration.execute import execute_plan
from agentenv_dagster.orchestration.io_manager import final_context
from agentenv_dagster.orchestration.resources import RESOURCE_KEY, AgentEnvResource
from agentenv_dagster.orchestration.retries import (
    TAG_RETRIED_BY, TAG_RETRY_ATTEMPT, TAG_RETRY_FROM, TAG_RETRY_OF, TAG_RETRY_STEP, retry_span,
)
from agentenv_dagster.orchestration.sensors import RETRY_SENSOR, retry_sensor
from agentenv_dagster.runtime.local import Ledger
from projects import leaked_servers, make_project, node_of

STEPS = textwrap.dedent('''
    from pathlib import Path
    from agentenv_dagster.runtime.dataplane import env_base_url
    from agentenv_dagster.steps.base import ENV, TaskStep

    def bump(path):
        n = int(Path(path).read_text()) + 1 if Path(path).exists() else 1
        Path(path).write_text(str(n))
        return n

    class CountStep(TaskStep):
        """Counts its runs in the context (what a retry rolls back) and in a file (what it cannot)."""
        type_name = "count"
        counter: str

        async def execute(self, ctx, rt):
            n = bump(self.counter)
            ran = ctx.metadata_map("ran")
            ran[self.id] = ran.get(self.id, 0) + 1
            ctx.metadata_list("notes").append(f"{self.id}#{n}")

    class FlakyStep(TaskStep):
        """Fails its first `failures` runs; with `env_id`, first checks that the env still serves."""
        type_name = "flaky"
        reads = {"env_id": ENV}
        counter: str
        failures: int = 1
        env_id: str | None = None

        async def execute(self, ctx, rt):
            n = bump(self.counter)
            ctx.metadata_list("notes").append(f"{self.id}#{n}")
            if self.env_id:
                card = await rt.dataplane.card(env_base_url(ctx.find_env(self.env_id).mcp_url))
                ctx.metadata_map("env_cards")[str(n)] = card.get("name")
            if n <= self.failures:
                raise RuntimeError(f"flaky failure {n}")
''')
IMPLS = '[task_steps]\nimpls = ["retry_steps:CountStep", "retry_steps:FlakyStep"]\n'


def chain_task(tmp: Path, *, failures: int, max_retries: int) -> list[dict]:
    """a -> b -> c; c fails its first `failures` runs and retries from b."""
    return [
        {"id": "a", "type": "count", "counter": str(tmp / "a"), "depends_on": []},
        {"id": "b", "type": "count", "counter": str(tmp / "b")},
        {"id": "c", "type": "flaky", "counter": str(tmp / "c"), "failures": failures,
         "retry_config": {"retry_from_step_id": "b", "max_retries": max_retries}},
    ]


def make(tmp_path: Path, steps: list[dict]) -> Path:
    project = make_project(tmp_path / "p", extra_config=IMPLS, tasks={"t.json": steps})
    (project / "retry_steps.py").write_text(STEPS)
    return project


def steps_started(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [node_of(e.step_key) for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)]


def run_cli_plan(project: Path, instance: dg.DagsterInstance):
    config = load_config(project)
    return execute_plan(load_plan(project / "tasks" / "t.json", config), config, instance=instance,
                        output_dir=project / "out")


# -- the span ---------------------------------------------------------------------------------

def test_the_span_adds_the_deployers_of_what_it_uses_and_everything_downstream(tmp_path):
    project = make(tmp_path, [
        {"id": "env", "type": "deploy_env", "env_id": "email", "depends_on": []},
        {"id": "a", "type": "count", "counter": "x", "depends_on": []},
        {"id": "b", "type": "count", "counter": "x", "depends_on": ["a"]},
        {"id": "c", "type": "flaky", "counter": "x", "depends_on": ["b"],
         "retry_config": {"retry_from_step_id": "b"}},
        {"id": "d", "type": "flaky", "counter": "x", "env_id": "email", "depends_on": ["a", "env"],
         "retry_config": {"go_to_step_id": "a"}},
    ])
    plan = load_plan(project / "tasks" / "t.json", load_config(project))
    assert retry_span(plan, "c") == ["b", "c"]
    # Dagster's `a*` (d, and b and c downstream of a), and the env d uses: the failed run ended it
    assert retry_span(plan, "d") == ["env", "a", "b", "c", "d"]
    tags = {n.name: n.tags for n in task_graph_of(build_job(plan, config=load_config(project))).nodes}
    assert json.loads(tags["d"]["agentenv/retry_span"]) == {
        "step_id": "d", "retry_from_step_id": "a", "max_retries": 1,
        "replay": [["env", "env"], ["a", "a"], ["b", "b"], ["c", "c"], ["d", "d"]],
    }
    assert "agentenv/retry_span" not in tags["b"]


# -- through the CLI --------------------------------------------------------------------------

def test_a_span_retry_re_executes_the_span_in_a_child_run_from_the_stored_outputs(tmp_path):
    project = make(tmp_path, chain_task(tmp_path, failures=1, max_retries=2))
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
        assert result.success, result.summary()
        (parent_id,) = result.retried_runs
        child = instance.get_run_by_id(result.run_id)
        assert child.parent_run_id == parent_id and child.root_run_id == parent_id
        assert {k: child.tags[k] for k in (TAG_RETRY_OF, TAG_RETRY_STEP, TAG_RETRY_FROM, TAG_RETRY_ATTEMPT)} == {
            TAG_RETRY_OF: parent_id, TAG_RETRY_STEP: "c", TAG_RETRY_FROM: "b", TAG_RETRY_ATTEMPT: "2"}
        assert instance.get_run_by_id(parent_id).tags[TAG_RETRIED_BY] == result.run_id
        assert steps_started(instance, parent_id) == ["a", "b", "c"]
        assert steps_started(instance, result.run_id) == ["b", "c", "teardown_run"]  # `a` from the parent
        retry_note = [e.message for e in instance.all_logs(parent_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
                      if e.message.startswith("agentenv:")]
        assert retry_note == [f"agentenv: step 'c' failed; retrying from 'b' (attempt 2) in run {result.run_id}: b, c"]

    final = result.context
    assert final.metadata["ran"] == {"a": 1, "b": 1}  # the failed attempt's `b` is rolled back
    assert final.metadata["notes"] == ["a#1", "b#2", "c#2"]
    (reset,) = final.metadata["retry_resets"]
    assert reset.pop("at_utc")
    assert reset == {
        "attempt": 2, "step_id": "c", "retry_from_step_id": "b", "replayed": ["b", "c"],
        "rolled_back_sandboxes": {"deployed_envs": [], "deployed_agents": [], "deployed_sandboxes": []},
        "parent_run_id": parent_id,
    }
    (failure,) = final.metadata["failed_steps"]
    assert failure["step_id"] == "c" and failure["error"] == "flaky failure 1"
    assert failure["is_fatal"] is True and failure["retried"] is True
    assert json.loads((project / "out" / "context.json").read_text())["metadata"]["retry_resets"][0]["attempt"] == 2
    # the same task instance: the retry's contexts keep the root run's ids
    assert final.instance_id == f"t-{parent_id[:8]}" and final.metadata["run_group_id"] == parent_id


def test_max_retries_bounds_the_children_counted_along_the_parent_chain(tmp_path):
    project = make(tmp_path, chain_task(tmp_path, failures=10, max_retries=2))
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
        assert not result.success
        assert len(result.retried_runs) == 2  # 3 attempts: the run and 2 retries
        last = instance.get_run_by_id(result.run_id)
        assert last.tags[TAG_RETRY_ATTEMPT] == "3" and last.parent_run_id == result.retried_runs[1]
        assert last.root_run_id == result.retried_runs[0]
        assert TAG_RETRIED_BY not in last.tags
    assert (tmp_path / "c").read_text() == "3"
    assert [(r["attempt"], r["replayed"]) for r in result.context.metadata["retry_resets"]] == [
        (2, ["b", "c"]), (3, ["b", "c"])]
    failures = result.context.metadata["failed_steps"]
    assert [(f["error"], f.get("retried", False)) for f in failures] == [
        ("flaky failure 1", True), ("flaky failure 2", True), ("flaky failure 3", False)]
    assert "FAILURE (retried)" in result.summary()


def test_max_retries_zero_and_a_second_failed_step_do_not_retry(tmp_path):
    steps = chain_task(tmp_path, failures=1, max_retries=0)
    project = make(tmp_path, steps)
    with dg.instance_for_test() as instance:
        assert run_cli_plan(project, instance).retried_runs == []
    # two fatal failures in one run (c, and a sibling d): agent-env fails the task
    steps = chain_task(tmp_path / "second", failures=1, max_retries=1)
    steps.append({"id": "d", "type": "flaky", "counter": str(tmp_path / "d"), "depends_on": ["b"]})
    (tmp_path / "second").mkdir()
    (project / "tasks" / "t.json").write_text(json.dumps(steps))
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
        assert not result.success and result.retried_runs == []


@pytest.mark.slow
def test_a_span_that_uses_an_env_deploys_it_again_and_the_real_cli_exits_0(tmp_path):
    project = make(tmp_path, [
        {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
        {"id": "a", "type": "count", "counter": str(tmp_path / "a")},
        {"id": "b", "type": "flaky", "counter": str(tmp_path / "b"), "env_id": "email",
         "retry_config": {"retry_from_step_id": "a"}},
    ])
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/t.json", "--output-dir", "out"], cwd=project,
        env={**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PYTHONPATH": str(project)},
        capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILURE (retried)" in done.stdout and "SUCCESS" in done.stdout
    final = json.loads((project / "out" / "context.json").read_text())
    assert final["metadata"]["env_cards"] == {"2": "email"}  # the re-deployed env served the retry
    (reset,) = final["metadata"]["retry_resets"]
    assert reset["replayed"] == ["email", "a", "b"]
    (env,) = final["deployed_envs"]  # the retry's deployment only
    rolled_back = reset["rolled_back_sandboxes"]["deployed_envs"]
    assert len(rolled_back) == 1 and rolled_back[0]["sandbox_id"] != env["instance_id"]
    assert leaked_servers(project / ".agentenv" / "state") == []


# -- self-retry: the op's RetryPolicy ------------------------------------------------------------

@pytest.mark.slow
def test_a_self_retry_reruns_the_op_in_the_same_run_with_its_deployments_up(tmp_path):
    project = make(tmp_path, [
        {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
        {"id": "flaky", "type": "flaky", "counter": str(tmp_path / "f"), "env_id": "email",
         "retry_config": {"retry_from_step_id": "flaky", "max_retries": 2}},
    ])
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
        assert result.success and result.retried_runs == []
        events = {e.dagster_event.event_type for e in instance.all_logs(result.run_id) if e.dagster_event}
        assert dg.DagsterEventType.STEP_UP_FOR_RETRY in events and dg.DagsterEventType.STEP_RESTARTED in events
    final = result.context
    assert final.metadata["env_cards"] == {"2": "email"}  # the env of the first attempt still served
    assert final.metadata["notes"] == ["flaky#2"]  # the failed attempt's writes are rolled back
    (reset,) = final.metadata["retry_resets"]
    assert reset.pop("at_utc")
    assert reset == {"attempt": 2, "step_id": "flaky", "retry_from_step_id": "flaky", "replayed": ["flaky"],
                     "rolled_back_sandboxes": {"deployed_envs": [], "deployed_agents": [], "deployed_sandboxes": []}}
    (failure,) = final.metadata["failed_steps"]
    assert failure["error"] == "flaky failure 1" and failure["retried"] is True
    assert leaked_servers(project / ".agentenv" / "state") == []


def test_a_self_retry_stops_after_max_retries_with_the_original_error(tmp_path):
    project = make(tmp_path, [
        {"id": "flaky", "type": "flaky", "counter": str(tmp_path / "f"), "failures": 5, "depends_on": [],
         "retry_config": {"retry_from_step_id": "flaky", "max_retries": 1}},
    ])
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
        assert not result.success and result.retried_runs == []  # no child run for a self-retry
        (failure,) = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        assert failure.dagster_event.step_failure_data.error.message.strip() == "Exceeded max_retries of 1"
    assert (tmp_path / "f").read_text() == "2"  # max_retries=1: two attempts
    assert [r["attempt"] for r in result.context.metadata["retry_resets"]] == [2]
    assert [(f["error"], f.get("retried", False)) for f in result.context.metadata["failed_steps"]] == [
        ("flaky failure 1", True), ("flaky failure 2", False)]  # the last attempt's error is the task's


def test_a_tolerated_step_spends_its_retries_before_its_failure_is_tolerated(tmp_path):
    project = make(tmp_path, [
        {"id": "flaky", "type": "flaky", "counter": str(tmp_path / "f"), "failures": 5, "depends_on": [],
         "fail_task_on_error": False, "retry_config": {"retry_from_step_id": "flaky", "max_retries": 1}},
        {"id": "after", "type": "count", "counter": str(tmp_path / "after")},
    ])
    with dg.instance_for_test() as instance:
        result = run_cli_plan(project, instance)
    assert result.success and (tmp_path / "f").read_text() == "2"  # retried once, then tolerated
    assert result.context.metadata["ran"] == {"after": 1}
    assert [(f["error"], f["is_fatal"], f.get("retried", False)) for f in result.context.metadata["failed_steps"]] == [
        ("flaky failure 1", True, True), ("flaky failure 2", False, False)]


# -- through the run-failure sensor -----------------------------------------------------------------

DEFINITIONS = "from pathlib import Path\nfrom agentenv_dagster import build_definitions\n" \
              "defs = build_definitions(Path(__file__).parent / 'tasks')\n"


@pytest.mark.slow
def test_the_failure_sensor_queues_one_child_run_that_re_executes_the_span(tmp_path):
    project = make(tmp_path, chain_task(tmp_path, failures=1, max_retries=1))
    (project / "definitions.py").write_text(DEFINITIONS)
    defs = build_definitions(project / "tasks")
    assert defs.get_repository_def().get_sensor_def(RETRY_SENSOR).default_status == dg.DefaultSensorStatus.RUNNING
    with dg.instance_for_test(overrides={"run_launcher": IN_PROCESS_RUN_LAUNCHER}) as instance, \
            workspace_in_this_process(instance, str(project / "definitions.py"), "defs", str(project)) as workspace:
        location = workspace.get_code_location(workspace.code_location_names[0])
        remote = next(iter(location.get_repositories().values())).get_full_job("t")
        job = defs.resolve_job_def("t")
        parent = instance.create_run_for_job(job, tags=job.tags, remote_job_origin=remote.get_remote_origin(),
                                             job_code_origin=remote.get_python_origin())
        instance.submit_run(parent.run_id, workspace)
        instance.launch_run(parent.run_id, workspace)  # what the queue's daemon does: here, in this process
        failed = instance.get_run_by_id(parent.run_id)
        assert failed.status == dg.DagsterRunStatus.FAILURE

        def tick() -> None:
            (event,) = instance.all_logs(parent.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
            context = dg.build_run_status_sensor_context(
                sensor_name=RETRY_SENSOR, dagster_event=event.dagster_event, dagster_instance=instance,
                dagster_run=failed, resources={RESOURCE_KEY: AgentEnvResource(project_dir=str(project))},
                repository_def=defs.get_repository_def(),
            ).for_run_failure()
            retry_sensor()(context)

        tick()
        tick()  # the same failure again (a sensor restart): still one child, as a run key would
        (child_id,) = instance.get_run_ids(dg.RunsFilter(tags={TAG_RETRY_OF: parent.run_id}))
        child = instance.get_run_by_id(child_id)
        assert child.status == dg.DagsterRunStatus.QUEUED
        assert child.parent_run_id == parent.run_id and child.root_run_id == parent.run_id
        assert set(child.step_keys_to_execute) == {"t_steps.b", "t_steps.c", "t_steps.teardown_run"}
        assert child.remote_job_origin == failed.remote_job_origin
        assert (child.tags["dagster/sensor_name"], child.tags["dagster/run_key"]) == (RETRY_SENSOR, parent.run_id)

        instance.launch_run(child_id, workspace)
        assert instance.get_run_by_id(child_id).status == dg.DagsterRunStatus.SUCCESS
        assert steps_started(instance, child_id) == ["b", "c", "teardown_run"]

    final = final_context(project / ".agentenv" / "state" / "runs", child_id)
    assert final.metadata["ran"] == {"a": 1, "b": 1} and final.metadata["notes"] == ["a#1", "b#2", "c#2"]
    (reset,) = final.metadata["retry_resets"]
    assert (reset["attempt"], reset["step_id"], reset["replayed"], reset["parent_run_id"]) == (
        2, "c", ["b", "c"], parent.run_id)
    assert [f.get("retried") for f in final.metadata["failed_steps"]] == [True]
    for run_dir in (project / ".agentenv/state/runs").glob("*"):
        Ledger.of_run(run_dir).close()


SENSOR_TICKS = """{ sensorOrError(sensorSelector: {repositoryLocationName: "agentenv_tasks",
  repositoryName: "__repository__", sensorName: "%s"}) { ... on Sensor { sensorState { ticks(limit: 1) { status } } } } }"""


@pytest.mark.slow
def test_under_dagster_dev_the_sensor_s_child_run_is_launched_by_the_daemon_and_succeeds(tmp_path):
    from dagster_graphql import DagsterGraphQLClient

    from agentenv_dagster.orchestration.execute import dagster_yaml
    from agentenv_dagster.runtime.processes import is_running, terminate
    from projects import REPO
    from test_dagster_dev import free_port, graphql, wait_until

    project = make(tmp_path, chain_task(tmp_path, failures=1, max_retries=1))
    for name in ("definitions.py", "workspace.yaml"):
        (project / name).write_text((REPO / name).read_text())
    home = project / ".dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    port = free_port()
    dev = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)], cwd=project,
        env={**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(project)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)

        def sensor_ticked():
            try:
                state = graphql(port, SENSOR_TICKS % RETRY_SENSOR)["sensorOrError"]["sensorState"]
            except (httpx.HTTPError, KeyError):  # the webserver or its code location is not up yet
                return False
            return bool(state["ticks"])

        wait_until(sensor_ticked, 180, "the retry sensor's first tick")  # it only sets its cursor
        parent_id = client.submit_job_execution("t", repository_location_name="agentenv_tasks")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            def child():
                runs = instance.get_runs(dg.RunsFilter(tags={TAG_RETRY_OF: parent_id}))
                return runs and runs[0].is_finished and runs[0]

            retry = wait_until(child, 300, "the retry run")
            assert retry.status == dg.DagsterRunStatus.SUCCESS
            assert instance.get_run_by_id(parent_id).status == dg.DagsterRunStatus.FAILURE
            assert retry.parent_run_id == parent_id and steps_started(instance, retry.run_id) == ["b", "c", "teardown_run"]
        final = final_context(project / ".agentenv" / "state" / "runs", retry.run_id)
        assert final.metadata["notes"] == ["a#1", "b#2", "c#2"]
        assert [r["replayed"] for r in final.metadata["retry_resets"]] == [["b", "c"]]
    finally:
        terminate(dev.pid, grace_seconds=20)
        dev.wait(timeout=30)
    wait_until(lambda: not is_running(dev.pid), 30, "dagster dev to stop")
