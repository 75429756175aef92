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
from ..redaction import redact_text
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
    """Replace ``<key>`` with ``str(value)`` in every string of the step (agent-env's seed);
    the step itself when none holds a token (a dataset's steps, run for each row)."""
    if not isinstance(seed, dict) or not seed:
        return step
    fields = step.model_dump(mode="json", exclude_none=True, by_alias=True)
    data = _substitute(fields, {f"<{key}>": str(value) for key, value in seed.items()})
    return step if data == fields else type(step).model_validate(data)


def default_seed(ctx: TaskStepContext, defaults: dict[str, Any] | None) -> None:
    """Put a task's default token values under the run's own ``metadata.seed`` (which wins)."""
    if defaults:
        given = ctx.metadata.get("seed")
        ctx.metadata["seed"] = {**defaults, **(given if isinstance(given, dict) else {})}


def _substitute(value: Any, tokens: dict[str, str]) -> Any:
    if isinstance(value, str):
        if "<" in value:
            for token, replacement in tokens.items():
                value = value.replace(token, replacement)
        return value
    if isinstance(value, list):
        return [_substitute(v, tokens) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, tokens) for k, v in value.items()}
    return value


async def run_step(step: TaskStep, ctx: TaskStepContext, rt: StepRuntime) -> StepOutcome:
    """Execute ``step`` in place on ``ctx``; a tolerated failure is recorded and returned,
    a fatal one is recorded and raised as :class:`StepFailed`. Either way no known secret is
    left in what the step recorded (``TaskStepContext.scrub_secret_values``): the context
    goes on to asset events, logs and reports as it is."""
    started_at = datetime.now(timezone.utc)
    started = time.perf_counter()
    timing = ctx.metadata_map("step_timings")[step.id] = {"started_at_utc": started_at.isoformat()}
    try:
        step = apply_seed(step, ctx.metadata.get("seed"))
        await step.execute(ctx, rt)
    except Exception as exc:  # every step failure is recorded, as agent-env does
        timing["duration_seconds"] = round(time.perf_counter() - started, 3)
        ctx.scrub_secret_values()
        record = {
            "step_id": step.id,
            "step_type": step.type,
            "error": redact_text(str(exc)),
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
    ctx.scrub_secret_values()
    return StepOutcome(step, time.perf_counter() - started)


def record_retries(ctx: TaskStepContext, resets: list[dict[str, Any]], failed_records: list[dict[str, Any]]) -> None:
    """A retried attempt's context: ``metadata.retry_resets`` holds every reset so far and
    ``failed_steps`` keeps the failed attempts' fatal records, flagged ``retried`` (as
    agent-env's rollback leaves them). Idempotent, so every op of a retry may apply it."""
    markers = ctx.metadata_list("retry_resets")
    markers.extend(r for r in resets if r not in markers)
    failures = ctx.metadata_list("failed_steps")
    for record in failed_records:
        if record.get("is_fatal"):
            flagged = {**record, "retried": True}
            if flagged not in failures:
                failures.append(flagged)


def rolled_back_sandboxes(failed: list[TaskStepContext], kept: list[TaskStepContext]) -> dict[str, list[dict]]:
    """What the failed attempt deployed that the retry does not keep, in the shape of
    agent-env's ``retry_resets[].rolled_back_sandboxes`` (a local deployment's id is its
    ``instance_id``)."""
    fields = {"deployed_envs": ("sandbox_id", "sandbox_type", "sandbox_ids"),
              "deployed_agents": ("sandbox_id", "sandbox_type"),
              "deployed_sandboxes": ("sandbox_id", "sandbox_type", "sandbox_name")}
    result: dict[str, list[dict]] = {}
    for kind, keys in fields.items():
        kept_ids = {_deployment_id(r) for ctx in kept for r in getattr(ctx, kind)}
        entries: list[dict] = []
        for record in (r for ctx in failed for r in getattr(ctx, kind)):
            data = record.model_dump(mode="json")
            entry = {k: data.get(k) for k in keys}
            entry["sandbox_id"] = entry["sandbox_id"] or record.instance_id
            if _deployment_id(record) not in kept_ids and entry not in entries:
                entries.append(entry)
        result[kind] = entries
    return result


def _deployment_id(record: Any) -> str:
    return record.instance_id or json.dumps(record.model_dump(mode="json"), sort_keys=True, default=str)


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
