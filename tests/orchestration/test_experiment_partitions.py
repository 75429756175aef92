"""A Coder Eval task under an experiment is a job of its own, partitioned by variant x row:
each partition runs its variant's resolved steps on its row, and the CLI's experiment runs
materialize the same partitions. Each variant's rows are a suite (a partition of the suite
asset), and schedules and the task-file sensor launch a run per variant and replicate."""

from __future__ import annotations

import json
import shutil
import textwrap

import dagster as dg
import pytest
from test_coder_eval_run import WORDS_TASK, cli

from agentenv_dagster import build_definitions
from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from projects import REPO, default_steps, graph_config, leaked_servers, make_project

VERIFICATION = dg.AssetKey(["verifications", "words__compare", "success_criteria"])
COMPARE = textwrap.dedent("""
    experiment_id: compare
    variants:
      - variant_id: base
      - variant_id: strict
        initial_prompt: "Do ${row.word}"
""")


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", tasks={"words.yaml": WORDS_TASK.format(extra="")},
                        extra_config='[experiments]\n"experiments/compare.yaml" = ["words"]\n')
    (root / "experiments").mkdir()
    (root / "experiments" / "compare.yaml").write_text(COMPARE)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def passed_by_partition(instance: dg.DagsterInstance) -> dict[str, bool]:
    records = instance.fetch_materializations(VERIFICATION, limit=100).records
    return {r.asset_materialization.partition: r.asset_materialization.metadata["passed"].value
            for r in reversed(records)}  # oldest first: the latest wins


@pytest.mark.slow
def test_an_experiment_s_job_is_partitioned_by_variant_and_row(project):
    defs = build_definitions(project / "tasks", strict=True)
    job = defs.resolve_job_def("words__compare")
    partitions = job.partitions_def
    assert isinstance(partitions, dg.MultiPartitionsDefinition)
    assert sorted(partitions.get_partition_keys()) == sorted(
        f"{row}|{variant}" for row in ("r1", "r2", "r3") for variant in ("base", "strict"))
    assert defs.resolve_asset_graph().get(VERIFICATION).partitions_def == partitions
    assert defs.resolve_job_def("words").partitions_def.get_partition_keys() == ["r1", "r2", "r3"]  # the task's own job stays
    # the job's defaults are the first variant's steps; a partition of another variant runs its own
    assert default_steps(job)["prompt"]["prompt"] == "Say <row.word>"
    with dg.instance_for_test() as instance:
        for key in ("r1|base", "r1|strict"):
            assert job.execute_in_process(instance=instance, partition_key=key).success
        statuses = instance.get_status_by_partition(VERIFICATION, ["r1|base", "r1|strict", "r2|base"], partitions)
        assert passed_by_partition(instance) == {"r1|base": True, "r1|strict": False}
    assert statuses["r1|base"] == statuses["r1|strict"] == dg.AssetPartitionStatus.MATERIALIZED
    assert statuses["r2|base"] is None


def test_a_run_that_names_no_partition_runs_the_variant_its_tag_names(project):
    job = build_definitions(project / "tasks").resolve_job_def("words__compare")
    with dg.instance_for_test() as instance:
        done = job.execute_in_process(instance=instance, tags={"agentenv/variant": "strict"})
        assert sorted(passed_by_partition(instance)) == ["r1|strict", "r2|strict", "r3|strict"]
        untagged = job.execute_in_process(instance=instance, raise_on_error=False)
    assert done.success
    assert not untagged.success
    failure = next(e for e in untagged.all_events if e.event_type_value == "STEP_FAILURE")
    assert "an experiment job runs one variant a run" in failure.event_specific_data.error.message


