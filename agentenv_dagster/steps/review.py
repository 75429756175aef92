"""review: pause the task until a person approves or rejects it, or the wait times out.

The step registers itself as awaiting (with the latest agent output, for the reviewer) and
polls the run's review decisions (``runtime/review.py``): approve continues, reject fails
the step, no decision within ``timeout_seconds`` fails it too — fatal by default, so the
steps after it never run. The wait holds nothing: place it after the agent's output is
recorded and before whatever should only happen on approval (``collect_artifacts``).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.review import CONTINUE, ReviewDecisions, RunReviews, now_utc
from .base import TaskStep
from .registry import step

DEFAULT_TIMEOUT_SECONDS = 10800  # 3 h
DEFAULT_POLL_INTERVAL_SECONDS = 5
_RESPONSE_MAX_CHARS = 4000
_STRUCTURED_MAX_CHARS = 16000


class ReviewAbortedError(RuntimeError):
    """A person chose not to continue past a review."""


def review_decisions(rt: StepRuntime) -> ReviewDecisions:
    """Where this run's decisions are given: files in the run folder."""
    return RunReviews.of_run(rt.run.run_dir)


@step("review")
class ReviewStep(TaskStep):
    label: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_SECONDS

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        if not ctx.instance_id:
            raise RuntimeError("review: context has no instance_id — cannot register a decision")
        decisions = review_decisions(rt)
        requested_at, began = now_utc(), time.monotonic()
        decisions.put_awaiting(self.id, ctx.instance_id, {
            "label": self.label, "run_id": rt.run.run_id, "task_id": rt.run.task_id,
            "requested_at_utc": requested_at, "timeout_seconds": self.timeout_seconds,
            "upstream": _upstream_summary(ctx),
        })
        rt.log.info(
            "review '%s'%s awaiting a decision (timeout %ss): agentenv-dagster review %s approve|reject "
            "[--note TEXT], or tag the run agentenv/review=approved|rejected",
            self.id, f" ({self.label})" if self.label else "", self.timeout_seconds, rt.run.run_id,
        )
        try:
            record = await self._await_decision(decisions, ctx.instance_id)
        finally:
            decisions.clear_awaiting(self.id, ctx.instance_id)
        entry: dict[str, Any] = {
            "decision": record.get("decision") if record else None, "label": self.label,
            "decided_by": record.get("decided_by") if record else None,
            "note": record.get("note") if record else None,
            "source": record.get("source") if record else None,
            "requested_at_utc": requested_at,
            "decided_at_utc": record.get("decided_at_utc") if record else None,
            "waited_seconds": round(time.monotonic() - began, 3),
            "timed_out": record is None,
        }
        ctx.metadata_map("review_decisions")[self.id] = entry
        if record is None:
            raise TimeoutError(f"review '{self.id}' timed out after {self.timeout_seconds:g}s awaiting a decision")
        if record["decision"] == CONTINUE:
            rt.log.info("review '%s': approved%s", self.id, _by(record))
            return
        note = f": {record['note']}" if record.get("note") else ""
        raise ReviewAbortedError(f"review '{self.id}' aborted by operator{_by(record)}{note}")

    async def _await_decision(self, decisions: ReviewDecisions, instance_id: str) -> dict[str, Any] | None:
        """Poll until decided (the record) or the deadline (None)."""
        interval = self.poll_interval_seconds if self.poll_interval_seconds > 0 else DEFAULT_POLL_INTERVAL_SECONDS
        deadline = time.monotonic() + self.timeout_seconds
        while True:
            record = await asyncio.to_thread(decisions.get, self.id, instance_id)
            if record is not None:
                return record
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(interval, left))


def _by(record: dict[str, Any]) -> str:
    return f" ({record['decided_by']})" if record.get("decided_by") else ""


def _upstream_summary(ctx: TaskStepContext) -> dict[str, Any]:
    """The latest agent output for the reviewer: a structured verdict if one exists, else the
    trimmed reply text. Bounded, as it is read while the run waits."""
    for response in reversed(ctx.prompt_responses):
        if response.structured_output is not None:
            return {"step_id": response.step_id, "structured_output": _bounded(response.structured_output)}
    if ctx.prompt_responses:
        last = ctx.prompt_responses[-1]
        return {"step_id": last.step_id, "prompt_id": last.prompt_id,
                "response": (last.response or "")[:_RESPONSE_MAX_CHARS]}
    return {}


def _bounded(value: Any) -> Any:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = str(value)
    if len(text) <= _STRUCTURED_MAX_CHARS:
        return value
    return {"_truncated": True, "note": "output truncated for review; full output in the trajectory",
            "preview": text[:_STRUCTURED_MAX_CHARS]}
