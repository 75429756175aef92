"""The judge output formats of ``rubrics_verifier`` (agent-env ``judge_output_format.py``).

Each format has its judge instructions, the verdict schema the LLM judge must fill through the
forced ``submit_verdict`` tool, and the rule that turns one judge item into a row. Criteria are
sent re-keyed ``c1..cN``; rows carry the author's ids again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from ..criteria.judge_prompt import excerpt, shape_problem

#: formats a local runtime can serve; the evidence ones need screenshot trajectory compaction
LOCAL_FORMATS = ("rubric_binary", "rubric_partial", "trajectory_mistakes")
EVIDENCE_FORMATS = ("rubric_evidence", "rubric_evidence_with_mistakes")

_RESULT_ITEM = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "score": {"type": "number"},
        "justification": {"type": "string"},
    },
    "required": ["id", "score", "justification"],
}
_MISTAKE_ITEM = {
    "type": "object",
    "properties": {
        "criterion_id": {"type": "string"},
        "step": {"type": "string"},
        "description": {"type": "string"},
        "severity": {"type": "string", "enum": ["minor", "major", "critical"]},
    },
    "required": ["criterion_id", "description"],
}


@dataclass(frozen=True)
class JudgeFormat:
    name: str
    instructions: str
    schema: dict[str, Any]
    example: dict[str, Any]

    def reply_instruction(self) -> str:
        return (
            f"Reply with JSON only, in this shape: {json.dumps(self.example)}, "
            "with exactly one result per criterion id."
        )


_BINARY = (
    "Judge each criterion PASS or FAIL and give it a score of exactly 1.0 (PASS) or 0.0 "
    "(FAIL). A criterion marked \"negative\": true describes a mistake: decide explicitly "
    "whether it is PRESENT or ABSENT, and score 1.0 only when it is ABSENT (PRESENT scores "
    "0.0). Give each a brief justification."
)
_PARTIAL = (
    "Give each criterion a score from 0.0 to 1.0 for how fully the agent met it. For a "
    "criterion with \"outcomes\" given as labels with scores, use the score of the outcome "
    "that applies; for \"outcomes\" given as a {\"min\", \"max\"} range, score within that "
    "range. A criterion marked \"negative\": true describes a mistake: score 1.0 when it is "
    "ABSENT and lower the more clearly it is PRESENT. Give each a brief justification."
)
_MISTAKES = (
    "Read the agent trajectory step by step and look for mistakes: wrong or needless tool "
    "calls, wrong facts, ignored instructions, unverified claims, unsafe actions. For each "
    "criterion decide whether the trajectory contains a mistake against it: score 1.0 when "
    "it contains none (the criterion is met) and 0.0 when it does. A criterion marked "
    "\"negative\": true describes a mistake itself: decide explicitly whether it is PRESENT "
    "or ABSENT, and score 1.0 only when it is ABSENT. List every mistake you found under "
    "\"mistakes\", each with the criterion id it violates, the step of the trajectory where "
    "it happened, a description and a severity (minor, major or critical). Give each result "
    "a brief justification."
)

FORMATS: dict[str, JudgeFormat] = {
    "rubric_binary": JudgeFormat(
        "rubric_binary", _BINARY,
        {"type": "object", "properties": {"results": {"type": "array", "items": _RESULT_ITEM}},
         "required": ["results"]},
        {"results": [{"id": "c1", "score": 1.0, "justification": "..."}]},
    ),
    "rubric_partial": JudgeFormat(
        "rubric_partial", _PARTIAL,
        {"type": "object", "properties": {"results": {"type": "array", "items": _RESULT_ITEM}},
         "required": ["results"]},
        {"results": [{"id": "c1", "score": 0.5, "justification": "..."}]},
    ),
    "trajectory_mistakes": JudgeFormat(
        "trajectory_mistakes", _MISTAKES,
        {"type": "object", "properties": {
            "results": {"type": "array", "items": _RESULT_ITEM},
            "mistakes": {"type": "array", "items": _MISTAKE_ITEM},
        }, "required": ["results", "mistakes"]},
        {"results": [{"id": "c1", "score": 0.0, "justification": "..."}],
         "mistakes": [{"criterion_id": "c1", "step": "3", "description": "...", "severity": "major"}]},
    ),
}
#: what the rest of the code base imports as the verdict schema (rubric_binary)
VERDICT_SCHEMA = FORMATS["rubric_binary"].schema


class MissingVerdict(ValueError):
    """The judge's reply holds no verdict object at all (no tool call, no JSON, no results list)."""


def agent_verdict(structured: Any, text: str | None) -> Any:
    """A judge agent's verdict: the structured output it returned, else its whole reply read
    as JSON (a ```json fence around all of it allowed). Never a JSON object found inside prose:
    that could be the graded agent's output, quoted, with a verdict of its own."""
    if isinstance(structured, (dict, list)):
        return structured
    stripped = (text or "").strip()
    if stripped.startswith("```") and stripped.endswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        raise MissingVerdict(f"the judge's reply is not JSON as a whole: {excerpt(text or '', 200)}") from None


