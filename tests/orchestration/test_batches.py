"""A dataset's rows run together: one Dagster run over a range of partitions, every op running
its step for all rows, each row's verification a partition materialization."""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace
from datetime import datetime

import dagster as dg
import pytest
from test_coder_eval_run import WORDS_TASK, cli

from agentenv_dagster import build_definitions
from agentenv_dagster.compiler import checked_plan, load_document, step_registry
from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from agentenv_dagster.orchestration.execute import execute_plan
from agentenv_dagster.orchestration.rows import RANGE_END_TAG, RANGE_START_TAG, ROWS_TAG
from agentenv_dagster.runtime.local import Ledger
from projects import graph_config, leaked_servers, make_project, node_of

VERIFICATION = dg.AssetKey(["verifications", "words", "success_criteria"])

ROW_STEP = textwrap.dedent('''
    from agentenv_dagster.steps.base import TaskStep
    from agentenv_dagster.steps.verifiers import _Verifier

    class RowStep(TaskStep):
        """Fails for the rows whose ``verdict`` is "fail"; records what it saw."""
        type_name = "row_step"
        verdict: str

        async def execute(self, ctx, rt):
            ctx.metadata_map("seen")[self.id] = self.verdict
            if self.verdict == "fail":
                raise RuntimeError(f"row said {self.verdict}")

    class RowScore(_Verifier):
        """A verification of every row that reaches it."""
        type_name = "row_score"

        async def execute(self, ctx, rt):
            self.record(ctx, [{"id": "reached", "score": 1.0, "result": True}])
''')


def rows_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    """The task's runs (the CLI also materializes the suite asset, in a run of its own)."""
    return [r for r in instance.get_runs() if r.job_name == "words"]


def check_statuses(instance: dg.DagsterInstance, key: dg.AssetCheckKey, rows: list[str]) -> dict[str, str]:
    """Each partition's status as the check's Partitions tab shows it (Dagster's check state:
    an evaluation counts while it judged the partition's latest materialization; a planned one
    in a failed run is an execution failure)."""
    state = instance.event_log_storage.get_asset_check_state([(key, dg.StaticPartitionsDefinition(rows))])[key]
    return {row: status.value for status, subset in state.subsets.items()
            for row in subset.subset_value.get_partition_keys()}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", extra_config='[task_steps]\nimpls = ["row_steps:RowStep", "row_steps:RowScore"]\n')
    (root / "row_steps.py").write_text(ROW_STEP)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_dataset_is_one_run_over_its_rows(project, monkeypatch):
    from agentenv_dagster.orchestration import step_events

    monkeypatch.setattr(step_events, "ROWS_A_QUERY", 2)  # the checks' targets read in two queries
    path = project / "tasks" / "words.yaml"
    path.write_text(WORDS_TASK.format(extra=""))
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(path, load_config(project), output_dir=project / "out", instance=instance,
                                   rows_in_flight=2)
        (run,) = rows_runs(instance)
        assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == ("r1", "r3")
        assert instance.get_materialized_partitions(VERIFICATION) == {"r1", "r2", "r3"}
        passed = {
            row: instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=VERIFICATION, asset_partitions=[row]),
                                                 limit=1).records[0].asset_materialization.metadata["passed"].value
            for row in ("r1", "r2", "r3")
        }
        checks = check_statuses(instance, dg.AssetCheckKey(VERIFICATION, "passed"), ["r1", "r2", "r3"])
    assert passed == {"r1": True, "r2": True, "r3": False}
    # each row's check is a partition of the check, judging that row's latest materialization
    assert checks == {"r1": "SUCCEEDED", "r2": "SUCCEEDED", "r3": "FAILED"}
    assert [(r.task_id, r.final_status.value) for r in done.results] == [
        ("words/r1", "SUCCESS"), ("words/r2", "SUCCESS"), ("words/r3", "ERROR")]  # no scripted reply
    # every row's agent ran in the run's one agent host: one process, three hosted agents
    entries = Ledger.of_run(project / ".agentenv" / "state" / "runs" / run.run_id).entries()
    hosts = [iid for iid, e in entries.items() if e["pid"]]
    assert len(hosts) == 1 and sorted(e["host"] for e in entries.values() if not e["pid"]) == [hosts[0]] * 3
    # each row has its own sandbox and its own timing, inside the run's span
    sandboxes = {r.sandbox_path for r in done.results}
    assert len(sandboxes) == 3
    assert all(r.started_at <= r.completed_at and r.duration_seconds < 60 for r in done.results)


