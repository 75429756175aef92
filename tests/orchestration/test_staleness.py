"""Stale scores: each task asset's code version covers what decides it, Dagster's own
staleness (as the UI's GraphQL reads it) flags exactly the scores a change touches, and
`run --stale-only` and the `agentenv_stale_scores` sensor run just those."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import AgentEnvConfig, load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from agentenv_dagster.orchestration.dagster_internals import StaleStatuses
from agentenv_dagster.orchestration.staleness import STALE_SCORES_SENSOR
from agentenv_dagster.orchestration.task_job import asset_code_versions
from agentenv_dagster.orchestration.translator import TaskTranslator
from projects import REPO, leaked_servers, make_project

REPLY = (REPO / "tasks" / "reply_to_dana.json").read_text()


@pytest.fixture
def project(tmp_path):
    """A project with the one task reply_to_dana (its code location loads quickly)."""
    root = make_project(tmp_path / "project", tasks={"reply_to_dana.json": REPLY})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def add_config(project: Path, text: str) -> None:
    config = project / ".agentenv" / "config.toml"
    config.write_text(config.read_text() + "\n" + textwrap.dedent(text))


def stale_statuses(project: Path, instance: dg.DagsterInstance) -> dict[str, tuple[str, list[str]]]:
    """Each asset's stale status and causes as the UI resolves them (its GraphQL
    ``staleStatus``; ``test_dagster_dev.py`` asks a real webserver), from the project's code
    location built as it is now."""
    graph = build_definitions(project / "tasks").resolve_asset_graph()
    statuses = StaleStatuses(instance, graph)
    return {key.to_user_string(): (statuses.status(key), statuses.causes(key)) for key in graph.get_all_asset_keys()}


@pytest.mark.slow  # runs the task (its servers) once or more
def test_a_run_leaves_its_scores_fresh_and_a_new_judge_makes_the_judged_score_stale(project):
    with dg.instance_for_test() as instance:
        job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
        assert job.execute_in_process(instance=instance).success
        statuses = stale_statuses(project, instance)
        task_assets = {key: value for key, value in statuses.items() if "reply_to_dana" in key}
        assert set(task_assets) == {"verifications/reply_to_dana/sent", "verifications/reply_to_dana/tone",
                                    "artifacts/reply_to_dana/collect", "results/reply_to_dana"}
        assert all(status == ("FRESH", []) for status in task_assets.values()), task_assets

        add_config(project, """
            [model.roles]
            judge = "claude-opus-4-1"
        """)
        statuses = stale_statuses(project, instance)
        # the rubric is graded by the judge; the env outcome and the collection are not
        assert statuses["verifications/reply_to_dana/tone"] == ("STALE", ["has a new code version"])
        assert statuses["results/reply_to_dana"] == ("STALE", ["has a new code version"])
        assert statuses["verifications/reply_to_dana/sent"] == ("FRESH", [])
        assert statuses["artifacts/reply_to_dana/collect"] == ("FRESH", [])


def code_versions(project: Path, change: dict | None = None) -> dict[str, str]:
    """Each node's asset code version of reply_to_dana under the project's config, with
    ``change`` merged into it."""
    data = tomllib.loads((project / ".agentenv" / "config.toml").read_text())
    config = AgentEnvConfig.model_validate({**merged(data, change or {}), "root": project})
    plan = load_plan(project / "tasks" / "reply_to_dana.json", config)
    return asset_code_versions(plan, TaskTranslator(), config)


def merged(base: dict, change: dict) -> dict:
    out = dict(base)
    for key, value in change.items():
        out[key] = merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("change, changed", [
    # what decides a score: the assets whose steps use it change, and the task's results
    ({"model": {"roles": {"judge": "claude-opus-4-1"}}}, {"tone"}),
    ({"model": {"default": "claude-opus-4-1"}}, {"tone"}),  # the judge's and the judge agent's model
    ({"model": {"providers": {"anthropic": {"verdict": "json_schema"}}}}, {"tone"}),
    ({"model": {"params": {"temperature": 0.5}}}, {"tone"}),
    ({"envs": {"registry": {"email": {"kind": "email", "version": "2"}}}}, {"tone", "sent", "collect"}),
    ({"agents": {"registry": {"claude-code": {"max_turns": 3}}}}, {"tone", "sent", "collect"}),
    ({"agents": {"registry": {"claude-code": {"kind": "anthropic"}}}}, {"tone", "sent", "collect"}),
    # what does not: keys, endpoints, prices, descriptions, pacing, run settings, the gate
    ({"model": {"api_key": "env:OTHER_KEY", "base_url": "http://127.0.0.1:9"}}, set()),
    ({"model": {"prices": {"claude-sonnet-4-6": {"input": 1.0, "output": 2.0}}}}, set()),
    ({"agents": {"registry": {"claude-code": {"description": "another", "delay_seconds": 0.5}}}}, set()),
    ({"regression": {"max_drop": 0.3}, "dagster": {"executor": "multiprocess"}}, set()),
])
def test_each_asset_s_code_version_covers_what_decides_it_and_nothing_else(tmp_path, change, changed):
    root = make_project(tmp_path / "p", tasks={"reply_to_dana.json": REPLY})
    before, after = code_versions(root), code_versions(root, change)
    differ = {node for node in before if before[node] != after[node]}
    assert differ == (changed | {"teardown_run"} if changed else set())


def test_a_replay_script_s_content_and_a_step_s_fields_decide_only_their_assets(tmp_path):
    root = make_project(tmp_path / "p", tasks={"reply_to_dana.json": REPLY})
    before = code_versions(root)
    script = root / "agents" / "reply_to_dana.replay.json"
    script.write_text(script.read_text().replace("Q3", "Q4"))
    scripted = code_versions(root)
    assert {n for n in before if before[n] != scripted[n]} == {"tone", "sent", "collect", "teardown_run"}
    collect = '"agent_name": "assistant", "depends_on": [{"task_step_id": "reply"}]}'
    assert REPLY.count(collect) == 1
    (root / "tasks" / "reply_to_dana.json").write_text(
        REPLY.replace(collect, collect.replace('"depends_on"', '"fail_task_on_error": false, "depends_on"')))
    edited = code_versions(root)  # the collect step is no ancestor of a verification
    assert {n for n in before if scripted[n] != edited[n]} == {"collect", "teardown_run"}


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # three CLI runs
def test_run_stale_only_skips_a_fresh_task_and_runs_a_stale_one_saying_why(project):
    first = cli(project, "--stale-only", "tasks/reply_to_dana.json")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "task 'reply_to_dana' is stale: never materialized" in first.stdout
    assert "of job 'reply_to_dana': SUCCESS" in first.stdout

    again = cli(project, "--stale-only", "tasks/reply_to_dana.json")
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.splitlines() == [
        "skipped tasks/reply_to_dana.json: task 'reply_to_dana' is fresh, each of its scores is current (--stale-only)"]

    add_config(project, """
        [model.roles]
        judge = "claude-opus-4-1"
    """)
    judged = cli(project, "--stale-only", "tasks/reply_to_dana.json")
    assert judged.returncode == 0, judged.stderr[-2000:]
    assert ("task 'reply_to_dana' is stale: verifications/reply_to_dana/tone: has a new code version; "
            "results/reply_to_dana: has a new code version") in judged.stdout
    assert "of job 'reply_to_dana': SUCCESS" in judged.stdout


ROWS_TASK = """\
task_id: rows
description: Each row's agent writes out.txt.
initial_prompt: Write out.txt for ${row.name}.
agent:
  type: replay
  episodes:
    - match: "(?i)write"
      actions: [{tool: Write, arguments: {file_path: out.txt, content: done}}]
      reply: done
