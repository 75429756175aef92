"""A Coder Eval task under an experiment is a job of its own, partitioned by variant x row:
each partition runs its variant's resolved steps on its row, and the CLI's experiment runs
materialize the same partitions."""

from __future__ import annotations

import json
import textwrap

import dagster as dg
import pytest
from test_coder_eval_run import WORDS_TASK, cli

from agentenv_dagster import build_definitions
from agentenv_dagster.config import load_config
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from projects import leaked_servers, make_project

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


def test_an_experiment_s_job_is_partitioned_by_variant_and_row(project):
    defs = build_definitions(project / "tasks", strict=True)
    job = defs.get_job_def("words__compare")
    partitions = job.partitions_def
    assert isinstance(partitions, dg.MultiPartitionsDefinition)
    assert sorted(partitions.get_partition_keys()) == sorted(
        f"{row}|{variant}" for row in ("r1", "r2", "r3") for variant in ("base", "strict"))
    assert defs.resolve_asset_graph().get(VERIFICATION).partitions_def == partitions
    assert defs.get_job_def("words").partitions_def.get_partition_keys() == ["r1", "r2", "r3"]  # the task's own job stays
    config = job.partitioned_config.get_run_config_for_partition_key("r2|strict")
    assert config["ops"]["prompt"]["config"]["step"]["prompt"] == "Do <row.word>"  # the variant's steps
    assert config["ops"]["sandbox"]["config"]["rows"] == {"r2|strict": {"row.word": "yo"}}
    assert job.partitioned_config.get_tags_for_partition_key("r2|strict")["agentenv/variant"] == "strict"
    base = job.partitioned_config.get_run_config_for_partition_key("r2|base")
    assert base["ops"]["prompt"]["config"]["step"]["prompt"] == "Say <row.word>"
    with dg.instance_for_test() as instance:
        for key in ("r1|base", "r1|strict"):
            assert job.execute_in_process(instance=instance, partition_key=key).success
        statuses = instance.get_status_by_partition(VERIFICATION, ["r1|base", "r1|strict", "r2|base"], partitions)
        assert passed_by_partition(instance) == {"r1|base": True, "r1|strict": False}
    assert statuses["r1|base"] == statuses["r1|strict"] == dg.AssetPartitionStatus.MATERIALIZED
    assert statuses["r2|base"] is None


def test_a_run_that_names_no_partition_runs_the_variant_its_tag_names(project):
    job = build_definitions(project / "tasks").get_job_def("words__compare")
    config = job.partitioned_config.get_run_config_for_partition_key("r1|strict")
    for node in config["ops"].values():
        node["config"].pop("rows", None)
    with dg.instance_for_test() as instance:
        done = job.execute_in_process(instance=instance, run_config=config, tags={"agentenv/variant": "strict"})
        assert sorted(passed_by_partition(instance)) == ["r1|strict", "r2|strict", "r3|strict"]
        untagged = job.execute_in_process(instance=instance, run_config=config, raise_on_error=False)
    assert done.success
    assert not untagged.success
    failure = next(e for e in untagged.all_events if e.event_type_value == "STEP_FAILURE")
    assert "an experiment job runs one variant a run" in failure.event_specific_data.error.message


def test_the_cli_runs_an_experiment_as_the_partitions_of_its_job(project):
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "words.yaml", load_config(project), instance=instance,
                                   output_dir=project / "out", experiment=project / "experiments" / "compare.yaml")
        passed = passed_by_partition(instance)
        runs = [r for r in instance.get_runs() if r.job_name == "words__compare"]
    assert passed == {"r1|base": True, "r2|base": True, "r3|base": False,
                      "r1|strict": False, "r2|strict": False, "r3|strict": False}
    assert sorted(r.tags["agentenv/variant"] for r in runs) == ["base", "strict"]  # one run a variant
    assert sorted((r.variant_id, r.task_id) for r in done.results) == [
        (v, f"words/{row}") for v in ("base", "strict") for row in ("r1", "r2", "r3")]
    report = json.loads((project / "out" / "experiment.json").read_text())
    assert report["variant_ids"] == ["base", "strict"]
    # and through the CLI, in the project's own instance
    again = cli(project, "run", "tasks/words.yaml", "--experiment", "experiments/compare.yaml", "--output-dir", "o")
    assert again.returncode == 1, again.stdout + again.stderr
    assert "words/r3" in again.stdout


def test_variants_that_lower_to_other_steps_are_an_error_of_the_experiment_file(project, caplog):
    (project / "experiments" / "compare.yaml").write_text(
        COMPARE + "  - variant_id: talk\n    simulation: {enabled: true, persona: a user, goal: say hi}\n")
    (project / ".agentenv" / "config.toml").write_text(
        (project / ".agentenv" / "config.toml").read_text().replace('["words"]', '["words", "nope"]'))
    defs = build_definitions(project / "tasks")
    assert defs.get_job_def("words").partitions_def is not None  # the task's own job is untouched
    assert "compare__invalid" in {j.name for j in defs.jobs}
    assert "variant 'talk' lowers to other steps than variant 'base'" in caplog.text
    assert "[experiments] no Coder Eval task 'nope' in the code location" in caplog.text
    with pytest.raises(TaskLoadError, match="compare.yaml.*variants.talk"):
        build_definitions(project / "tasks", strict=True)
