"""Names Dagster accepts, derived from task and step ids (no Dagster import: cheap)."""

from __future__ import annotations

import re

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def dagster_name(text: str) -> str:
    """``text`` with every character outside ``[A-Za-z0-9_]`` mapped to ``_``."""
    return _INVALID.sub("_", text)


def job_name(task_id: str) -> str:
    return dagster_name(task_id)


def node_name(step_id: str) -> str:
    return dagster_name(step_id)
