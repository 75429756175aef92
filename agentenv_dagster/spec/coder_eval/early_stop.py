"""``stop_early`` at resolution: is the resolved task armed, and can this run honour it.

Checked on the task as it will run (after variants and ``-D``), because the kill switch
``run_limits.stop_early: false`` must be able to rescue a task that could not run armed.
Upstream's order and wording; the first problem is the one reported.
"""

from __future__ import annotations

from typing import Any

from ...errors import SpecError
from .agents import AGENT_KINDS
from .limits import DEFAULT_STOP_EARLY_GATE_THRESHOLD
from .task import TaskDefinition


def early_stop_active(task: TaskDefinition) -> bool:
    """The run builds a watcher: some criterion carries a block and the kill switch is not thrown."""
    if task.run_limits is not None and task.run_limits.stop_early is False:
        return False
    return any(getattr(c, "stop_early", None) is not None for c in task.success_criteria)


def early_stop_problem(task: TaskDefinition) -> SpecError | None:
    """Why the resolved task cannot run with its arming, or None."""
    limits = task.run_limits
    if limits is not None and limits.stop_early is True:
        return SpecError(
            "run_limits.stop_early: true has been removed — arming is per-criterion now. "
            "Put a stop_early: block on the live-observable criterion instead "
            "(e.g. stop_early: {} / {on_pass: stop} / {decide_within: N}); "
            "run_limits.stop_early: false remains available as the run-level kill switch.",
            field="run_limits.stop_early",
        )
    if not early_stop_active(task):
        return None
    if task.in_simulation:
        return SpecError(
            "criterion-level stop_early arming is not supported together with simulation.enabled "
            "(early-stop v1 is single-shot only); use simulation.stop_on_criteria_pass "
            "for dialog-mode criteria stopping, or disarm with run_limits.stop_early: false.",
            field="simulation.enabled",
        )
    agent_type = task.agent.type if task.agent is not None else None
    if agent_type is None:
        return SpecError(
            "criterion-level stop_early arming requires an agent block with a registered type; "
            "this task resolves without one. "
            "Disarm with run_limits.stop_early: false to bypass this check.",
            field="agent.type",
        )
    # An unregistered type never gets here: the agent block already refused it at load.
    if not AGENT_KINDS[agent_type].supports_cooperative_stop:
        supporting = ", ".join(kind for kind, model in AGENT_KINDS.items() if model.supports_cooperative_stop)
        return SpecError(
            "criterion-level stop_early arming requires an agent that supports cooperative stopping "
            f"({supporting}); agent type {agent_type!r} does not. "
            "Disarm with run_limits.stop_early: false to run this agent anyway.",
            field="agent.type",
        )
    if limits is not None and limits.stop_early_gate_threshold <= 0.0:
        return SpecError(
            f"run_limits.stop_early_gate_threshold ({limits.stop_early_gate_threshold}) must be "
            "> 0.0 on an armed task (a threshold of 0 trivially passes the armed gate "
            "regardless of whether any armed criterion actually decided).",
            field="run_limits.stop_early_gate_threshold",
        )
    return None


def watcher_config(task: TaskDefinition, criteria: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What the agent's watcher is configured with (the armed criteria, as documents, and the
    gate), or None for an unarmed run."""
    if not early_stop_active(task):
        return None
    limits = task.run_limits
    return {
        "task_id": task.task_id,
        "criteria": [doc for doc in criteria if doc.get("stop_early") is not None],
        "gate_threshold": limits.stop_early_gate_threshold if limits is not None else DEFAULT_STOP_EARLY_GATE_THRESHOLD,
    }