@pytest.mark.slow
def test_a_row_s_check_run_on_its_own_judges_that_row(project):
    """The UI's Execute on a partition of the check (the asset job, its check alone, tagged
    with the row): it reads that row's latest verification, not the asset's latest of any row."""
    path = project / "tasks" / "words.yaml"
    path.write_text(WORDS_TASK.format(extra=""))
    key = dg.AssetCheckKey(VERIFICATION, "passed")
    with dg.instance_for_test() as instance:
        run_coder_eval_task(path, load_config(project), output_dir=project / "out", instance=instance)
        checks_alone = build_definitions(project / "tasks").resolve_implicit_global_asset_job_def().get_subset(
            asset_check_selection={key})
        judged = {}
        for row in ("r2", "r3"):  # r3, the last row written, did not pass; r2 did
            result = checks_alone.execute_in_process(instance=instance, tags={"dagster/partition": row})
            (evaluation,) = result.get_asset_check_evaluations()
            judged[row] = (evaluation.partition, evaluation.passed)
        assert judged == {"r2": ("r2", True), "r3": ("r3", False)}
        assert check_statuses(instance, key, ["r1", "r2", "r3"]) == {"r1": "SUCCEEDED", "r2": "SUCCEEDED",
                                                                     "r3": "FAILED"}


def test_a_row_that_fails_stops_there_and_the_others_go_on(project):
    steps = [
        {"id": "check", "type": "row_step", "verdict": "<row.verdict>", "depends_on": []},
        {"id": "after", "type": "row_step", "verdict": "ran"},
    ]
    (project / "tasks" / "rows.json").write_text(json.dumps(steps))
    config = load_config(project)
    document, _ = load_document(project / "tasks" / "rows.json", step_registry(config))
    seeds = {"a": {"row.verdict": "pass"}, "b": {"row.verdict": "fail"}, "c": {"row.verdict": "pass"}}
    plan = checked_plan(replace(document, partitions=seeds))
    with dg.instance_for_test() as instance:
        run = execute_plan(plan, config, instance=instance, partition_keys=["c", "a", "b"])
        assert not run.success  # the run fails (after every row ran) so Dagster marks the stopped row
        teardown = [e for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]
        assert [node_of(e.step_key) for e in teardown] == ["teardown_run"]
        assert "1 of 3 rows stopped" in teardown[0].dagster_event.event_specific_data.error.message
        assert set(run.contexts) == {"a", "b", "c"}
        assert run.contexts["a"].metadata["seen"] == {"check": "pass", "after": "ran"}
        assert run.contexts["b"].metadata["seen"] == {"check": "fail"}  # `after` never ran for it
        (failure,) = run.contexts["b"].metadata["failed_steps"]
        assert (failure["step_id"], failure["error"]) == ("check", "row said fail")
        assert run.contexts["a"].metadata["seed"] == {"row.verdict": "pass"}

        everyone_fails = checked_plan(replace(document, partitions={
            "x": {"row.verdict": "fail"}, "y": {"row.verdict": "fail"}}))
        failed = execute_plan(everyone_fails, config, instance=instance, partition_keys=["x", "y"])
    assert not failed.success
    assert {k: c.metadata["failed_steps"][0]["step_id"] for k, c in failed.contexts.items()} == {"x": "check", "y": "check"}


def test_rows_that_stop_are_the_failed_partitions_of_the_assets_they_never_reached(project):
    steps = [
        {"id": "check", "type": "row_step", "verdict": "<row.verdict>", "depends_on": []},
        {"id": "score", "type": "row_score"},
    ]
    (project / "tasks" / "rows.json").write_text(json.dumps(steps))
    config = load_config(project)
    document, _ = load_document(project / "tasks" / "rows.json", step_registry(config))
    seeds = {"a": {"row.verdict": "pass"}, "b": {"row.verdict": "fail"}, "c": {"row.verdict": "fail"},
             "d": {"row.verdict": "pass"}}
    plan = checked_plan(replace(document, partitions=seeds))
    key = dg.AssetKey(["verifications", "rows", "score"])
    partitions = dg.StaticPartitionsDefinition(list(seeds))
    with dg.instance_for_test() as instance:
        run = execute_plan(plan, config, instance=instance, partition_keys=["a", "b", "c"])
        assert not run.success
        status = instance.get_status_by_partition(key, list(seeds), partitions)
        assert {k: getattr(v, "value", v) for k, v in status.items()} == {
            "a": "MATERIALIZED", "b": "FAILED", "c": "FAILED", "d": None}
        # and of its check: the stopped rows' evaluations were planned, and the run failed
        check = dg.AssetCheckKey(key, "passed")
        assert check_statuses(instance, check, list(seeds)) == {
            "a": "SUCCEEDED", "b": "EXECUTION_FAILED", "c": "EXECUTION_FAILED"}
        # the stopped rows' contexts are kept, and the run's final output holds the rest
        assert set(run.contexts) == {"a", "b", "c"}
        # a later run of a failed row that gets through clears its failure
        fixed = checked_plan(replace(document, partitions={**seeds, "b": {"row.verdict": "pass"}}))
        assert execute_plan(fixed, config, instance=instance, partition_keys=["b"]).success
        status = instance.get_status_by_partition(key, list(seeds), partitions)
        assert getattr(status["b"], "value", None) == "MATERIALIZED" and status["c"].value == "FAILED"
        assert check_statuses(instance, check, list(seeds)) == {
            "a": "SUCCEEDED", "b": "SUCCEEDED", "c": "EXECUTION_FAILED"}


