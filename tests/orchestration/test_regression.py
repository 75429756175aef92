"""The regression gate: `no_regression` compares each new score with the median of the
earlier ones (of the same partition) and fails on a drop; `run --fail-on-regression` turns
a failed check into exit 1."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.config import RegressionSettings, load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from agentenv_dagster.orchestration.dagster_internals import CODE_VERSION_TAG, run_check_evaluations
from agentenv_dagster.orchestration.regression import REGRESSION_CHECK, score_evaluation, suite_check_result
from projects import FIXTURES, leaked_servers, make_project

TASK = FIXTURES / "coder_eval" / "grade_two_files.yaml"
SCORE_KEY = dg.AssetKey(["verifications", "grade_two_files", "success_criteria"])


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", tasks={})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.fixture
def workspace(tmp_path):
    """A finished workspace holding both files the task grades (score 1.0)."""
    folder = tmp_path / "workspace"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("done\n")
    return folder


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def regression_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("regression:")]


def no_regression_of(instance: dg.DagsterInstance, run_id: str) -> dg.AssetCheckEvaluation:
    (evaluation,) = [e for e in run_check_evaluations(instance, run_id) if e.check_name == REGRESSION_CHECK]
    return evaluation


@pytest.mark.slow  # four CLI runs
def test_a_score_passes_without_a_baseline_and_with_one_then_fails_on_a_drop_and_the_flag_exits_1(
        project, workspace):
    graded = (str(TASK), "--grade-only", str(workspace))
    first = cli(project, *graded, "--fail-on-regression")
    second = cli(project, *graded, "--fail-on-regression")
    for done in (first, second):
        assert done.returncode == 0, done.stdout + done.stderr[-2000:]
        assert "+ grade_two_files: SUCCESS (score 1.000)" in done.stdout and regression_lines(done) == []

    (workspace / "b.txt").unlink()  # half the score
    dropped = cli(project, *graded)
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr[-2000:]  # the task still passes
    assert "+ grade_two_files: SUCCESS (score 0.500)" in dropped.stdout
    assert regression_lines(dropped) == [
        "regression: verifications/grade_two_files/success_criteria: score 0.500 is 0.500 below the median "
        "1.000 of the last 2 (max_drop 0.1)"]
    gated = cli(project, *graded, "--fail-on-regression")
    assert gated.returncode == 1, gated.stdout + gated.stderr[-2000:]
    assert regression_lines(gated) == [
        "regression: verifications/grade_two_files/success_criteria: score 0.500 is 0.500 below the median "
        "1.000 of the last 3 (max_drop 0.1)"]

    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        runs = [r.dagster_run.run_id for r in instance.get_run_records(ascending=True)
                if r.dagster_run.job_name == "grade_two_files"]
        assert len(runs) == 4
        checks = [no_regression_of(instance, run_id) for run_id in runs]
    metadata = [{k: v.value for k, v in check.metadata.items()} for check in checks]
    assert [c.passed for c in checks] == [True, True, False, False]
    assert metadata[0]["baseline"] == "no baseline yet (0 earlier score(s), needs 1)"
    assert (metadata[1]["baseline_median"], metadata[1]["drop"], metadata[1]["baseline_runs"]) == (1.0, 0.0, [runs[0]])
    assert metadata[2]["score"] == 0.5 and metadata[2]["baseline_median"] == 1.0 and metadata[2]["drop"] == 0.5
    assert metadata[2]["baseline_runs"] == [runs[1], runs[0]] and metadata[2]["baseline_scores"] == [1.0, 1.0]
    assert checks[2].severity == dg.AssetCheckSeverity.ERROR and checks[2].blocking is False


def report(instance: dg.DagsterInstance, score: float | None, code_version: str = "v1") -> None:
    """An earlier materialization of the score (``None``: not graded)."""
    metadata = {"score": score} if score is not None else {"graded": False}
    instance.report_runless_asset_event(dg.AssetMaterialization(
        SCORE_KEY, metadata=metadata, tags={CODE_VERSION_TAG: code_version}))


@pytest.mark.parametrize("earlier, score, settings, passed, baseline", [
    # the median of the last `window`: one low outlier does not move it
    ([0.9, 0.9, 0.2, 0.9], 0.75, {"window": 3, "max_drop": 0.2}, True, 0.9),
    ([0.9, 0.9, 0.2, 0.9], 0.75, {"window": 3, "max_drop": 0.1}, False, 0.9),
    # only the last `window` count: an old high score is out of it
    ([1.0, 0.5, 0.5, 0.5], 0.45, {"window": 3}, True, 0.5),
    # not graded earlier runs have no score to count
    ([0.8, None, None], 0.5, {"window": 2, "min_history": 2}, True, None),
    ([0.8, None, 0.8], 0.5, {"window": 2, "min_history": 2}, False, 0.8),
    # a rise is never a regression
    ([0.2], 0.9, {}, True, 0.2),
])
@pytest.mark.parametrize("read_ahead", [None, 1, 2, 100])
def test_the_baseline_is_the_median_of_the_last_window_scores(earlier, score, settings, passed, baseline, read_ahead):
    """Alike whether the baseline reads the scores itself or is handed the newest records read
    already (``read_ahead`` of them: all there are, or too few, when it reads the rest itself)."""
    with dg.instance_for_test() as instance:
        for value in earlier:
            report(instance, value)
        page = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=SCORE_KEY), limit=read_ahead or 1)
        newest = (list(page.records), not page.has_more) if read_ahead else None
        evaluation = score_evaluation(instance, SCORE_KEY, None, score, RegressionSettings(**settings),
                                      judged_run="this-run", code_version="v1", newest=newest)
    assert evaluation.passed is passed
    assert evaluation.metadata.get("baseline_median", dg.MetadataValue.text("none")).value == (
        baseline if baseline is not None else "none")


def test_same_code_version_starts_a_new_baseline_and_not_graded_passes():
    with dg.instance_for_test() as instance:
        for value, version in ((1.0, "old"), (1.0, "old"), (0.4, "new")):
            report(instance, value, version)
        across = score_evaluation(instance, SCORE_KEY, None, 0.4, RegressionSettings(),
                                  judged_run=None, code_version="new")
        same = score_evaluation(instance, SCORE_KEY, None, 0.4, RegressionSettings(same_code_version=True),
                                judged_run=None, code_version="new")
        not_graded = score_evaluation(instance, SCORE_KEY, None, None, RegressionSettings(),
                                      judged_run=None, code_version="new")
    assert not across.passed and across.metadata["baseline_median"].value == 1.0
    assert same.passed and same.metadata["baseline_scores"].value == [0.4]
    assert not_graded.passed and not_graded.description == "not graded: no score to compare"


def test_a_suite_regresses_when_a_metric_drops_below_its_baseline():
    key = dg.AssetKey(["suites", "tickets"])
    with dg.instance_for_test() as instance:
        for rate in (1.0, 0.75):
            instance.report_runless_asset_event(dg.AssetMaterialization(key, metadata={
                "pass_rate": rate, "average_weighted_score": 0.9, "criterion_1/accuracy": 0.8}))
        result = suite_check_result(instance, key, None, {"pass_rate": 0.5, "average_weighted_score": 0.88,
                                                           "criterion_1/accuracy": 0.8}, RegressionSettings())
    assert not result.passed
    assert result.metadata["regressed"].value == ["pass_rate"]
    assert result.description == "pass_rate 0.500 is 0.375 below the median 0.875 of the last 2 (max_drop 0.1)"
    rows = {r.data["metric"]: r.data for r in result.metadata["metrics"].value.records}
    assert rows["average_weighted_score"]["regressed"] is False and rows["pass_rate"]["drop"] == 0.375


def test_every_verification_and_suite_declares_no_regression_as_configured(tmp_path):
    root = make_project(tmp_path / "p")
    config = root / ".agentenv" / "config.toml"
    config.write_text(config.read_text() + textwrap.dedent("""
        [regression]
        blocking = true
        [regression.tasks.hello-python]
        enabled = false
    """))
    graph = build_definitions(root / "tasks").resolve_asset_graph()
    gates = {key.asset_key.to_user_string(): graph.get_check_spec(key).blocking for key in graph.asset_check_keys
             if key.name == REGRESSION_CHECK}
    assert gates["verifications/reply_to_dana/sent"] is True
    assert gates["verifications/reply_to_dana/tone"] is True
    assert gates["suites/triage_tickets"] is True
    assert not any(key.startswith("verifications/hello_python") for key in gates)


def graded_then_dropped(project, workspace, config, instance):
    """The task graded on the workspace as it is, then again with one of its files gone (a
    lower score): both runs' results."""
    first = run_coder_eval_task(TASK, config, instance=instance, grade_only_from=workspace,
                                output_dir=project / "out" / "first")
    (workspace / "b.txt").unlink()
    dropped = run_coder_eval_task(TASK, config, instance=instance, grade_only_from=workspace,
                                  output_dir=project / "out" / "dropped")
    return first, dropped


