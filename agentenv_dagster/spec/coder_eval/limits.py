"""``run_limits:``, the one namespace for run-time caps: turns and wall clock (structural), tokens
and dollars (budgets, subject agent only). Every field is optional; an empty block is legal.

``stop_early`` is only a kill switch here; arming lives on the criteria, and ``true`` (the
removed master arm) is refused when the task is resolved, where the criteria are visible.
"""

from __future__ import annotations

from pydantic import Field

from .base import Strict

DEFAULT_STOP_EARLY_GATE_THRESHOLD = 1.0
# The wall clock a turn (and the criteria's checks) may take when run_limits sets none.
DEFAULT_TASK_TIMEOUT = 600


class RunLimits(Strict):
    # the agent's turns at most (its SDK's default when unset)
    max_turns: int | None = Field(default=None, gt=0)
    # a soft target for visible turns: a warning and a report badge, never a failure
    expected_turns: int | None = Field(default=None, ge=1)
    # seconds the whole run may take (default 600)
    task_timeout: int | None = Field(default=None, ge=30)
    # seconds one agent turn may take
    turn_timeout: int | None = Field(default=None, ge=10)
    # Newer upstream caps on tool calls, used by the corpus (hard cap / soft target).
    max_tool_calls: int | None = Field(default=None, gt=0)
    expected_tool_calls: int | None = Field(default=None, ge=1)
    # the agent's input tokens at most, over the run
    max_input_tokens: int | None = Field(default=None, ge=1)
    # the agent's output tokens at most, over the run
    max_output_tokens: int | None = Field(default=None, ge=1)
    # the agent's tokens at most, over the run
    max_total_tokens: int | None = Field(default=None, ge=1)
    # the agent's cost at most, over the run (needs `[model] prices`; skipped without)
    max_usd: float | None = Field(default=None, gt=0.0)
    # count cached input tokens in the input and total budgets
    count_cached_input: bool = False
    # count cache-creation tokens in the input and total budgets
    count_cache_creation: bool = False
    # `false` disarms every criterion's `stop_early` for this run
    stop_early: bool | None = None
    # the weighted share of armed criteria that must pass for an early stop to pass
    stop_early_gate_threshold: float = Field(default=DEFAULT_STOP_EARLY_GATE_THRESHOLD, ge=0.0, le=1.0)
