"""The task-file sensor: a new or changed task document is launched once, run key = task id +
version + content hash; the cursor keeps a restart from launching it again."""

from __future__ import annotations

import json
import os

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.orchestration.sensors import TASK_FILES_SENSOR
from agentenv_dagster.orchestration.translator import TAG_CONTENT_HASH, TAG_TASK_ID
from projects import dagster_daemon, dagster_project, graph_config, leaked_servers, make_project, stream_rows

NOTE_STEP = '''
from agentenv_dagster.steps.base import TaskStep

class NoteStep(TaskStep):
    """Writes its text into the context: what a run ran is visible in its final context."""
    type_name = "note"
    text: str

    async def execute(self, ctx, rt):
        ctx.metadata_map("notes")[self.id] = self.text
'''


def note_task(*texts: str) -> list[dict]:
    return [{"id": f"n{i}", "type": "note", "text": text, "depends_on": []} for i, text in enumerate(texts)]


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", extra_config='[task_steps]\nimpls = ["note_steps:NoteStep"]\n', tasks={
        "alpha.json": note_task("a"), "beta.json": note_task("b"),
    })
    (root / "note_steps.py").write_text(NOTE_STEP)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def file_sensor(defs: dg.Definitions) -> dg.SensorDefinition:
    """The sensor as the code location serves it (its jobs bound to the resources)."""
    return defs.get_repository_def().get_sensor_def(TASK_FILES_SENSOR)


def tick(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None):
    return file_sensor(defs).evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))


def run_key(defs: dg.Definitions, job: str) -> str:
    tags = defs.resolve_job_def(job).tags
    return f"{tags[TAG_TASK_ID]}:unversioned:{tags[TAG_CONTENT_HASH]}"


def test_new_tasks_launch_once_and_a_changed_file_launches_again(project):
    defs = build_definitions(project / "tasks")
    assert file_sensor(defs).default_status == dg.DefaultSensorStatus.STOPPED
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, None)
        assert {(r.job_name, r.run_key) for r in first.run_requests} == {
            ("alpha", run_key(defs, "alpha")), ("beta", run_key(defs, "beta")),
        }
        assert len(run_key(defs, "alpha").split(":")[2]) == 16
        second = tick(defs, instance, first.cursor)
        assert second.run_requests == [] and second.skip_message == "no new or changed task"

        # a restart (a fresh load of the code location) with the persisted cursor: nothing
        restarted = tick(build_definitions(project / "tasks"), instance, second.cursor)
        assert restarted.run_requests == []

        (project / "tasks" / "alpha.json").write_text(json.dumps(note_task("a, edited")))
        third = tick(defs, instance, second.cursor)
        (request,) = third.run_requests
        assert request.job_name == "alpha" and request.run_key != run_key(defs, "alpha")
        assert request.run_key.startswith("alpha:unversioned:") and request.tags[TAG_CONTENT_HASH] in request.run_key
        assert tick(defs, instance, third.cursor).run_requests == []
        # a reload of the code location does not launch the edited task a second time
        assert tick(build_definitions(project / "tasks"), instance, third.cursor).run_requests == []

        # the request runs the file as it is now, though the job was loaded before the edit
        result = defs.resolve_job_def("alpha").execute_in_process(
            instance=instance, run_config=request.run_config, tags=request.tags,
        )
        assert result.success
        final = stream_rows(project / ".agentenv" / "state" / "runs" / result.run_id, "teardown_run")[""]
        assert final["metadata"]["notes"] == {"n0": "a, edited"}
        assert instance.get_run_by_id(result.run_id).tags[TAG_CONTENT_HASH] == request.tags[TAG_CONTENT_HASH]


def test_a_task_whose_shape_changed_waits_for_a_reload(project):
    defs = build_definitions(project / "tasks")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, None)
        (project / "tasks" / "alpha.json").write_text(json.dumps(note_task("a", "and a second step")))
        (project / "tasks" / "gamma.json").write_text(json.dumps(note_task("g")))
        waiting = tick(defs, instance, first.cursor)
        assert waiting.run_requests == []
        assert "task 'alpha' changed its steps, edges, assets or rows: reload the code location" in waiting.skip_message
        assert "task 'gamma' has no job here yet: reload the code location" in waiting.skip_message
        assert waiting.cursor == first.cursor  # neither counts as launched

        reloaded = build_definitions(project / "tasks")
        after = tick(reloaded, instance, waiting.cursor)
        assert {(r.job_name, r.run_key) for r in after.run_requests} == {
            ("alpha", run_key(reloaded, "alpha")), ("gamma", run_key(reloaded, "gamma")),
        }
        assert tick(reloaded, instance, after.cursor).run_requests == []


def test_a_broken_file_is_reported_not_launched(project):
    defs = build_definitions(project / "tasks")
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, None)
        (project / "tasks" / "alpha.json").write_text(json.dumps([{"id": "n0", "type": "note", "txt": "typo"}]))
        broken = tick(defs, instance, first.cursor)
        assert broken.run_requests == []
        assert "1 problem(s) in task files" in broken.skip_message and "alpha.json" in broken.skip_message


