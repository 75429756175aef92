"""The suite rollup of a dataset task: its row-tasks' results aggregated per criterion, with
``suite_thresholds`` as the gate (upstream ``SuiteRollup``, written as ``suite.json``)."""

from __future__ import annotations

from dataclasses import asdict
from statistics import fmean
from typing import Any

from ..criteria.aggregate import aggregate
from ..criteria.base import CriterionResult
from .results import EvaluationResult, FinalStatus

FAILED_SAMPLES = 20
INCOMPLETE = (FinalStatus.ERROR, FinalStatus.TIMEOUT, FinalStatus.BUILD_FAILED)


def suite_rollup(
    suite_id: str, results: list[EvaluationResult], thresholds: list[dict[str, float] | None],
    variant_id: str = "default",
) -> dict[str, Any]:
    """``thresholds[i]`` gates criterion ``i``; rows that did not complete (error, timeout)
    are left out of the aggregates and lower ``completion_rate``."""
    categories = [r.final_status.category for r in results]
    graded = [r for r in results if r.final_status.category != "ungraded"]
    completed = [r for r in results if r.final_status not in INCOMPLETE]
    aggregates = []
    suite_metrics = {"completion_rate": len(completed) / len(results) if results else 0.0}
    for index, gate in enumerate(thresholds):
        rows = [_criterion(r.success_criteria_results[index]) for r in completed
                if index < len(r.success_criteria_results)]
        found = aggregate(rows, gate, suite_metrics)
        if found is None:
            if gate:
                aggregates.append({"criterion_index": index, "metrics": {}, "passed": False,
                                   "checks": [{"metric": m, "min_value": v, "actual_value": None, "passed": False}
                                              for m, v in gate.items()]})
            continue
        aggregates.append({"criterion_index": index, **asdict(found), "passed": found.passed})
    scores = [r.weighted_score for r in graded if r.weighted_score is not None]
    return {
        "suite_id": suite_id, "variant_id": variant_id,
        "rows_total": len(results), "rows_passed": categories.count("succeeded"),
        "rows_failed": categories.count("failed"), "rows_error": categories.count("error"),
        "rows_not_graded": categories.count("ungraded"), "rows_graded": len(graded),
        "pass_rate": categories.count("succeeded") / len(graded) if graded else None,
        "average_weighted_score": fmean(scores) if scores else None,
        "failed_samples": [
            {"task_id": r.task_id, "status": r.final_status.value, "weighted_score": r.weighted_score}
            for r in results if r.final_status.category != "succeeded"
        ][:FAILED_SAMPLES],
        "criterion_aggregates": aggregates,
        "passed": all(a["passed"] for a in aggregates),
    }


def _criterion(row) -> CriterionResult:
    return CriterionResult(
        criterion_type=row.criterion_type, description=row.description, score=row.score,
        result_kind=row.result_kind, observed_label=row.observed_label, expected_label=row.expected_label,
        pass_threshold=row.pass_threshold,
    )