def verdict_parts(verdict: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """``(results, mistakes)`` of a verdict: ``{"results": [...]}`` or a bare list. A verdict
    with no results list is missing (:class:`MissingVerdict`); non-object items are dropped
    (and then show up as an id mismatch)."""
    problem = shape_problem(verdict)
    if problem:
        raise MissingVerdict(f"the verdict is {problem}")
    mistakes: list[Any] = []
    if isinstance(verdict, dict):
        mistakes = verdict.get("mistakes") if isinstance(verdict.get("mistakes"), list) else []
        verdict = verdict.get("results")
    if not isinstance(verdict, list):
        raise MissingVerdict(f"the verdict has no results list (got {type(verdict).__name__})")
    return [item for item in verdict if isinstance(item, dict)], mistakes


def id_problem(items: list[dict[str, Any]], keys: list[str]) -> str | None:
    ids = [item.get("id") for item in items]
    missing = sorted(set(keys) - set(ids))
    unknown = sorted({str(i) for i in ids if i not in keys})
    duplicates = sorted({str(i) for i in ids if ids.count(i) > 1})
    if not (missing or unknown or duplicates) and len(ids) == len(keys):
        return None
    return "; ".join(
        f"{label}: {values}" for label, values in
        (("missing ids", missing), ("unknown ids", unknown), ("duplicate ids", duplicates)) if values
    ) or f"{len(ids)} results for {len(keys)} criteria"


def number(value: Any) -> float | None:
    """A finite float from a judge's score (numbers or numeric strings), else None."""
    if isinstance(value, bool):
        return None
    try:
        result = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return result if math.isfinite(result) else None


def _clamp(score: float) -> float:
    return min(1.0, max(0.0, score))


def _range(outcomes: Any) -> tuple[float, float] | None:
    candidate = outcomes
    if isinstance(outcomes, list) and len(outcomes) == 1:
        candidate = outcomes[0]
    if isinstance(candidate, dict) and "min" in candidate and "max" in candidate:
        lo, hi = number(candidate["min"]), number(candidate["max"])
        if lo is not None and hi is not None:
            return lo, hi
    return None


def partial_score(criterion: dict[str, Any], item: dict[str, Any], score: float) -> dict[str, Any]:
    """rubric_partial: discrete outcomes snapped, a {min, max} range normalised (``raw_score``
    kept), then clamped to [0, 1]; ``result`` against ``pass_threshold`` (default 0.5)."""
    outcomes = criterion.get("outcomes")
    fields: dict[str, Any] = {}
    bounds = _range(outcomes)
    if bounds is not None:
        lo, hi = bounds
        fields["raw_score"] = score
        score = (score - lo) / (hi - lo) if hi > lo else 0.0
    elif isinstance(outcomes, list):
        labelled = [(o.get("label"), number(o.get("score"))) for o in outcomes if isinstance(o, dict)]
        labelled = [(label, s) for label, s in labelled if s is not None]
        if labelled:
            named = [pair for pair in labelled if pair[0] is not None and pair[0] == item.get("outcome")]
            label, snapped = named[0] if named else min(labelled, key=lambda pair: abs(pair[1] - score))
            if snapped != score:
                fields["raw_score"] = score
            score = snapped
            if label is not None:
                fields["outcome"] = label
    score = _clamp(score)
    threshold = number(criterion.get("pass_threshold"))
    fields.update(score=score, result=score >= (0.5 if threshold is None else threshold))
    return fields


def make_row(fmt: str, criterion: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """Criterion fields + the judge's item (id restored). A score that is not a number scores
    0 with the error on the row."""
    extra = {k: v for k, v in item.items() if k not in ("id", "score", "justification")}
    row = {**extra, **criterion, "justification": str(item.get("justification") or "")}
    score = number(item.get("score"))
    if score is None:
        row.update(score=0.0, result=False, error=f"judge gave no numeric score: {excerpt(item.get('score'))}")
        return row
    if fmt == "rubric_partial":
        row.update(partial_score(criterion, item, score))
    else:  # rubric_binary, trajectory_mistakes: pass only on exactly 1.0
        row.update(score=1.0 if score == 1.0 else 0.0, result=score == 1.0)
        if score not in (0.0, 1.0):
            row["raw_score"] = score
    return row


def restore_mistakes(mistakes: list[Any], id_of: dict[str, str]) -> list[dict[str, Any]]:
    """The judge's mistakes with criterion ids restored (an unknown key stays as given)."""
    restored = []
    for mistake in mistakes:
        if not isinstance(mistake, dict):
            continue
        key = mistake.get("criterion_id")
        restored.append({**mistake, "criterion_id": id_of.get(key, key)} if key is not None else dict(mistake))
    return restored
