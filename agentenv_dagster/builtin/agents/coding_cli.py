"""What the claude-code and codex agents share: a real coding agent's CLI working in the
sandbox folder, whose own tool calls become our telemetry.

Those CLIs run their tools themselves (Bash, Write, the env's MCP tools), so nothing passes
through ``TaskSession.call_tool``; :class:`ToolCallLog` turns each start/result pair the CLI
reports into the same ``tool_call`` event the other agents record (name, arguments,
started_at, duration_seconds, is_error, result), which is what the Coder Eval criteria grade.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from agentenv_dagster.builtin.agents.server import AgentFailure, EarlyStop, TaskSession

RESULT_LIMIT = 20_000
UNFINISHED = "no result: the agent ended before the tool returned"


class ToolCallLog:
    """Open tool calls by the CLI's call id; each finished one is recorded and counted."""

    def __init__(self, session: TaskSession) -> None:
        self.session = session
        self._open: dict[str, tuple[str, dict, datetime, float]] = {}

    def started(self, call_id: str, name: str, arguments: dict[str, Any]) -> None:
        self._open[call_id] = (name, arguments, datetime.now(timezone.utc), time.monotonic())
        if self.session.tool_started(call_id, name, arguments):
            raise EarlyStop()  # the brain's finally ends the CLI; the call stays unresolved

    def finished(self, call_id: str, *, is_error: bool, result: str, name: str | None = None,
                 arguments: dict[str, Any] | None = None, resolved: bool = True) -> None:
        """Record a call; one reported only when done (no start seen) has a zero duration."""
        opened = self._open.pop(call_id, None)
        if opened is None:
            opened = (name or "unknown", arguments or {}, datetime.now(timezone.utc), time.monotonic())
        started_name, started_arguments, started_at, clock = opened
        self.session.tool_call_count += 1
        self.session.record({
            "type": "tool_call", "name": name or started_name,
            "arguments": arguments if arguments is not None else started_arguments,
            "started_at": started_at.isoformat(), "duration_seconds": time.monotonic() - clock,
            "is_error": is_error, "result": result[-RESULT_LIMIT:],
        })
        if resolved and self.session.tool_ended(call_id, name or started_name, arguments or started_arguments, is_error):
            raise EarlyStop()

    def close(self) -> None:
        """Calls still open when the agent stopped: recorded as errors without a result."""
        for call_id in list(self._open):
            self.finished(call_id, is_error=True, result=UNFINISHED, resolved=False)


def require_key(names: tuple[str, ...], kind: str) -> None:
    """Fail the task clearly when none of the key variables is in the agent's environment."""
    if not any(os.environ.get(name) for name in names):
        raise AgentFailure("MissingAPIKey", f"{' or '.join(names)} is not set in the agent's environment; "
                                            f"the {kind} agent reads its key only from there")


def cli_path_env(sandbox_root: Path, workspace: dict | None) -> dict[str, str]:
    """``PATH`` with the workspace's ``path_prepend`` folders (CLI mocks) first, as the
    embedded agents' Bash has it; empty when there are none."""
    folders = [str(sandbox_root / folder) for folder in (workspace or {}).get("path_prepend") or []]
    return {"PATH": os.pathsep.join([*folders, os.environ.get("PATH", "")])} if folders else {}


def text_of(content: Any) -> str:
    """A tool result's text: a string, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "" if content is None else str(content)