sandbox: {driver: tempdir, python: null}
dataset:
  rows:
    - {id: r1, name: a}
    - {id: r2, name: b}
success_criteria:
  - {type: file_exists, path: out.txt, description: out.txt is there}
"""


@pytest.mark.slow  # three runs of a dataset
def test_stale_only_runs_just_the_rows_never_materialized_or_stale(project):
    task = project / "rows.yaml"
    task.write_text(ROWS_TASK)
    with dg.instance_for_test() as instance:
        def stale_only(name: str) -> list[str]:
            """What ``run --stale-only rows.yaml`` says of the rows (its results and notes)."""
            done = run_coder_eval_task(task, load_config(project), instance=instance, stale_only=True,
                                       output_dir=project / "out" / name)
            return [line.strip() for line in done.lines()]

        first = stale_only("first")
        assert "rows: 2 stale row(s): row r1: never materialized | row r2: never materialized" in first
        assert [line for line in first if line.startswith("+")] == [
            "+ rows/r1: SUCCESS (score 1.000)", "+ rows/r2: SUCCESS (score 1.000)"]

        second_row = "    - {id: r2, name: b}\n"
        task.write_text(ROWS_TASK.replace(second_row, second_row + "    - {id: r3, name: c}\n"))
        added = stale_only("added")  # a new row is data, not code: only it runs
        assert "skipped 2 fresh row(s) of rows (--stale-only): r1, r2" in added
        assert "rows: 1 stale row(s): row r3: never materialized" in added
        assert [line for line in added if line.startswith("+")] == ["+ rows/r3: SUCCESS (score 1.000)"]
        assert "suite rows: passed (pass rate 1.0)" in added  # the fresh rows count as they last ran

        task.write_text(task.read_text().replace("description: out.txt is there", "description: out.txt exists"))
        criteria = stale_only("criteria")  # the grading changed: every row's score is stale
        changed = "verifications/rows/success_criteria: has a new code version; results/rows: has a new code version"
        assert f"rows: 3 stale row(s): row r1: {changed} | row r2: {changed} | row r3: {changed}" in criteria
        assert len([line for line in criteria if line.startswith("+")]) == 3


def tick(definitions: dg.Definitions, instance: dg.DagsterInstance):
    repository = definitions.get_repository_def()
    context = dg.build_sensor_context(instance=instance, repository_def=repository)
    return repository.get_sensor_def(STALE_SCORES_SENSOR).evaluate_tick(context)


def test_the_stale_scores_sensor_is_stopped_by_default_and_asks_for_a_task_never_materialized(project):
    defs = build_definitions(project / "tasks")
    assert defs.get_repository_def().get_sensor_def(STALE_SCORES_SENSOR).default_status == dg.DefaultSensorStatus.STOPPED
    with dg.instance_for_test() as instance:
        (never,) = tick(defs, instance).run_requests
    assert never.job_name == "reply_to_dana" and never.run_key.startswith("stale:")


@pytest.mark.slow  # runs the task (its servers) once or more
def test_the_stale_scores_sensor_launches_stale_tasks_once_and_skips_fresh_ones(project):
    with dg.instance_for_test() as instance:
        defs = build_definitions(project / "tasks")
        never = tick(defs, instance)
        assert [r.job_name for r in never.run_requests] == ["reply_to_dana"]
        assert defs.resolve_job_def("reply_to_dana").execute_in_process(instance=instance).success
        fresh = tick(defs, instance)
        assert fresh.run_requests == []
        assert fresh.skip_message == "every score is current (1 task(s) and variant(s) fresh)"

        add_config(project, """
            [model.roles]
            judge = "claude-opus-4-1"
        """)
        reloaded = build_definitions(project / "tasks")
        (stale,) = tick(reloaded, instance).run_requests
        assert stale.job_name == "reply_to_dana" and stale.run_key.startswith("stale:")
        assert stale.run_key != never.run_requests[0].run_key  # a new change: a new run


def test_the_automation_condition_hook_puts_a_condition_on_every_task_asset(project):
    class Automatic(TaskTranslator):
        def get_automation_condition(self, plan):
            return dg.AutomationCondition.code_version_changed()

    graph = build_definitions(project / "tasks", translator=Automatic()).resolve_asset_graph()
    keys = [key for key in graph.get_all_asset_keys() if "reply_to_dana" in key.path]
    assert len(keys) == 4
    assert all(graph.get(key).automation_condition == dg.AutomationCondition.code_version_changed() for key in keys)
    default = build_definitions(project / "tasks").resolve_asset_graph()
    assert all(default.get(key).automation_condition is None for key in keys)