@pytest.mark.slow
def test_the_cli_runs_an_experiment_as_the_partitions_of_its_job(project):
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "words.yaml", load_config(project), instance=instance,
                                   output_dir=project / "out", experiment=project / "experiments" / "compare.yaml")
        passed = passed_by_partition(instance)
        checks = {i.partition_key: i.latest_execution_status.value for i in
                  instance.event_log_storage.get_asset_check_partition_info([dg.AssetCheckKey(VERIFICATION, "passed")])}
        runs = [r for r in instance.get_runs() if r.job_name == "words__compare"]
    assert passed == {"r1|base": True, "r2|base": True, "r3|base": False,
                      "r1|strict": False, "r2|strict": False, "r3|strict": False}
    assert checks == {key: "SUCCEEDED" if ok else "FAILED" for key, ok in passed.items()}  # a check partition each
    assert sorted(r.tags["agentenv/variant"] for r in runs) == ["base", "strict"]  # one run a variant
    assert sorted((r.variant_id, r.task_id) for r in done.results) == [
        (v, f"words/{row}") for v in ("base", "strict") for row in ("r1", "r2", "r3")]
    report = json.loads((project / "out" / "experiment.json").read_text())
    assert report["variant_ids"] == ["base", "strict"]
    # and through the CLI, in the project's own instance
    again = cli(project, "run", "tasks/words.yaml", "--experiment", "experiments/compare.yaml", "--output-dir", "o")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "words/r3" in again.stdout


TALK = """  - variant_id: talk
    simulation:
      enabled: true
      persona: a user
      goal: say hi
      max_turns: 2
      simulator: {type: replay, episodes: [{match: ".", reply: "bye <<<END>>>"}]}
"""


@pytest.mark.slow
def test_variants_that_lower_to_other_steps_are_a_job_of_their_own(project, caplog):
    (project / "experiments" / "compare.yaml").write_text(COMPARE + TALK)
    (project / ".agentenv" / "config.toml").write_text(
        (project / ".agentenv" / "config.toml").read_text().replace('["words"]', '["words", "nope"]'))
    defs = build_definitions(project / "tasks")
    assert "[experiments] no Coder Eval task 'nope' in the code location" in caplog.text
    shared, talk = defs.resolve_job_def("words__compare"), defs.resolve_job_def("words__compare__talk")
    assert sorted(shared.partitions_def.get_partition_keys()) == sorted(
        f"{row}|{variant}" for row in ("r1", "r2", "r3") for variant in ("base", "strict"))
    assert talk.partitions_def.get_partition_keys() == ["r1|talk", "r2|talk", "r3|talk"]
    simulator = {n.name for n in talk.graph.nodes} - {n.name for n in shared.graph.nodes}
    assert simulator, "the simulation's own steps"
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey(["suites", "words__compare__talk"])).partitions_def.get_partition_keys() == ["talk"]
    # the CLI runs each variant in its group's job, and each job's suite rolls its variants up
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "words.yaml", load_config(project), instance=instance,
                                   output_dir=project / "out", experiment=project / "experiments" / "compare.yaml")
        runs = {(r.job_name, r.tags["agentenv/variant"]) for r in instance.get_runs()
                if r.job_name.startswith("words__")}
        talked = instance.fetch_materializations(
            dg.AssetKey(["verifications", "words__compare__talk", "success_criteria"]), limit=10).records
        suites = {name: instance.fetch_materializations(dg.AssetKey(["suites", name]), limit=10).records
                  for name in ("words__compare", "words__compare__talk")}
    assert runs == {("words__compare", "base"), ("words__compare", "strict"), ("words__compare__talk", "talk")}
    assert sorted(r.asset_materialization.partition for r in talked) == ["r1|talk", "r2|talk", "r3|talk"]
    assert sorted(r.asset_materialization.partition for r in suites["words__compare"]) == ["base", "strict"]
    assert [r.asset_materialization.partition for r in suites["words__compare__talk"]] == ["talk"]
    assert sorted({r.variant_id for r in done.results}) == ["base", "strict", "talk"]


SUITE = dg.AssetKey(["suites", "words__compare"])