def test_a_blocking_gate_fails_the_run_that_regressed(project, workspace):
    (project / ".agentenv" / "config.toml").write_text(
        (project / ".agentenv" / "config.toml").read_text() + "\n[regression]\nblocking = true\n")
    config = load_config(project)
    with dg.instance_for_test() as instance:
        first, dropped = graded_then_dropped(project, workspace, config, instance)
        statuses = [instance.get_run_by_id(run_id).status for run_id in (*first.run_ids, *dropped.run_ids)]
        check = no_regression_of(instance, dropped.run_ids[0])
    assert statuses == [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
    assert not check.passed and check.blocking is True


def test_the_check_executed_alone_judges_the_latest_score_against_the_ones_before(project, workspace):
    shutil.copy(TASK, project / "tasks" / TASK.name)
    config = load_config(project)
    key = dg.AssetCheckKey(SCORE_KEY, REGRESSION_CHECK)
    with dg.instance_for_test() as instance:
        first, dropped = graded_then_dropped(project, workspace, config, instance)
        alone = build_definitions(project / "tasks").resolve_implicit_global_asset_job_def().get_subset(
            asset_check_selection={key})
        (evaluation,) = alone.execute_in_process(instance=instance).get_asset_check_evaluations()
    metadata = {k: v.value for k, v in evaluation.metadata.items()}
    assert not evaluation.passed and evaluation.check_name == REGRESSION_CHECK
    assert metadata["from_run"] == dropped.run_ids[0] and metadata["baseline_runs"] == first.run_ids
    assert (metadata["score"], metadata["baseline_median"]) == (0.5, 1.0)
