"""Agent telemetry inside task.json: token buckets, tool calls and turn records.

Criteria (command_executed, skill_triggered) and the reports read these; names follow
upstream's `models/telemetry.py` and REPORT_SCHEMA.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, computed_field, model_validator


def now() -> datetime:
    return datetime.now(timezone.utc)


def sum_priced(values: Iterable[float | None]) -> float | None:
    """Sum what was priced; `None` only when nothing was, since unpriced is not free."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


class TokenUsage(BaseModel):
    """Token buckets of a turn, a judge call or a whole task; cost bills the uncached bucket."""

    uncached_input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    cache_creation_input_tokens: int = Field(default=0, ge=0)
    cache_read_input_tokens: int = Field(default=0, ge=0)
    total_cost_usd: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _adopt_legacy_input_tokens(cls, data: Any) -> Any:
        """Files written before the uncached split carry only `input_tokens`."""
        if isinstance(data, dict) and "uncached_input_tokens" not in data and "input_tokens" in data:
            return {**data, "uncached_input_tokens": data["input_tokens"]}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def input_tokens(self) -> int:
        return self.uncached_input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens

    @property
    def total_tokens(self) -> int:
        """A plain property, as upstream: `total_tokens` is not serialized."""
        return self.input_tokens + self.output_tokens

    @property
    def unpriced(self) -> bool:
        """Tokens were spent but no cost was recorded, so any total containing this is a floor."""
        return self.total_tokens > 0 and self.total_cost_usd is None

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            uncached_input_tokens=self.uncached_input_tokens + other.uncached_input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            total_cost_usd=sum_priced([self.total_cost_usd, other.total_cost_usd]),
        )


class CommandTelemetry(BaseModel):
    """One tool call the agent made; criteria such as `command_executed` read these.
    `duration_seconds` is ours (the viewer shows it); upstream's readers ignore it."""

    tool_name: str
    tool_id: str | None = None
    timestamp: datetime | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    result_status: Literal["success", "error", "unknown"] | None = None
    result_summary: str | None = None
    duration_seconds: float | None = None


class ResultSummary(BaseModel):
    """The diagnostic part of the SDK's final result message for a turn."""

    is_error: bool = False
    subtype: str = ""
    stop_reason: str | None = None
    result: str | None = None


class TurnRecord(BaseModel):
    """One orchestrator iteration: the prompt, the agent's reply and the tool calls between.

    `messages` are the turn's messages in order (``{"role", "content", "tool_calls_before"}``:
    how many of `commands` came before each), so a viewer can interleave the two."""

    iteration: int
    user_input: str = ""
    agent_output: str = ""
    commands: list[CommandTelemetry] = Field(default_factory=list)
    timestamp: datetime = Field(default_factory=now)
    duration_seconds: float = 0.0
    token_usage: TokenUsage | None = None
    model_used: str | None = None
    assistant_turn_count: int = 0
    messages: list[dict[str, Any]] = Field(default_factory=list)
    provider_call_costs: list[dict[str, Any]] = Field(default_factory=list)
    num_turns: int | None = None
    max_turns_exhausted: bool = False
    result_summary: ResultSummary | None = None
    crashed: bool = False
    crash_reason: str | None = None
