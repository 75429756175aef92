"""The report schema in one import, and run.json: `RunSummary`, its rows and the exit code.

task.json records live in `results.py` and agent telemetry in `telemetry.py`; both are
re-exported here. Rates and cost totals are computed on serialization, so they cannot drift
from the counts and rows they summarise.
"""

from __future__ import annotations

import importlib.metadata
from datetime import datetime
from typing import Any, Iterable

from pydantic import BaseModel, Field, computed_field, model_validator

from .results import (
    CommandRunResult,
    CriterionResultRow,
    EarlyStopInfo,
    EvaluationResult,
    FinalStatus,
    TaskConfigRecord,
)
from .telemetry import CommandTelemetry, ResultSummary, TokenUsage, TurnRecord, sum_priced

__all__ = [
    "CommandRunResult",
    "CommandTelemetry",
    "CriterionResultRow",
    "EarlyStopInfo",
    "EvaluationResult",
    "FinalStatus",
    "ResultSummary",
    "RunSummary",
    "SkippedTask",
    "TaskConfigRecord",
    "TokenUsage",
    "TurnRecord",
    "exit_code",
    "task_result_row",
]


def task_result_row(result: EvaluationResult) -> dict[str, Any]:
    """The flat run.json row for one replicate (an untyped denormalisation, as upstream)."""
    usage = result.total_token_usage or TokenUsage()
    resolved = result.task_config.resolved if result.task_config else {}
    agent_cost, judge_cost = usage.total_cost_usd, result.judge_cost_usd
    simulator_cost = (result.simulation or {}).get("simulator_cost_usd")
    stop = result.early_stop
    tool_calls = sum(len(t.commands) for t in result.iterations)
    return {
        "task_id": result.task_id,
        "replicate_index": result.replicate_index,
        "variant_id": result.variant_id,
        "status": result.final_status.value,
        "weighted_score": result.weighted_score,
        "duration": result.duration_seconds,
        "iteration_count": result.iteration_count,
        "tags": resolved.get("tags", []),
        "task_path": result.task_config.source_file if result.task_config else None,
        "model_used": result.model_used,
        "reference_similarity": next(
            (c.score for c in result.success_criteria_results if c.criterion_type == "reference_comparison"),
            None,
        ),
        "input_tokens": usage.uncached_input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "total_tokens": usage.total_tokens,
        "total_cost_usd": sum_priced([agent_cost, judge_cost, simulator_cost]),
        "agent_cost_usd": agent_cost,
        "judge_cost_usd": judge_cost,
        "simulator_cost_usd": simulator_cost,
        "cost_complete": result.cost_complete,
        "expected_commands": result.expected_commands,
        "actual_commands": result.actual_commands,
        "commands_efficiency": result.commands_efficiency,
        "agent_config": result.agent_config,
        "sdk_options": result.sdk_options,
        "installed_tools": result.environment_info.get("installed_tools", []),
        "total_turns": sum(t.num_turns or 0 for t in result.iterations),
        "visible_turns": tool_calls + int(result.has_final_reply),
        "expected_turns": (resolved.get("run_limits") or {}).get("expected_turns"),
        "max_turns_exhausted": result.max_turns_exhausted,
        "has_final_reply": result.has_final_reply,
        "stopped_early": stop is not None,
        "early_stop_reason": stop.reason if stop else None,
        "turns_remaining_at_stop": stop.turns_remaining_at_stop if stop else None,
        "iterations": [
            {
                "iteration": t.iteration,
                "duration_seconds": t.duration_seconds,
                "command_count": len(t.commands),
                "assistant_turn_count": t.assistant_turn_count,
                "crashed": t.crashed,
                "crash_reason": t.crash_reason,
            }
            for t in result.iterations
        ],
    }


class SkippedTask(BaseModel):
    """A task file left out before running: a load failure, or `skip: true`."""

    path: str
    reason: str


def _framework_version() -> str:
    return importlib.metadata.version("agentenv-dagster")