def test_a_dataset_task_launches_all_its_rows_in_one_run(tmp_path):
    from test_coder_eval_run import WORDS_TASK

    from agentenv_dagster.orchestration.rows import RANGE_END_TAG, RANGE_START_TAG

    project = make_project(tmp_path / "p", tasks={"words.yaml": WORDS_TASK.format(extra="")})
    defs = build_definitions(project / "tasks")
    with dg.instance_for_test() as instance:
        (request,) = tick(defs, instance, None).run_requests
    assert request.job_name == "words"
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("r1", "r3")
    assert set(graph_config(request.run_config)["rows"]) == {"r1", "r2", "r3"}


def store(project, task_id: str, *texts: str) -> int:
    """``agentenv-dagster task create``, in process: a new version of ``task_id``."""
    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config
    from agentenv_dagster.spec.store import TaskStore

    draft = project / "drafts" / f"{task_id}.json"
    draft.parent.mkdir(exist_ok=True)
    draft.write_text(json.dumps(note_task(*texts)))
    config = load_config(project)
    return TaskStore(config.state_dir / "tasks").put(task_id, load_plan(draft, config).document)


def test_a_stored_task_is_a_job_and_each_new_version_launches_once(project):
    from agentenv_dagster.orchestration.translator import TAG_TASK_VERSION

    assert store(project, "stored", "v1") == 1
    defs = build_definitions(project / "tasks")
    assert defs.resolve_job_def("stored").tags[TAG_TASK_VERSION] == "1"
    with dg.instance_for_test() as instance:
        first = tick(defs, instance, None)
        keys = {r.job_name: r.run_key for r in first.run_requests}
        assert keys["stored"] == f"stored:1:{defs.resolve_job_def('stored').tags[TAG_CONTENT_HASH]}"
        assert tick(defs, instance, first.cursor).run_requests == []

        assert store(project, "stored", "v2") == 2  # same shape: it runs through the loaded job
        second = tick(defs, instance, first.cursor)
        (request,) = second.run_requests
        assert request.job_name == "stored" and request.run_key.startswith("stored:2:")
        assert request.tags[TAG_TASK_VERSION] == "2"
        result = defs.resolve_job_def("stored").execute_in_process(instance=instance, run_config=request.run_config,
                                                               tags=request.tags)
        final = stream_rows(project / ".agentenv" / "state" / "runs" / result.run_id, "teardown_run")
        assert final[""]["metadata"]["notes"] == {"n0": "v2"}
        # a restart with the cursor launches nothing again; a reload runs the new version as its job
        reloaded = build_definitions(project / "tasks")
        assert tick(reloaded, instance, second.cursor).run_requests == []
        assert reloaded.resolve_job_def("stored").tags[TAG_TASK_VERSION] == "2"


def test_a_file_shadows_the_stored_versions_of_its_task(project, caplog):
    store(project, "alpha", "stored alpha")
    defs = build_definitions(project / "tasks")
    assert defs.resolve_job_def("alpha").tags.get("agentenv/task_version") == "unversioned"  # the file's
    assert "stored task 'alpha' is shadowed by" in caplog.text and "alpha.json" in caplog.text
    assert not [j.name for j in defs.resolve_all_job_defs() if j.name.endswith("__invalid")]


@pytest.mark.slow
def test_the_cursor_survives_a_daemon_restart_under_a_real_daemon(tmp_path):
    """Turned on with ``dagster sensor start``, ticked by ``dagster-daemon``: the task launches
    once; after the daemon restarts, its ticks launch nothing again until the file changes,
    and then once."""
    import subprocess
    import sys
    import time

    from test_dagster_dev import wait_until

    project = make_project(tmp_path / "p", extra_config='[task_steps]\nimpls = ["note_steps:NoteStep"]\n',
                           tasks={"noted.json": note_task("first")})
    (project / "note_steps.py").write_text(NOTE_STEP)
    home = dagster_project(project)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(project)}
    started = subprocess.run([sys.executable, "-m", "dagster", "sensor", "start", TASK_FILES_SENSOR,
                              "-w", "workspace.yaml"], cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        def sensor_runs() -> list[dg.DagsterRun]:
            return instance.get_runs(dg.RunsFilter(job_name="noted", tags={"dagster/sensor_name": TASK_FILES_SENSOR}))

        def ticks_since(moment: float) -> list:
            (state,) = [s for s in instance.all_instigator_state() if s.name == TASK_FILES_SENSOR]
            return [t for t in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=20)
                    if t.timestamp > moment]

        with dagster_daemon(project, log):
            first = wait_until(lambda: [r for r in sensor_runs() if r.is_finished], 240, "the sensor's first run")
        assert [r.status for r in first] == [dg.DagsterRunStatus.SUCCESS]
        restarted = time.time()
        with dagster_daemon(project, log):
            wait_until(lambda: len(ticks_since(restarted)) >= 2, 240, "two ticks after the restart")
            assert len(sensor_runs()) == 1  # the cursor remembered the launch
            (project / "tasks" / "noted.json").write_text(json.dumps(note_task("second")))  # same shape
            changed = wait_until(lambda: [r for r in sensor_runs() if r.is_finished and r.run_id != first[0].run_id],
                                 240, "the changed task's run")
            edited = time.time()
            wait_until(lambda: len(ticks_since(edited)) >= 1, 240, "a tick after the change ran")
        assert len(sensor_runs()) == 2 and changed[0].status == dg.DagsterRunStatus.SUCCESS
        assert changed[0].tags[TAG_CONTENT_HASH] != first[0].tags[TAG_CONTENT_HASH]
    assert leaked_servers(project / ".agentenv" / "state") == []