@pytest.mark.slow
def test_each_variant_s_rows_are_a_suite_a_partition_of_the_experiment_s_suite_asset(project):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=", suite_thresholds: {mean: 0.5}"))
    defs = build_definitions(project / "tasks", strict=True)
    graph = defs.resolve_asset_graph()
    variants = graph.get(SUITE).partitions_def
    assert variants.get_partition_keys() == ["base", "strict"]
    rows = graph.get(VERIFICATION).partitions_def
    upstream = graph.get_partition_mapping(SUITE, VERIFICATION).get_upstream_mapped_partitions_result_for_partitions(
        variants.subset_with_partition_keys(["strict"]), variants, rows)
    assert sorted(upstream.partitions_subset.get_partition_keys()) == ["r1|strict", "r2|strict", "r3|strict"]  # lineage
    job = defs.resolve_job_def("words__compare")
    with dg.instance_for_test() as instance:
        for key in ("r1|base", "r2|base", "r3|base", "r1|strict"):
            assert job.execute_in_process(instance=instance, partition_key=key).success
        suite = defs.get_assets_def(SUITE)
        base = dg.materialize([suite], instance=instance, partition_key="base")
        strict = dg.materialize([suite], instance=instance, partition_key="strict", raise_on_error=False)
        metadata = {
            record.asset_materialization.partition: {k: v.value for k, v in record.asset_materialization.metadata.items()}
            for record in instance.fetch_materializations(SUITE, limit=10).records
        }
    assert (metadata["base"]["rows_run"], metadata["base"]["rows_total"]) == (3, 3)
    assert metadata["base"]["pass_rate"] == pytest.approx(2 / 3) and metadata["base"]["passed"] is True
    assert (metadata["strict"]["rows_run"], metadata["strict"]["pass_rate"]) == (1, 0.0)  # only its own rows
    assert metadata["base"]["criterion_1/count"] == 2.0  # a number per metric: the Plots tab charts them
    assert metadata["base"]["summary"].startswith("## Suite `words__compare` (base): passed")
    assert {c.check_name: c.passed for c in base.get_asset_check_evaluations()} == {
            "criterion_1_mean": True, "no_regression": True}
    assert {c.check_name: c.passed for c in strict.get_asset_check_evaluations()} == {
            "criterion_1_mean": False, "no_regression": True}


@pytest.mark.slow
def test_the_cli_writes_a_suite_per_variant_and_exits_1_when_one_falls_short(project):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=", suite_thresholds: {mean: 0.5}"))
    done = cli(project, "run", "tasks/words.yaml", "--experiment", "experiments/compare.yaml", "--output-dir", "o")
    assert done.returncode == 1, done.stdout + done.stderr
    suites = {v: json.loads((project / "o" / v / "words" / "suite.json").read_text()) for v in ("base", "strict")}
    assert {v: (s["variant_id"], s["rows_total"], s["passed"]) for v, s in suites.items()} == {
        "base": ("base", 3, True), "strict": ("strict", 3, False)}
    assert not (project / "o" / "default").exists()  # no suite mixing the variants' rows
    assert "suite words [base]: passed" in done.stdout and "suite words [strict]: FAILED" in done.stdout
    assert "[base] words/r1: SUCCESS" in done.stdout and "[strict] words/r1: ERROR" in done.stdout
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:  # the assets, as in the UI
        records = instance.fetch_materializations(SUITE, limit=10).records
        passed = {r.asset_materialization.partition: r.asset_materialization.metadata["passed"].value for r in records}
    assert passed == {"base": True, "strict": False}


