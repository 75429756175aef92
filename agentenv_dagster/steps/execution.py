"""Run one step against a context: seed templating, timing and failure records.

Shared by the Dagster ops and the plain asyncio walker, so both fail and record alike.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from .base import TaskStep


class StepFailed(RuntimeError):
    """A fatal step failure (``fail_task_on_error: true``), carrying its failed_steps record."""

    def __init__(self, record: dict[str, Any]):
        super().__init__(f"step '{record['step_id']}' ({record['step_type']}) failed: {record['error']}")
        self.record = record


@dataclass(frozen=True)
class StepOutcome:
    step: TaskStep
    duration_seconds: float
    failure: dict[str, Any] | None = None


def apply_seed(step: TaskStep, seed: Any) -> TaskStep:
    """Replace ``<key>`` with ``str(value)`` in every string of the step (agent-env's seed)."""
    if not isinstance(seed, dict) or not seed:
        return step
    data = _substitute(step.model_dump(mode="json", exclude_none=True, by_alias=True), seed)
    return type(step).model_validate(data)


def _substitute(value: Any, seed: dict[str, Any]) -> Any:
    if isinstance(value, str):
        for key, replacement in seed.items():
            value = value.replace(f"<{key}>", str(replacement))
        return value
    if isinstance(value, list):
        return [_substitute(v, seed) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, seed) for k, v in value.items()}
    return value


async def run_step(step: TaskStep, ctx: TaskStepContext, rt: StepRuntime) -> StepOutcome:
    """Execute ``step`` in place on ``ctx``; a tolerated failure is recorded and returned,
    a fatal one is recorded and raised as :class:`StepFailed`."""
    started_at = datetime.now(timezone.utc)
    started = time.perf_counter()
    timing = ctx.metadata_map("step_timings")[step.id] = {"started_at_utc": started_at.isoformat()}
    try:
        step = apply_seed(step, ctx.metadata.get("seed"))
        await step.execute(ctx, rt)
    except Exception as exc:  # every step failure is recorded, as agent-env does
        timing["duration_seconds"] = round(time.perf_counter() - started, 3)
        record = {
            "step_id": step.id,
            "step_type": step.type,
            "error": str(exc),
            "error_type": type(exc).__name__,
            "started_at_utc": started_at.isoformat(),
            "duration_seconds": round(time.perf_counter() - started, 3),
            "is_fatal": step.fail_task_on_error,
        }
        ctx.metadata_list("failed_steps").append(record)
        if step.fail_task_on_error:
            raise StepFailed(record) from exc
        return StepOutcome(step, record["duration_seconds"], failure=record)
    timing["duration_seconds"] = round(time.perf_counter() - started, 3)
    return StepOutcome(step, time.perf_counter() - started)


def user_override(ctx: TaskStepContext, key: str) -> Any:
    return (ctx.metadata.get("user_overrides") or {}).get(key)


def step_param(ctx: TaskStepContext, step_id: str, key: str) -> Any:
    params = (ctx.metadata.get("user_overrides") or {}).get("step_params") or {}
    return (params.get(step_id) or {}).get(key)


def parse_structured_output(text: str | None) -> Any:
    """The reply as a JSON object: the whole text, a ```json fence, or else the last
    top-level object embedded in prose; None for arrays, prose and empty replies."""
    if not text or not text.strip():
        return None
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        whole = json.loads(stripped)
    except ValueError:
        pass
    else:
        return whole if isinstance(whole, dict) else None
    decoder = json.JSONDecoder()
    found, position = None, 0
    while (start := stripped.find("{", position)) != -1:
        try:
            value, end = decoder.raw_decode(stripped, start)
        except ValueError:
            position = start + 1
            continue
        if isinstance(value, dict):
            found = value
        position = end
    return found
