"""One criterion's results across a suite's rows: score statistics, classification metrics for
labelled results, and the ``suite_thresholds`` gate over them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from statistics import fmean, median, pstdev
from typing import Any

from .base import CriterionResult


@dataclass
class ThresholdCheck:
    metric: str
    min_value: float
    actual_value: float | None  # None: the metric was never produced, which fails the check
    passed: bool


@dataclass
class CriterionAggregate:
    criterion_type: str
    description: str
    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    checks: list[ThresholdCheck] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def metric(self, name: str) -> float:
        """A metric by name; one never produced reads as 0.0."""
        return self.metrics.get(name, 0.0)


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def classification_metrics(pairs: list[tuple[str, str]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Accuracy and per-label / macro / weighted / micro precision-recall-F1 over (expected, observed)."""
    labels = sorted({label for pair in pairs for label in pair})
    metrics: dict[str, float] = {"accuracy": _ratio(sum(e == o for e, o in pairs), len(pairs))}
    per_label, totals = [], Counter()
    for label in labels:
        tp = sum(e == o == label for e, o in pairs)
        fp = sum(o == label != e for e, o in pairs)
        fn = sum(e == label != o for e, o in pairs)
        support = sum(e == label for e, _ in pairs)
        precision, recall = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
        f1 = _ratio(2 * precision * recall, precision + recall)
        metrics.update({f"precision.{label}": precision, f"recall.{label}": recall, f"f1.{label}": f1})
        per_label.append({"label": label, "precision": precision, "recall": recall, "f1": f1, "support": support})
        totals.update(tp=tp, fp=fp, fn=fn)
    metrics["macro_f1"] = fmean(row["f1"] for row in per_label)
    metrics["weighted_f1"] = _ratio(sum(row["f1"] * row["support"] for row in per_label), len(pairs))
    micro_p = _ratio(totals["tp"], totals["tp"] + totals["fp"])
    micro_r = _ratio(totals["tp"], totals["tp"] + totals["fn"])
    metrics["micro_f1"] = _ratio(2 * micro_p * micro_r, micro_p + micro_r)
    confusion = [{"expected": e, "observed": o, "count": n} for (e, o), n in sorted(Counter(pairs).items())]
    return metrics, {"labels": labels, "per_label": per_label, "confusion": confusion, "total_pairs": len(pairs)}


def aggregate(
    results: list[CriterionResult], suite_thresholds: dict[str, float] | None = None,
    suite_metrics: dict[str, float] | None = None,
) -> CriterionAggregate | None:
    """Statistics of one criterion over its rows (graded ones only); None when none was graded.
    ``suite_metrics`` are metrics of the whole suite (``completion_rate``) a threshold may name."""
    graded = [r for r in results if r.score is not None]
    if not graded:
        return None
    scores = [r.score for r in graded]
    metrics = {"count": float(len(scores)), "mean": fmean(scores), "median": median(scores),
               "std": pstdev(scores), "min": min(scores), "max": max(scores), **(suite_metrics or {})}
    details: dict[str, Any] = {}
    pairs = [(r.expected_label, r.observed_label) for r in graded
             if r.result_kind == "classification" and r.expected_label is not None and r.observed_label is not None]
    if pairs:
        labelled, details = classification_metrics(pairs)  # type: ignore[arg-type]
        metrics.update(labelled)
    checks = [
        ThresholdCheck(name, minimum, metrics.get(name), name in metrics and metrics[name] >= minimum)
        for name, minimum in (suite_thresholds or {}).items()
    ]
    return CriterionAggregate(graded[0].criterion_type, graded[0].description, metrics, details, checks)
