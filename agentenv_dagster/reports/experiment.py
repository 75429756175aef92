"""Experiment reports: one aggregate per variant, and per task which variant did best
(upstream ``VariantAggregate`` / ``ExperimentResult``, written as variant.json / experiment.json),
and the variants side by side for task.html (``variant_comparison``)."""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ComparedRow:
    """One task row (and replicate) under each variant, with each variant's score minus the
    baseline's (the first variant); None where either was not scored."""

    task_id: str
    replicate_index: int
    results: dict[str, EvaluationResult]
    deltas: dict[str, float | None]

    @property
    def category(self) -> str:
        """The row's worst outcome over the variants, for the page's filter."""
        categories = {r.final_status.category for r in self.results.values()}
        return next((c for c in ("error", "failed", "ungraded") if c in categories), "succeeded")


@dataclass(frozen=True)
class VariantComparison:
    """The variants side by side, for task.html: their aggregates and every row's scores."""

    variant_ids: list[str]
    aggregates: dict[str, dict[str, Any]]
    rows: list[ComparedRow]

    @property
    def baseline(self) -> str:
        return self.variant_ids[0]

    def average_delta(self, variant_id: str) -> float | None:
        mine, base = (self.aggregates[v]["average_score"] for v in (variant_id, self.baseline))
        return None if mine is None or base is None else mine - base


def variant_comparison(results: list[EvaluationResult]) -> VariantComparison | None:
    """The run's variants compared row by row, in the order they ran; None for a single variant."""
    variant_ids = list(dict.fromkeys(r.variant_id for r in results))
    if len(variant_ids) < 2:
        return None
    by_row: dict[tuple[str, int], dict[str, EvaluationResult]] = {}
    for result in results:
        by_row.setdefault((result.task_id, result.replicate_index), {})[result.variant_id] = result
    rows = []
    for (task_id, replicate), found in by_row.items():
        base = found.get(variant_ids[0])
        deltas = {
            v: r.weighted_score - base.weighted_score
            if base is not None and r.weighted_score is not None and base.weighted_score is not None else None
            for v, r in found.items() if v != variant_ids[0]
        }
        rows.append(ComparedRow(task_id, replicate, found, deltas))
    aggregates = {v: variant_aggregate(v, [r for r in results if r.variant_id == v]) for v in variant_ids}
    return VariantComparison(variant_ids, aggregates, rows)
