"""Score aggregators shared by every verifier (agent-env ``verifiers/scoring.py``)."""

from __future__ import annotations

from typing import Any, Literal

ScoreAggregator = Literal["all_pass", "any_pass", "weighted_average"]


def row_score(row: dict[str, Any]) -> float:
    score = row.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool):
        return float(score)
    return 1.0 if row.get("result") is True else 0.0


def aggregate(rows: list[dict[str, Any]], aggregator: ScoreAggregator) -> float:
    """``all_pass``/``any_pass`` read ``result``; ``weighted_average`` weighs scores, where a
    negative weight subtracts ``(1 - score) * |w|``; empty or no positive weight -> 0."""
    if not rows:
        return 0.0
    if aggregator == "all_pass":
        return 1.0 if all(r.get("result") is True for r in rows) else 0.0
    if aggregator == "any_pass":
        return 1.0 if any(r.get("result") is True for r in rows) else 0.0
    numerator = denominator = 0.0
    for row in rows:
        weight = row.get("weight", 1)
        weight = 1.0 if weight is None else float(weight)
        score = row_score(row)
        if weight > 0:
            numerator += score * weight
            denominator += weight
        elif weight < 0:
            numerator -= (1.0 - score) * abs(weight)
    if denominator <= 0:
        return 0.0
    return min(1.0, max(0.0, numerator / denominator))


def verification_passed(entry: dict[str, Any]) -> bool | None:
    """Pass/fail of a verification entry: its own verdict when it has one (Coder Eval), else
    score 1.0 passes; not graded is unknown (None)."""
    if "passed" in entry:
        return entry["passed"]
    score = entry.get("score")
    if score is None:
        return None
    threshold = entry.get("pass_threshold", 1.0)
    return float(score) >= float(threshold)