class RunSummary(BaseModel):
    """run.json: flat counters and rows for the whole run; detail lives in each task.json."""

    run_id: str
    start_time: datetime
    end_time: datetime
    total_duration_seconds: float = 0.0
    tasks_run: int = Field(default=0, ge=0)
    tasks_succeeded: int = Field(default=0, ge=0)
    tasks_failed: int = Field(default=0, ge=0)
    tasks_error: int = Field(default=0, ge=0)
    tasks_not_graded: int = Field(default=0, ge=0)
    tasks_measured: int = Field(default=0, ge=0)
    tasks_token_budget_exceeded: int = Field(default=0, ge=0)
    tasks_cost_budget_exceeded: int = Field(default=0, ge=0)
    skipped_tasks: list[SkippedTask] = Field(default_factory=list)
    max_parallel: int = Field(default=1, ge=1)
    task_results: list[dict[str, Any]] = Field(default_factory=list)
    framework_version: str = Field(default_factory=_framework_version)
    environment_info: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_task_counts(self) -> RunSummary:
        counted = self.tasks_succeeded + self.tasks_failed + self.tasks_error + self.tasks_not_graded
        if counted != self.tasks_run:
            raise ValueError(
                f"task counts do not add up: {self.tasks_succeeded} succeeded + {self.tasks_failed} failed"
                f" + {self.tasks_error} error + {self.tasks_not_graded} not graded != {self.tasks_run} run"
            )
        return self

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tasks_graded(self) -> int:
        return self.tasks_run - self.tasks_not_graded

    @property
    def _nothing_measured(self) -> bool:
        """An `execute`-style run whose only verdict-free rows are crashes measured nothing;
        0% there would read as a total failure. Runs without ungraded rows are always measured."""
        return self.tasks_graded == 0 or (self.tasks_not_graded > 0 and self.tasks_measured == 0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def pass_rate(self) -> float | None:
        """Succeeded / graded: errors count as misses, ungraded tasks are on neither side."""
        return None if self._nothing_measured else self.tasks_succeeded / self.tasks_graded

    @computed_field  # type: ignore[prop-decorator]
    @property
    def error_share(self) -> float | None:
        """How much of the rate is held down by errors; diagnostic only."""
        return None if self._nothing_measured else self.tasks_error / self.tasks_graded

    def _row_costs(self, *keys: str) -> float | None:
        return sum_priced(row.get(key) for row in self.task_results for key in keys)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_cost_usd(self) -> float | None:
        """The bill: agent + judge + simulator."""
        return self._row_costs("total_cost_usd")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def agent_cost_usd(self) -> float | None:
        """Subject-agent spend alone, the figure to compare harnesses by."""
        return self._row_costs("agent_cost_usd")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def eval_overhead_cost_usd(self) -> float | None:
        return self._row_costs("judge_cost_usd", "simulator_cost_usd")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tasks_cost_incomplete(self) -> int:
        return sum(
            1
            for row in self.task_results
            if row.get("cost_complete") is False
            or ((row.get("total_tokens") or 0) > 0 and row.get("total_cost_usd") is None)
        )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost_complete(self) -> bool:
        """When false every cost above is a floor; it never changes the exit code."""
        return self.tasks_cost_incomplete == 0

    @classmethod
    def from_results(
        cls,
        run_id: str,
        start: datetime,
        end: datetime,
        results: list[EvaluationResult],
        skipped: Iterable[SkippedTask | dict[str, str]] = (),
        max_parallel: int = 1,
        environment_info: dict[str, Any] | None = None,
    ) -> RunSummary:
        """Count and flatten the replicates; the only way counters and rows stay consistent."""
        categories = [r.final_status.category for r in results]
        statuses = [r.final_status for r in results]
        return cls(
            run_id=run_id,
            start_time=start,
            end_time=end,
            total_duration_seconds=(end - start).total_seconds(),
            tasks_run=len(results),
            tasks_succeeded=categories.count("succeeded"),
            tasks_failed=categories.count("failed"),
            tasks_error=categories.count("error"),
            tasks_not_graded=categories.count("ungraded"),
            tasks_measured=sum(r.weighted_score is not None for r in results),
            tasks_token_budget_exceeded=statuses.count(FinalStatus.TOKEN_BUDGET_EXCEEDED),
            tasks_cost_budget_exceeded=statuses.count(FinalStatus.COST_BUDGET_EXCEEDED),
            skipped_tasks=list(skipped),
            max_parallel=max_parallel,
            task_results=[task_result_row(r) for r in results],
            environment_info=environment_info or {},
        )


def exit_code(summary: RunSummary) -> int:
    """`coder-eval run`'s task rule: 1 if any task failed or errored; ungraded and unpriced
    tasks never fail a run."""
    return 1 if summary.tasks_failed or summary.tasks_error else 0
