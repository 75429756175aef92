"""Names Dagster accepts, derived from task and step ids (no Dagster import: cheap)."""

from __future__ import annotations

import re

_INVALID = re.compile(r"[^A-Za-z0-9_]")


def job_name(task_id: str) -> str:
    """Task id with every character outside ``[A-Za-z0-9_]`` mapped to ``_``."""
    return _INVALID.sub("_", task_id)


def node_name(step_id: str) -> str:
    return _INVALID.sub("_", step_id)
