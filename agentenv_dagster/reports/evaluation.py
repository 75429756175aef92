"""From a finished run's context to a Coder Eval ``EvaluationResult`` (task.json).

The final status follows upstream: a pre_run or deployment failure is an ERROR, an agent
that timed out or ran out of turns is TIMEOUT / MAX_TURNS_EXHAUSTED, otherwise the criteria
decide (SUCCESS, FAILURE, or NOT_GRADED when a gating criterion could not be graded).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from ..context import TaskStepContext
from .results import CommandRunResult, CriterionResultRow, EvaluationResult, FinalStatus
from .telemetry import CommandTelemetry, TokenUsage, TurnRecord

AGENT_ERROR_STATUS = {
    "AgentTimeout": FinalStatus.TIMEOUT,
    "TimeoutError": FinalStatus.TIMEOUT,
    "MaxTurnsExceeded": FinalStatus.MAX_TURNS_EXHAUSTED,
}


def evaluation_result(
    context: TaskStepContext, *, task_id: str, description: str, agent_type: str,
    started: datetime, completed: datetime, verifier_id: str, prompt_id: str,
    trajectory: list[dict[str, Any]] | None = None, replicate_index: int = 0,
    resolved_task: dict[str, Any] | None = None, source_file: str | None = None,
    prices: dict[str, dict[str, float]] | None = None, variant_id: str = "default",
) -> EvaluationResult:
    entry = (context.metadata.get("verifications") or {}).get(verifier_id) or {}
    rows = [CriterionResultRow.model_validate(r) for r in entry.get("results") or []]
    response = context.find_prompt_response(prompt_id)
    usage = (response.model_extra or {}).get("usage") if response else None
    token_usage = _usage(usage, (prices or {}).get(response.model if response else "", None))
    status, error = _status(context, entry, response)
    if status in (FinalStatus.SUCCESS, FinalStatus.FAILURE, FinalStatus.NOT_GRADED):
        status, error = _over_budget(usage, token_usage, (resolved_task or {}).get("run_limits") or {}) or (status, error)
    turns = []
    if response is not None:
        turns.append(TurnRecord(
            iteration=1, user_input=response.prompt_text or "", agent_output=response.response,
            commands=[_command(e) for e in trajectory or [] if e.get("type") == "tool_call"],
            model_used=response.model, token_usage=token_usage, crashed=response.error_type is not None,
            crash_reason=response.error_message, timestamp=started,
            assistant_turn_count=sum(1 for e in trajectory or [] if e.get("role") == "assistant"),
        ))
    crashed = status in (FinalStatus.TIMEOUT, FinalStatus.MAX_TURNS_EXHAUSTED, FinalStatus.ERROR)
    return EvaluationResult(
        task_id=task_id, task_description=description, agent_type=agent_type, variant_id=variant_id,
        replicate_index=replicate_index, started_at=started, completed_at=completed,
        duration_seconds=(completed - started).total_seconds(), final_status=status,
        weighted_score=entry.get("score"), max_turns_exhausted=status == FinalStatus.MAX_TURNS_EXHAUSTED,
        success_criteria_results=[] if crashed else rows,
        post_failure_criteria_results=rows if crashed else [],
        iterations=turns, error_message=error,
        pre_run_results=[CommandRunResult.model_validate(r) for r in context.metadata.get("pre_run_results") or []],
        post_run_results=[CommandRunResult.model_validate(r) for r in context.metadata.get("post_run_results") or []],
        sandbox_path=(context.metadata.get("workspace") or {}).get("sandbox_root"),
        command_stats=command_stats(trajectory or []),
        task_config={"resolved": resolved_task or {}, "source_file": source_file} if resolved_task else None,
    )


def _status(context: TaskStepContext, entry: dict[str, Any], response) -> tuple[FinalStatus, str | None]:
    fatal = [f for f in context.metadata.get("failed_steps") or [] if f.get("is_fatal")]
    if fatal:
        return FinalStatus.ERROR, f"step '{fatal[0]['step_id']}' failed: {fatal[0]['error']}"
    if response is not None and response.error_type:
        status = AGENT_ERROR_STATUS.get(response.error_type, FinalStatus.ERROR)
        return status, f"{response.error_type}: {response.error_message or response.response}"
    if not entry:
        return FinalStatus.ERROR, "the criteria were not graded"
    passed = entry.get("passed")
    if passed is None:
        return FinalStatus.NOT_GRADED, None
    return (FinalStatus.SUCCESS if passed else FinalStatus.FAILURE), None


def _over_budget(
    usage: dict[str, Any] | None, priced: TokenUsage | None, limits: dict[str, Any]
) -> tuple[FinalStatus, str] | None:
    """The first cap the agent's spend went over (judge and simulator never count). Checked
    after the agent's turn: the embedded agents report usage when they finish."""
    if not usage:
        return None
    spent = {
        "max_input_tokens": usage.get("input_tokens", 0),
        "max_output_tokens": usage.get("output_tokens", 0),
        "max_total_tokens": usage.get("input_tokens", 0) + usage.get("output_tokens", 0),
    }
    for cap, used in spent.items():
        if limits.get(cap) is not None and used > limits[cap]:
            return FinalStatus.TOKEN_BUDGET_EXCEEDED, f"run_limits.{cap}={limits[cap]} exceeded: the agent used {used} tokens"
    cost = priced.total_cost_usd if priced else None
    if limits.get("max_usd") is not None and cost is not None and cost > limits["max_usd"]:
        return FinalStatus.COST_BUDGET_EXCEEDED, f"run_limits.max_usd={limits['max_usd']} exceeded: the agent cost ${cost:.4f}"
    return None


def command_stats(trajectory: list[dict[str, Any]]) -> dict[str, Any]:
    """Tool calls by name, with errors and time spent (task.json ``command_stats``)."""
    calls = [e for e in trajectory if e.get("type") == "tool_call"]
    by_tool: dict[str, dict[str, Any]] = {}
    for call in calls:
        stats = by_tool.setdefault(call["name"], {"count": 0, "errors": 0, "duration_seconds": 0.0})
        stats["count"] += 1
        stats["errors"] += bool(call.get("is_error"))
        stats["duration_seconds"] = round(stats["duration_seconds"] + (call.get("duration_seconds") or 0.0), 3)
    return {
        "total_commands": len(calls), "failed_commands": sum(s["errors"] for s in by_tool.values()),
        "total_duration_seconds": round(sum(s["duration_seconds"] for s in by_tool.values()), 3),
        "by_tool": by_tool,
    }


def _command(event: dict[str, Any]) -> CommandTelemetry:
    result = event.get("result")
    return CommandTelemetry(
        tool_name=event["name"], parameters=event.get("arguments") or {},
        timestamp=event.get("started_at"), result_status="error" if event.get("is_error") else "success",
        result_summary=result if isinstance(result, str) and len(result) <= 500 else json.dumps(result)[:500],
    )


def _usage(usage: dict[str, Any] | None, price: dict[str, float] | None) -> TokenUsage | None:
    """Token buckets, priced when ``[model] prices`` knows the model (else cost stays unknown)."""
    if not usage:
        return None
    tokens_in, tokens_out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    cost = None
    if price:
        cost = (tokens_in * price.get("input", 0.0) + tokens_out * price.get("output", 0.0)) / 1_000_000
    return TokenUsage(uncached_input_tokens=tokens_in, output_tokens=tokens_out, total_cost_usd=cost)
