"""Builders shared by the criteria tests: a context over a real temp sandbox, tool calls, grading."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentenv_dagster.criteria import Criterion, CriterionContext, CriterionResult, ToolCall, parse_criterion


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def context(sandbox: Path, calls: list[ToolCall] | None = None, **fields) -> CriterionContext:
    """A context whose task dir defaults to the sandbox; ``calls=None`` means no telemetry."""
    return CriterionContext(
        sandbox_dir=sandbox, task_dir=fields.pop("task_dir", sandbox), reference_dir=fields.pop("reference_dir", None),
        tool_calls=calls, final_text=fields.pop("final_text", ""), **fields,
    )


def grade(criterion: dict | Criterion, ctx: CriterionContext) -> CriterionResult:
    if isinstance(criterion, dict):
        criterion = parse_criterion({"description": "under test", **criterion})
    return asyncio.run(criterion.evaluate(ctx))


def call(name: str, status: str | None = "success", **parameters) -> ToolCall:
    return ToolCall(name=name, parameters=parameters, status=status)


def bash(command, status: str | None = "success") -> ToolCall:
    return call("Bash", status, command=command)