@pytest.mark.slow
def test_a_schedule_or_the_task_file_sensor_launches_a_run_per_variant(project):
    config = project / ".agentenv" / "config.toml"
    config.write_text(config.read_text() + '[schedules]\n"words__compare" = "@daily"\n')
    defs = build_definitions(project / "tasks", strict=True)
    repository = defs.get_repository_def()
    assert [s.name for s in repository.schedule_defs] == ["words__compare_schedule"]  # not the task's own job
    with dg.instance_for_test() as instance:
        ticked = repository.get_schedule_def("words__compare_schedule").evaluate_tick(
            dg.build_schedule_context(instance=instance)).run_requests
        sensor = repository.get_sensor_def("agentenv_task_files")
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        again = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=first.cursor))
        (project / "experiments" / "compare.yaml").write_text(COMPARE.replace("Do ${row.word}", "Say ${row.word}!"))
        changed = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=again.cursor))
        strict = next(r for r in changed.run_requests if r.tags["agentenv/variant"] == "strict")
        run = defs.resolve_job_def("words__compare").execute_in_process(
            instance=instance, run_config=strict.run_config, tags=strict.tags)
        passed = passed_by_partition(instance)
    assert {r.tags["agentenv/variant"]: sorted(graph_config(r.run_config)["rows"]) for r in ticked} == {
        "base": ["r1|base", "r2|base", "r3|base"], "strict": ["r1|strict", "r2|strict", "r3|strict"]}
    launched = {(r.job_name, r.tags.get("agentenv/variant")): r.run_key for r in first.run_requests}
    assert sorted(launched) == [("words", None), ("words__compare", "base"), ("words__compare", "strict")]
    assert launched[("words__compare", "strict")].endswith(":strict")
    assert again.run_requests == [] and "no job here yet" not in (again.skip_message or "")
    assert sorted(r.tags["agentenv/variant"] for r in changed.run_requests) == ["base", "strict"]  # the experiment only
    assert {r.job_name for r in changed.run_requests} == {"words__compare"}
    assert run.success and passed == {"r1|strict": True, "r2|strict": True, "r3|strict": False}  # the new prompt ran


def test_a_launch_runs_each_replicate_repeats_and_trials_ask_for(project):
    (project / "experiments" / "compare.yaml").write_text(
        COMPARE.replace("  - variant_id: strict\n", "  - variant_id: strict\n    repeats: 2\n"))
    sensor = build_definitions(project / "tasks", strict=True).get_repository_def().get_sensor_def("agentenv_task_files")

    def launched(tick) -> list[tuple[str, str | None, str | None]]:
        return sorted((r.job_name, r.tags.get("agentenv/variant"), r.tags.get("agentenv/replicate"))
                      for r in tick.run_requests)

    with dg.instance_for_test() as instance:
        first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance))
        (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra="").replace(  # a simulation now:
            "sandbox: {python: null}", "sandbox: {python: null}\nsimulation: {enabled: true, persona: a user, goal: say hi, n_trials: 3}"))
        reloaded = build_definitions(project / "tasks", strict=True)  # other steps: the location is reloaded
        trials = reloaded.get_repository_def().get_sensor_def("agentenv_task_files").evaluate_tick(
            dg.build_sensor_context(instance=instance, cursor=first.cursor))
    assert launched(first) == [("words", None, None), ("words__compare", "base", None),
                               ("words__compare", "strict", "0"), ("words__compare", "strict", "1")]
    assert len({r.run_key for r in first.run_requests}) == 4
    # a simulation's trials are its replicates, and take precedence over an experiment's repeats
    assert launched(trials) == sorted([("words", None, str(i)) for i in range(3)]
                                      + [("words__compare", v, str(i)) for v in ("base", "strict") for i in range(3)])