def test_a_launch_over_a_partition_range_without_row_config_reads_the_rows_from_the_job(project):
    """What a single-run backfill (or ``dagster job execute`` with range tags) sends: only the
    range. The root ops take each row's values from the task's dataset."""
    from agentenv_dagster import build_definitions

    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    job = build_definitions(project / "tasks").resolve_job_def("words")
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "r1", RANGE_END_TAG: "r2"})
        assert result.success
        assert instance.get_materialized_partitions(VERIFICATION) == {"r1", "r2"}


@pytest.mark.slow
def test_a_run_tagged_rows_failed_runs_only_the_rows_that_did_not_pass(project):
    from agentenv_dagster import build_definitions

    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    job = build_definitions(project / "tasks").resolve_job_def("words")
    with dg.instance_for_test() as instance:  # the step fields as the launchpad sends them: the defaults
        assert job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "r1", RANGE_END_TAG: "r3"}).success
        again = job.execute_in_process(instance=instance, tags={ROWS_TAG: "failed"})  # every row
        records = instance.fetch_materializations(VERIFICATION, limit=10).records
        assert again.success
        assert sorted(r.asset_materialization.partition for r in records if r.run_id == again.run_id) == ["r3"]
        # r3 has no scripted reply: it fails again; of r1..r2 none is left to re-run
        with_none = job.execute_in_process(instance=instance, tags={
            ROWS_TAG: "failed", RANGE_START_TAG: "r1", RANGE_END_TAG: "r2"})
        assert with_none.success
        assert not [r for r in instance.fetch_materializations(VERIFICATION, limit=10).records
                    if r.run_id == with_none.run_id]


def test_a_run_that_names_no_rows_takes_the_dataset_s_stratified_sample(project):
    from agentenv_dagster import build_definitions
    from agentenv_dagster.orchestration.schedules import task_run_requests
    from agentenv_dagster.orchestration.translator import TaskTranslator

    rows = ", ".join(f"{{id: r{i}, word: {'hi' if i < 4 else 'yo'}, expected_skill: {'a' if i < 4 else 'b'}}}"
                     for i in range(1, 7))
    task = WORDS_TASK.format(extra="").replace(
        "rows: [{id: r1, word: hi}, {id: r2, word: yo}, {id: r3, word: bye}]",
        f"rows: [{rows}]\n  sample_per_stratum: 1\n  sample_seed: 3")
    path = project / "tasks" / "words.yaml"
    path.write_text(task)
    job = build_definitions(project / "tasks").resolve_job_def("words")
    assert len(job.partitions_def.get_partition_keys()) == 6  # every row is a partition
    plan = checked_plan(load_document(path, step_registry(load_config(project)))[0])
    drawn = plan.document.selected_rows()
    assert len(drawn) == 2 and {int(k[1:]) < 4 for k in drawn} == {True, False}  # one row a stratum
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance).success
        assert instance.get_materialized_partitions(VERIFICATION) == set(drawn)
    # a schedule tick or a sensor's launch takes the same draw, as the CLI's `run` does
    (request,) = task_run_requests(plan, TaskTranslator())
    assert set(graph_config(request.run_config)["rows"]) == set(drawn)
    done = run_coder_eval_task(path, load_config(project), output_dir=project / "out")
    assert sorted(r.task_id for r in done.results) == sorted(f"words/{k}" for k in drawn)


