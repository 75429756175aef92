"""From a finished run's context to a Coder Eval ``EvaluationResult`` (task.json).

The final status follows upstream: a pre_run or deployment failure is an ERROR, an agent
that timed out or ran out of turns is TIMEOUT / MAX_TURNS_EXHAUSTED, otherwise the criteria
decide (SUCCESS, FAILURE, or NOT_GRADED when a gating criterion could not be graded).
The same rules, without the reports' budget caps, give any task's row its outcome while the
run goes on (``row_outcome``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from ..config import token_cost
from ..context import TaskStepContext
from ..runtime.artifacts import ObjectStore
from ..steps.scoring import verification_passed
from .results import CommandRunResult, CriterionResultRow, EvaluationResult, FinalStatus, StatusCategory
from .telemetry import CommandTelemetry, ResultSummary, TokenUsage, TurnRecord

RESULT_SUMMARY_CHARS = 500  # of a tool call's result kept in task.json (the whole is in the trajectory object)
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
    token_usage = priced_usage(usage, (prices or {}).get(response.model if response else "", None))
    status, error = _status(context, entry, response)
    if status in (FinalStatus.SUCCESS, FinalStatus.FAILURE, FinalStatus.NOT_GRADED):
        status, error = _over_budget(usage, token_usage, (resolved_task or {}).get("run_limits") or {}) or (status, error)
    dialog = (response.model_extra or {}).get("turns") if response is not None else None
    if dialog is not None:
        turns = _dialog_turns(dialog, prices or {}, started)
    elif response is not None:
        turns = [_turn(
            1, response.prompt_text or "", response.response, trajectory or [], response.model, token_usage,
            response.error_type is not None, response.error_message, started,
        )]
        timing = (context.metadata.get("step_timings") or {}).get(response.step_id or "") or {}
        turns[0].duration_seconds = timing.get("duration_seconds") or 0.0  # the prompt step's: the agent's turn
    else:
        turns = []
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
        simulation=_simulation(response, resolved_task or {}, replicate_index, prices or {}),
        early_stop=(response.model_extra or {}).get("early_stop") if response is not None else None,
    )


def _turn(iteration: int, user_input: str, output: str, events: list[dict[str, Any]], model: str | None,
          usage: TokenUsage | None, crashed: bool, crash_reason: str | None, timestamp: datetime) -> TurnRecord:
    """One exchange; its model turns are the assistant messages of its trajectory (at least
    one when it replied), its result the reply text."""
    assistant_turns = sum(1 for e in events if e.get("role") == "assistant")
    return TurnRecord(
        iteration=iteration, user_input=user_input, agent_output=output,
        commands=[_command(e) for e in events if e.get("type") == "tool_call"], messages=_messages(events),
        model_used=model, token_usage=usage, crashed=crashed, crash_reason=crash_reason, timestamp=timestamp,
        assistant_turn_count=assistant_turns, num_turns=max(assistant_turns, int(bool(output.strip()) and not crashed)),
        result_summary=ResultSummary(is_error=crashed, subtype="error" if crashed else "success", result=output),
    )


def _dialog_turns(dialog: list[dict[str, Any]], prices: dict[str, dict[str, float]], started: datetime) -> list[TurnRecord]:
    """A TurnRecord per exchange of a multi-turn prompt_agent, each with its own trajectory."""
    turns = []
    for turn in dialog:
        url = turn.get("trajectory_url")
        events = json.loads(ObjectStore.read(url)) if url else []
        crashed = turn.get("state", "completed") != "completed"
        turns.append(_turn(
            turn["turn"], turn.get("user_message", ""), turn.get("response", ""), events, turn.get("model"),
            priced_usage(turn.get("usage"), prices.get(turn.get("model") or "")), crashed,
            turn.get("error_message") or (turn.get("error_type") if crashed else None),
            datetime.fromisoformat(turn["started_at_utc"]) if turn.get("started_at_utc") else started,
        ))
        turns[-1].duration_seconds = turn.get("duration_seconds") or 0.0
    return turns


def _simulation(response, resolved: dict[str, Any], replicate_index: int,
                prices: dict[str, dict[str, float]]) -> dict[str, Any] | None:
    """Coder Eval's per-trial SimulationTelemetry, from the dialog the prompt recorded.
    A user agent answering ``done: true`` ended it as the stop token would."""
    simulation = resolved.get("simulation") or {}
    if not simulation.get("enabled") or response is None:
        return None
    extra = response.model_extra or {}
    user_usage = extra.get("user_usage") or {}
    models = [(t.get("user") or {}).get("model") for t in extra.get("turns") or []]
    model = next((m for m in reversed(models) if m), None) or (extra.get("closing_user_message") or {}).get("model")
    reason = extra.get("stop_reason") or "error"
    priced = priced_usage(user_usage, prices.get(model or "")) if user_usage else None
    return {
        "n_trials": simulation.get("n_trials", 1), "replicate_index": replicate_index,
        "stop_reason": "stop_token" if reason == "done" else reason,
        "simulator_input_tokens": user_usage.get("input_tokens", 0),
        "simulator_output_tokens": user_usage.get("output_tokens", 0),
        "simulator_failures": int(reason == "error" and (extra.get("stop_detail") or "").startswith("user agent")),
        "total_turns": sum(1 for t in extra.get("turns") or [] if t.get("state") == "completed"),
        "simulator_model": model,
        "simulator_cost_usd": priced.total_cost_usd if priced else None,
    }


RowOutcome = Literal["passed", "failed", "errored", "not graded"]
_OUTCOMES: tuple[tuple[StatusCategory, RowOutcome], ...] = (
    ("error", "errored"), ("failed", "failed"), ("ungraded", "not graded"), ("succeeded", "passed"))


def row_outcome(context: TaskStepContext) -> RowOutcome:
    """How a finished row counts, for any task: by the final status rules above applied to
    each of its verifications and prompt responses, the worst. A row with nothing to grade
    passes once its steps are done. Coder Eval's token and cost caps are left to the reports
    (they need the task's ``run_limits`` and the model's prices), which may count such a row
    failed."""
    entries = [{"passed": verification_passed(entry)}
               for entry in (context.metadata.get("verifications") or {}).values()] or [{"passed": True}]
    responses = context.prompt_responses or [None]
    categories = {_status(context, entry, response)[0].category for entry in entries for response in responses}
    return next(outcome for category, outcome in _OUTCOMES if category in categories)


def _status(context: TaskStepContext, entry: dict[str, Any], response) -> tuple[FinalStatus, str | None]:
    """The task's status and error: a fatal step's failure (of this attempt: not one a retry
    re-ran), else the agent's (its prompt step
    failed before it had a response: the agent was never heard, as when upstream's agent
    invocation raises), else the criteria's verdict."""
    fatal = [f for f in context.metadata.get("failed_steps") or [] if f.get("is_fatal") and not f.get("retried")]
    if fatal:
        return FinalStatus.ERROR, f"step '{fatal[0]['step_id']}' failed: {fatal[0]['error']}"
    unheard = context.failure_of("prompt_agent") if response is None else None
    if unheard:
        return FinalStatus.ERROR, f"step '{unheard['step_id']}' failed: {unheard['error']}"
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