def test_the_example_dataset_task_and_its_experiment_run_as_the_readme_says(tmp_path):
    root = make_project(tmp_path / "p", extra_config='[experiments]\n"experiments/triage_prompts.yaml" = ["triage-tickets"]\n')
    shutil.copytree(REPO / "experiments", root / "experiments")
    done = cli(root, "run", "tasks/triage_tickets.yaml", "--experiment", "experiments/triage_prompts.yaml", "--output-dir", "o")
    assert done.returncode == 0, done.stdout + done.stderr
    for variant in ("full", "terse"):
        (gate,) = json.loads((root / "o" / variant / "triage-tickets" / "suite.json").read_text())["criterion_aggregates"]
        assert (gate["metrics"]["accuracy"], gate["metrics"]["macro_f1"], gate["passed"]) == (1.0, 1.0, True)
        assert [label["label"] for label in gate["details"]["per_label"]] == ["billing", "bug", "question"]
    defs = build_definitions(root / "tasks", strict=True)
    job = defs.resolve_job_def("triage_tickets__triage_prompts")
    assert len(job.partitions_def.get_partition_keys()) == 12  # 6 tickets x 2 prompts
    suite = dg.AssetKey(["suites", "triage_tickets__triage_prompts"])
    with dg.DagsterInstance.from_config(str(root / ".dagster_home")) as instance:
        records = instance.fetch_materializations(suite, limit=10).records
    assert {r.asset_materialization.partition: r.asset_materialization.metadata["rows_run"].value for r in records} == {
        "full": 6, "terse": 6}
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.mark.slow
def test_the_daemon_rolls_a_suite_up_again_after_its_rows_ran(project):
    """The suites' automation sensor (running by default) requests a variant's suite once
    rows of that variant were updated, and only then."""
    defs = build_definitions(project / "tasks", strict=True)
    sensor = defs.get_repository_def().get_sensor_def("agentenv_suites")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    suites = dg.AssetSelection.keys(SUITE, dg.AssetKey(["suites", "words"]))
    with dg.instance_for_test() as instance:
        first = dg.evaluate_automation_conditions(defs, instance, asset_selection=suites)
        job = defs.resolve_job_def("words__compare")
        for key in ("r1|strict", "r2|strict"):
            assert job.execute_in_process(instance=instance, partition_key=key).success
        after_rows = dg.evaluate_automation_conditions(defs, instance, asset_selection=suites, cursor=first.cursor)
        requested = {key: after_rows.get_requested_partitions(key) for key in (SUITE, dg.AssetKey(["suites", "words"]))}
        again = dg.evaluate_automation_conditions(defs, instance, asset_selection=suites, cursor=after_rows.cursor)
    assert first.total_requested == 0  # nothing ran yet
    assert requested == {SUITE: {"strict"}, dg.AssetKey(["suites", "words"]): set()}  # the variant whose rows ran
    assert again.total_requested == 0  # requested once


@pytest.mark.slow
def test_a_variant_s_suite_counts_every_replicate_as_upstream_s_does(project):
    (project / "experiments" / "compare.yaml").write_text(
        COMPARE.replace("  - variant_id: base\n", "  - variant_id: base\n    repeats: 2\n"))
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "words.yaml", load_config(project), instance=instance,
                                   output_dir=project / "out", experiment=project / "experiments" / "compare.yaml")
        replicates = sorted((r.asset_materialization.partition, r.asset_materialization.metadata["replicate"].value)
                            for r in instance.fetch_materializations(VERIFICATION, limit=20).records)
        rolled = {r.asset_materialization.partition: r.asset_materialization.metadata
                  for r in instance.fetch_materializations(SUITE, limit=10).records}
    assert replicates == sorted([(f"{row}|base", i) for row in ("r1", "r2", "r3") for i in (0, 1)]
                                + [(f"{row}|strict", 0) for row in ("r1", "r2", "r3")])  # each says which it is
    by_variant = {suite["variant_id"]: suite for suite in done.suites}
    assert by_variant["base"]["rows_total"] == rolled["base"]["rows_run"].value == 6  # 3 rows x 2 replicates
    assert rolled["base"]["rows_total"].value == 6  # row-tasks, as upstream counts them
    assert by_variant["strict"]["rows_total"] == rolled["strict"]["rows_run"].value == 3
    assert rolled["base"]["pass_rate"].value == pytest.approx(by_variant["base"]["pass_rate"])
