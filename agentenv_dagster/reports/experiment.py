"""Experiment reports: one aggregate per variant, and per task which variant did best
(upstream ``VariantAggregate`` / ``ExperimentResult``, written as variant.json / experiment.json)."""

from __future__ import annotations

from statistics import fmean
from typing import Any

from .results import EvaluationResult


def variant_aggregate(variant_id: str, results: list[EvaluationResult]) -> dict[str, Any]:
    """Counts by category; the average score counts errors as 0 (they were measured)."""
    categories = [r.final_status.category for r in results]
    measured = [r for r in results if r.final_status.category != "ungraded"]
    graded = len(measured)
    return {
        "variant_id": variant_id, "tasks_run": len(results),
        "tasks_succeeded": categories.count("succeeded"), "tasks_failed": categories.count("failed"),
        "tasks_error": categories.count("error"), "tasks_not_graded": categories.count("ungraded"),
        "average_score": fmean(r.weighted_score or 0.0 for r in measured) if measured else None,
        "average_duration": fmean(r.duration_seconds for r in results) if results else None,
        "total_tokens": sum((r.total_token_usage.total_tokens if r.total_token_usage else 0) for r in results),
        "replicate_count": len({r.replicate_index for r in results}),
        "pass_rate": categories.count("succeeded") / graded if graded else None,
        "error_share": categories.count("error") / graded if graded else None,
    }


def experiment_result(
    experiment_id: str, description: str, variant_ids: list[str], results: list[EvaluationResult],
) -> dict[str, Any]:
    by_variant = {v: [r for r in results if r.variant_id == v] for v in variant_ids}
    task_ids = sorted({r.task_id for r in results})
    summaries = []
    for task_id in task_ids:
        scores = {
            v: fmean(r.weighted_score or 0.0 for r in rows) if rows else None
            for v in variant_ids if (rows := [r for r in by_variant[v] if r.task_id == task_id])
        }
        known = {v: s for v, s in scores.items() if s is not None}
        best = max(known.values(), default=None)
        leaders = [v for v, s in known.items() if s == best]
        summaries.append({
            "task_id": task_id, "variant_results": scores, "best_variant": leaders[0] if leaders else None,
            "is_tie": len(leaders) > 1, "score_spread": (best - min(known.values())) if known else None,
            "replicate_count": max(len({r.replicate_index for r in by_variant[v] if r.task_id == task_id})
                                   for v in variant_ids),
        })
    return {
        "experiment_id": experiment_id, "description": description, "variant_ids": variant_ids,
        "task_summaries": summaries,
        "variant_aggregates": {v: variant_aggregate(v, rows) for v, rows in by_variant.items()},
        "total_duration_seconds": sum(r.duration_seconds for r in results),
        "per_replicate_scores": {
            v: {task_id: [r.weighted_score for r in sorted(rows, key=lambda r: r.replicate_index) if r.task_id == task_id]
                for task_id in task_ids}
            for v, rows in by_variant.items()
        },
    }
