"""A turn's trajectory in the order it happened: its messages and tool calls interleaved, as the
row pages show it.

task.json keeps the tool calls (`TurnRecord.commands`, which the criteria read) apart from the
messages; each message records how many tool calls came before it, which is enough to put
them back in order. A record without messages (written before they were kept, or by another
runner) reads as the prompt, then the tool calls, then the reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .telemetry import CommandTelemetry, TurnRecord

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class TimelineMessage:
    role: Literal["user", "assistant", "other"]
    text: str
    kind: Literal["message"] = "message"


@dataclass(frozen=True)
class TimelineCall:
    number: int  # 1-based, within the turn
    command: CommandTelemetry
    kind: Literal["tool_call"] = "tool_call"


def timeline(turn: TurnRecord) -> list[TimelineMessage | TimelineCall]:
    """The turn's messages and tool calls in order."""
    calls = [TimelineCall(i, c) for i, c in enumerate(turn.commands, start=1)]
    if not turn.messages:
        entries: list[TimelineMessage | TimelineCall] = [TimelineMessage("user", turn.user_input)] if turn.user_input else []
        entries += calls
        return entries + ([TimelineMessage("assistant", turn.agent_output)] if turn.agent_output else [])
    entries, shown = [], 0
    for message in turn.messages:
        before = _count(message.get("tool_calls_before"), len(calls))
        entries += calls[shown:max(before, shown)]
        shown = max(before, shown)
        role = message.get("role")
        entries.append(TimelineMessage(role if role in ROLES else "other", str(message.get("content") or "")))
    return entries + calls[shown:]


def _count(value: object, most: int) -> int:
    """A recorded count, kept within the turn's tool calls (a record may be hand-edited)."""
    return min(max(value, 0), most) if isinstance(value, int) else most
