"""Criteria over the agent's tool calls: ``command_executed`` and ``commands_efficiency``."""

from __future__ import annotations

import json
import os
import re
import shlex

from pydantic import Field, model_validator

from .base import Criterion, CriterionContext, CriterionResult, LivePolarity, StopEarly, ToolCall
from .registry import criterion

# Patterns are searched over at most this much text, against catastrophic backtracking.
SEARCH_LIMIT = 2000
# Longer commands are not shell-normalized (shlex is slow on huge heredocs and payloads).
NORMALIZE_LIMIT = 20000
SHELLS = ("bash", "sh")
SCRIPT_SWITCHES = ("-c", "-lc", "-lic")


def normalize_shell(command: str) -> str | None:
    """The command with a ``bash -lc "…"`` wrapper removed and shell quoting resolved, tokens
    joined by single spaces — so a pattern need not anticipate how the agent quoted things.

    None when the text does not split as shell words (unbalanced quotes, heredocs)."""
    try:
        tokens = shlex.split(command)
    except ValueError:
        return None
    if tokens and os.path.basename(tokens[0]) in SHELLS:
        for index, token in enumerate(tokens[1:], start=1):
            if token in SCRIPT_SWITCHES:
                rest = tokens[index + 1:]
                if len(rest) == 1:  # a quoted script: split it as the shell will
                    try:
                        rest = shlex.split(rest[0])
                    except ValueError:
                        return None
                tokens = rest
                break
            if not token.startswith("-"):
                break
    if any(token.startswith("<<") for token in tokens):
        return None
    return " ".join(tokens)


def call_text(call: ToolCall) -> str:
    """A Bash call's command line; any other call (or a non-text command) as its JSON parameters."""
    command = call.parameters.get("command")
    if call.name == "Bash" and isinstance(command, str) and command:
        return command
    return json.dumps(call.parameters)


def haystacks(call: ToolCall) -> list[str]:
    """The texts a pattern is searched in: the raw text (capped) and, for Bash, its normalized form."""
    raw = call_text(call)
    texts = [raw[:SEARCH_LIMIT]]
    if call.name == "Bash" and len(raw) <= NORMALIZE_LIMIT:
        normalized = normalize_shell(raw)
        if normalized is not None and normalized != raw:
            texts.append(normalized[:SEARCH_LIMIT])
    return texts


def _dotall(pattern: str | None) -> re.Pattern | None:
    """DOTALL so ``.`` spans backslash-continued lines; re.error on a bad pattern."""
    return re.compile(pattern, re.DOTALL) if pattern is not None else None


@criterion("command_executed")
class CommandExecuted(Criterion):
    """Matching tool calls counted against ``min_count`` (fractional) or a ``min..max`` range (binary)."""

    requires_agent = True

    # count calls of this tool only (`Bash`, `Write`, an MCP tool ...)
    tool_name: str | None = None
    # count calls whose command (or arguments) match this regular expression
    command_pattern: str | None = None
    # leave out calls that match this regular expression
    exclude_pattern: str | None = None
    # matching calls needed; with `max_count` unset the score is the share of it reached
    min_count: int = Field(default=1, ge=0)
    # matching calls allowed at most (the score is then pass/fail on the range)
    max_count: int | None = Field(default=None, ge=0)
    # count only calls that succeeded
    require_success: bool = False
    # arm early stop on this criterion
    stop_early: StopEarly | None = None

    @model_validator(mode="after")
    def _range(self) -> CommandExecuted:
        if self.max_count is not None and self.max_count < self.min_count:
            raise ValueError(f"max_count ({self.max_count}) must be >= min_count ({self.min_count})")
        return self

    def matching(self, calls: list[ToolCall]) -> list[str]:
        """The calls this criterion counts, as text (the live verdict and the score share it)."""
        pattern, exclude = _dotall(self.command_pattern), _dotall(self.exclude_pattern)
        found = []
        for call in calls:
            if self.tool_name is not None and call.name != self.tool_name:
                continue
            if self.require_success and call.status != "success":
                continue
            texts = haystacks(call)
            if pattern is not None and not any(pattern.search(t) for t in texts):
                continue
            if exclude is not None and any(exclude.search(t) for t in texts):
                continue
            found.append(texts[0] if call.name == "Bash" else f"{call.name}({texts[0][:80]})")
        return found

    def live_polarities(self) -> frozenset[LivePolarity]:
        """A pass is final only without a maximum (and with a minimum to reach); a fail only
        with one (the ``max_count: 0`` must-not-run form included)."""
        polarities: set[LivePolarity] = set()
        if self.max_count is None and self.min_count > 0:
            polarities.add("pass")
        if self.max_count is not None:
            polarities.add("fail")
        return frozenset(polarities)

    def live_verdict(self, calls: list[ToolCall]) -> bool | None:
        """From a trajectory still growing: False once over ``max_count``; True once
        ``min_count`` is reached when there is no maximum; None while undecided."""
        try:
            count = len(self.matching(calls))
        except re.error:
            return None
        if self.max_count is not None and count > self.max_count:
            return False
        if self.max_count is None and self.min_count > 0 and count >= self.min_count:
            return True
        return None

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if ctx.tool_calls is None:
            return self.missing_telemetry()
        try:
            found = self.matching(ctx.tool_calls)
        except re.error as exc:
            return self.result(0.0, details="Invalid command_pattern or exclude_pattern", error=f"Invalid regex: {exc}")
        count = len(found)
        if self.max_count is None:
            score = 1.0 if self.min_count == 0 else min(1.0, count / self.min_count)
            counted = f"{count}/{self.min_count} required"
        else:
            score = 1.0 if self.min_count <= count <= self.max_count else 0.0
            counted = f"{count} matches (allowed range {self.min_count}..{self.max_count})"
        details = f"Matched {counted} commands (filters: {self._filters()})"
        if found:
            details += f"\nExamples: {[text[:120] for text in found[:3]]}"
        return self.result(score, details=details)

    def _filters(self) -> str:
        filters = [f"tool_name={self.tool_name}"] if self.tool_name is not None else []
        if self.command_pattern is not None:
            filters.append(f"pattern=/{self.command_pattern}/")
        if self.require_success:
            filters.append("require_success=True")
        if self.exclude_pattern is not None:
            filters.append(f"exclude=/{self.exclude_pattern}/")
        return ", ".join(filters) or "none"


@criterion("commands_efficiency")
class CommandsEfficiency(Criterion):
    """Continuous: ``expected / max(actual, expected)`` — 1.0 within budget, 0.5 at twice it."""

    requires_agent = True

    expected_commands: int = Field(ge=1)

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if ctx.tool_calls is None:
            return self.missing_telemetry()
        actual = len(ctx.tool_calls)
        if actual == 0:
            return self.result(0.0, details="0 tool calls recorded (the agent may not have run)")
        score = self.expected_commands / max(actual, self.expected_commands)
        details = f"{actual} tool calls for a budget of {self.expected_commands} (score: {score:.2f})"
        return self.result(score, details=details)
