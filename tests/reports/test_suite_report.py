"""suite.md: a suite's counts, thresholds, metrics and confusion matrix as Markdown (written
beside suite.json, and the suite asset's summary in Dagster)."""

from __future__ import annotations

import json

from agentenv_dagster.reports.render import write_suite
from agentenv_dagster.reports.results import EvaluationResult, FinalStatus
from agentenv_dagster.reports.suite import suite_rollup


def labelled(row: str, expected: str, observed: str) -> EvaluationResult:
    right = expected == observed
    return EvaluationResult(
        task_id=f"tickets/{row}", final_status=FinalStatus.SUCCESS if right else FinalStatus.FAILURE,
        weighted_score=1.0 if right else 0.0,
        success_criteria_results=[{"criterion_type": "classification_match", "description": "the | label",
                                   "score": 1.0 if right else 0.0, "result_kind": "classification",
                                   "expected_label": expected, "observed_label": observed}],
    )


def test_a_classification_suite_reads_as_tables_with_its_confusion_matrix(tmp_path):
    results = [labelled("a", "bug", "bug"), labelled("b", "bug", "billing"), labelled("c", "billing", "billing")]
    suite = suite_rollup("tickets", results, [{"accuracy": 0.9}], variant_id="terse")
    write_suite(tmp_path / "terse" / "tickets", suite)
    assert json.loads((tmp_path / "terse" / "tickets" / "suite.json").read_text())["passed"] is False
    text = (tmp_path / "terse" / "tickets" / "suite.md").read_text()
    assert "## Suite `tickets` (terse): FAILED" in text
    assert "### Criterion 1: the \\| label (`classification_match`)" in text  # a cell's pipe is escaped
    assert "| accuracy | 0.9 | 0.67 | SHORT |" in text
    assert "| count | 3 |" in text and "| f1.bug | 0.67 |" in text
    assert "| | billing | bug |" in text
    assert "| **billing** | 1 | 0 |" in text and "| **bug** | 1 | 1 |" in text  # expected bug, observed billing once
    assert "| tickets/b | FAILURE | 0.00 |" in text  # the row that did not pass


def test_a_suite_whose_rows_all_errored_still_reads(tmp_path):
    errored = EvaluationResult(task_id="t/a", final_status=FinalStatus.ERROR, weighted_score=None)
    suite = suite_rollup("t", [errored], [{"mean": 0.5}])
    write_suite(tmp_path, suite)
    text = (tmp_path / "suite.md").read_text()
    assert "## Suite `t` (default): FAILED" in text
    assert "| mean | 0.5 | – | SHORT |" in text  # no aggregate: the threshold has nothing to read
    assert "Confusion" not in text
