"""Schedules: a cron from [schedules] in .agentenv/config.toml (either format) or a Coder Eval
``schedule:<preset>`` tag becomes a Dagster schedule of the task's job."""

from __future__ import annotations

import logging
import textwrap

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.config import ConfigError, load_config
from agentenv_dagster.orchestration.rows import RANGE_END_TAG, RANGE_START_TAG
from agentenv_dagster.orchestration.translator import TAG_CONTENT_HASH, TAG_TASK_ID
from projects import REPO, dagster_daemon, dagster_project, graph_config, make_project

SCHEDULES = textwrap.dedent("""
    [schedules]
    reply_to_dana = "0 6 * * 1-5"
    nobody = "@daily"
""")


def schedules(defs: dg.Definitions) -> dict[str, dg.ScheduleDefinition]:
    return {s.name: s for s in defs.get_repository_def().schedule_defs}


def tick(schedule: dg.ScheduleDefinition) -> dg.RunRequest:
    with dg.instance_for_test() as instance:
        data = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
    (request,) = data.run_requests
    return request


def test_a_config_cron_schedules_an_agent_env_task(tmp_path, caplog):
    project = make_project(tmp_path / "p", extra_config=SCHEDULES)
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        defs = build_definitions(project / "tasks")
    assert "[schedules] nobody: no task with this id in the tasks folder; not scheduled" in caplog.text
    (name,) = schedules(defs)
    schedule = schedules(defs)[name]
    assert name == "reply_to_dana_schedule"
    assert schedule.cron_schedule == "0 6 * * 1-5" and schedule.execution_timezone == "UTC"
    assert schedule.job_name == "reply_to_dana" and schedule.job.name == "reply_to_dana"
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    request = tick(schedule)
    job = defs.resolve_job_def("reply_to_dana")
    assert request.job_name == "reply_to_dana"
    assert request.tags[TAG_TASK_ID] == "reply_to_dana" and request.tags[TAG_CONTENT_HASH] == job.tags[TAG_CONTENT_HASH]
    assert graph_config(request.run_config)["steps"]["reply"]["prompt"] == "Reply to Dana."


def test_a_coder_eval_tag_or_a_config_table_schedules_a_coder_eval_task(tmp_path, caplog):
    tagged = (REPO / "tasks" / "hello_python.yaml").read_text().replace("tags: [smoke, offline]", "tags: [smoke, schedule:weekly]")
    project = make_project(tmp_path / "p", tasks={"hello_python.yaml": tagged})
    schedule = schedules(build_definitions(project / "tasks"))["hello_python_schedule"]
    assert schedule.cron_schedule == "@weekly" and schedule.job_name == "hello_python"
    assert tick(schedule).tags[TAG_TASK_ID] == "hello-python"

    table = '[schedules.hello-python]\ncron = "30 2 * * *"\ntimezone = "Europe/Paris"\ndefault_status = "running"\n'
    project = make_project(tmp_path / "q", tasks={"hello_python.yaml": tagged}, extra_config=table)
    schedule = schedules(build_definitions(project / "tasks"))["hello_python_schedule"]
    assert (schedule.cron_schedule, schedule.execution_timezone) == ("30 2 * * *", "Europe/Paris")  # config wins
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING

    unknown = tagged.replace("schedule:weekly", "schedule:fortnightly")
    project = make_project(tmp_path / "r", tasks={"hello_python.yaml": unknown})
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        assert schedules(build_definitions(project / "tasks")) == {}
    assert "tag 'schedule:fortnightly': unknown schedule (one of hourly, daily, weekly, monthly, yearly" in caplog.text


def test_a_dataset_task_s_tick_runs_all_its_rows(tmp_path):
    from test_coder_eval_run import WORDS_TASK

    project = make_project(tmp_path / "p", tasks={"words.yaml": WORDS_TASK.format(extra="")},
                           extra_config='[schedules]\nwords = "@hourly"\n')
    request = tick(schedules(build_definitions(project / "tasks"))["words_schedule"])
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("r1", "r3")
    assert set(graph_config(request.run_config)["rows"]) == {"r1", "r2", "r3"}


def test_a_malformed_cron_is_a_config_error_and_a_bad_value_is_skipped(tmp_path, caplog):
    project = make_project(tmp_path / "p", extra_config='[schedules]\nreply_to_dana = "every morning"\n')
    with pytest.raises(ConfigError, match=r"schedules\.reply_to_dana\.cron: Value error, 'every morning' is not a cron schedule"):
        load_config(project)
    project = make_project(tmp_path / "q", extra_config='[schedules.reply_to_dana]\ncron = "0 6 * * *"\nzone = "UTC"\n')
    with pytest.raises(ConfigError, match=r"schedules\.reply_to_dana\.zone: Extra inputs are not permitted"):
        load_config(project)
    project = make_project(tmp_path / "r", extra_config='[schedules]\nreply_to_dana = "99 6 * * *"\n')
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        defs = build_definitions(project / "tasks")
    assert schedules(defs) == {}
    assert "[schedules] reply_to_dana: not scheduled:" in caplog.text and "99 6 * * *" in caplog.text


@pytest.mark.slow
def test_a_cron_schedule_runs_its_task_under_dagster_daemon(tmp_path):
    """The daemon ticks a running ``* * * * *`` schedule and the run it launches succeeds:
    a cron in config is a real Dagster schedule, not only a definition."""
    from test_dagster_dev import wait_until
    from test_task_file_sensor import NOTE_STEP

    project = make_project(tmp_path / "p", tasks={"noted.json": [{"id": "n", "type": "note", "text": "ticked",
                                                                   "depends_on": []}]},
                           extra_config='[task_steps]\nimpls = ["note_steps:NoteStep"]\n'
                                        '[schedules.noted]\ncron = "* * * * *"\ndefault_status = "running"\n')
    (project / "note_steps.py").write_text(NOTE_STEP)
    home = dagster_project(project)
    with dagster_daemon(project, tmp_path / "daemon.log"), dg.DagsterInstance.from_config(str(home)) as instance:
        def finished():
            runs = instance.get_runs(dg.RunsFilter(job_name="noted", tags={"dagster/schedule_name": "noted_schedule"}))
            return runs and runs[0].is_finished and runs[0]

        run = wait_until(finished, 240, "the schedule's run")  # the next minute, then the run
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags[TAG_TASK_ID] == "noted"