@pytest.mark.slow
def test_the_cli_reruns_only_the_failed_rows(project):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    first = cli(project, "run", "tasks/words.yaml", "--output-dir", "out")
    assert first.returncode == 1, first.stdout + first.stderr
    again = cli(project, "run", "tasks/words.yaml", "--failed-only", "--output-dir", "again")
    assert again.returncode == 1, again.stdout + again.stderr
    summary = json.loads((project / "again" / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_error"]) == (1, 1)
    assert "words/r3" in again.stdout and "words/r1" not in again.stdout
    suite = json.loads((project / "again" / "default" / "words" / "suite.json").read_text())
    # the suite is the dataset's, as the suite asset's: the rows not run again count as they last ran
    assert (suite["rows_total"], suite["rows_passed"], suite["rows_error"]) == (3, 2, 1)
    # the agent fixed, the one row left runs again and passes: the whole dataset passes now
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra="").replace("Say (hi|yo)", "Say (hi|yo|bye)"))
    fixed = cli(project, "run", "tasks/words.yaml", "--failed-only", "--output-dir", "fixed")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "words/r3: SUCCESS" in fixed.stdout and "words/r1" not in fixed.stdout
    suite = json.loads((project / "fixed" / "default" / "words" / "suite.json").read_text())
    assert (suite["rows_total"], suite["rows_passed"], suite["pass_rate"]) == (3, 3, 1.0)
    assert [s["task_id"] for s in suite["failed_samples"]] == []
    # nothing left to run again: said so, and the suite still counts every row
    done = cli(project, "run", "tasks/words.yaml", "--failed-only", "--output-dir", "done")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "words: all 3 selected rows passed last time; none runs again" in done.stdout
    assert json.loads((project / "done" / "run.json").read_text())["tasks_run"] == 0
    suite = json.loads((project / "done" / "default" / "words" / "suite.json").read_text())
    assert (suite["rows_total"], suite["rows_passed"], suite["passed"]) == (3, 3, True)


def most_at_once(contexts: dict[str, dict], step_id: str) -> int:
    """How many rows ran ``step_id`` at the same moment (from their recorded step timings,
    whose durations are rounded to the millisecond: a 2 ms overlap is not a second row, and
    a step quicker than that still ran)."""
    edges = []
    for ctx in contexts.values():
        timing = ctx["metadata"]["step_timings"][step_id]
        start = datetime.fromisoformat(timing["started_at_utc"]).timestamp()
        edges += [(start, 1), (start + max(timing["duration_seconds"] - 0.002, 1e-6), -1)]
    running = peak = 0
    for _, change in sorted(edges):  # an end sorts before a start at the same instant
        running += change
        peak = max(peak, running)
    return peak


@pytest.mark.slow
def test_the_cli_runs_a_dataset_with_bounded_rows_in_flight(project):
    slow = WORDS_TASK.format(extra="").replace("type: replay", "type: replay\n  delay_seconds: 0.3")
    (project / "tasks" / "words.yaml").write_text(slow)
    unbounded = cli(project, "run", "tasks/words.yaml", "--output-dir", "free")
    assert unbounded.returncode == 1, unbounded.stdout + unbounded.stderr  # r3 errs, as upstream's exit code says
    free = json.loads((project / "free" / "contexts" / "words" / "task" / "context.json").read_text())
    assert most_at_once(free, "prompt") == 3  # the default (32) lets every row prompt at once
    done = cli(project, "run", "tasks/words.yaml", "--rows-in-flight", "1", "--output-dir", "out")
    assert done.returncode == 1, done.stdout + done.stderr
    summary = json.loads((project / "out" / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"], summary["tasks_error"]) == (3, 2, 1)
    contexts = json.loads((project / "out" / "contexts" / "words" / "task" / "context.json").read_text())
    assert [most_at_once(contexts, step) for step in ("agent", "prompt", "criteria")] == [1, 1, 1]
    bad = cli(project, "run", "tasks/words.yaml", "--rows-in-flight", "0")
    assert bad.returncode == 2 and "--rows-in-flight" in bad.stderr


def test_simulation_trials_are_replicates_each_a_run_tagged_with_its_replicate(project):
    path = project / "tasks" / "words.yaml"
    path.write_text(WORDS_TASK.format(extra="").replace(
        "sandbox: {python: null}",
        "sandbox: {python: null}\nsimulation: {enabled: true, persona: a user, goal: say hi, n_trials: 2}"))
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(path, load_config(project), output_dir=project / "out", instance=instance)
        runs = rows_runs(instance)
        assert sorted(r.tags["agentenv/replicate"] for r in runs) == ["0", "1"]
        assert {r.tags["agentenv/variant"] for r in runs} == {"default"}
    assert sorted((r.task_id, r.replicate_index) for r in done.results) == [
        (f"words/{row}", i) for row in ("r1", "r2", "r3") for i in (0, 1)]
