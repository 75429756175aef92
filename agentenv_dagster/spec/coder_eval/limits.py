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
    max_turns: int | None = Field(default=None, gt=0)
    expected_turns: int | None = Field(default=None, ge=1)
    task_timeout: int | None = Field(default=None, ge=30)
    turn_timeout: int | None = Field(default=None, ge=10)
    # Newer upstream caps on tool calls, used by the corpus (hard cap / soft target).
    max_tool_calls: int | None = Field(default=None, gt=0)
    expected_tool_calls: int | None = Field(default=None, ge=1)
    max_input_tokens: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_total_tokens: int | None = Field(default=None, ge=1)
    max_usd: float | None = Field(default=None, gt=0.0)
    count_cached_input: bool = False
    count_cache_creation: bool = False
    stop_early: bool | None = None
    stop_early_gate_threshold: float = Field(default=DEFAULT_STOP_EARLY_GATE_THRESHOLD, ge=0.0, le=1.0)