def _messages(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory's messages in order, each with how many tool calls came before it
    (``TurnRecord.messages``)."""
    messages, calls = [], 0
    for event in events:
        if event.get("type") == "tool_call":
            calls += 1
        elif event.get("type") == "message":
            messages.append({"role": event.get("role"), "content": event.get("text", ""), "tool_calls_before": calls})
    return messages


def _command(event: dict[str, Any]) -> CommandTelemetry:
    result = event.get("result")
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    return CommandTelemetry(
        tool_name=event["name"], parameters=event.get("arguments") or {},
        timestamp=event.get("started_at"), duration_seconds=event.get("duration_seconds"),
        result_status=event.get("status") or ("error" if event.get("is_error") else "success"),
        result_summary=text if len(text) <= RESULT_SUMMARY_CHARS else text[: RESULT_SUMMARY_CHARS - 1] + "…",
    )


def priced_usage(usage: dict[str, Any] | None, price: dict[str, float] | None) -> TokenUsage | None:
    """Token buckets (``input_tokens`` is the uncached input; cache writes and reads are
    counted apart), priced (``token_cost``) when ``[model] prices`` knows the model (else cost
    stays unknown)."""
    if not usage:
        return None
    tokens_in, tokens_out = usage.get("input_tokens", 0), usage.get("output_tokens", 0)
    written, read = usage.get("cache_creation_input_tokens", 0), usage.get("cache_read_input_tokens", 0)
    cost = token_cost(price, uncached=tokens_in, output=tokens_out, cache_write=written, cache_read=read)
    return TokenUsage(uncached_input_tokens=tokens_in, output_tokens=tokens_out, total_cost_usd=cost,
                      cache_creation_input_tokens=written, cache_read_input_tokens=read)
