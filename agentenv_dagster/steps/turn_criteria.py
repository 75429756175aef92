"""Coder Eval criteria graded between the turns of a dialog (``check_criteria: every_turn``).

The same checkers the ``success_criteria`` step runs, over the workspace as the agent left it
after a turn and every tool call so far, so ``stop_on_criteria_pass`` can end the dialog the
moment the task is done. The verdict of record still comes from ``success_criteria``.
"""

from __future__ import annotations

from typing import Any

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from .coder import criterion_context


async def grade_turn(ctx: TaskStepContext, rt: StepRuntime, sandbox_name: str, criteria: list[dict[str, Any]],
                     events: list[dict[str, Any]], dialog: list[dict[str, str]], *,
                     time_limit: float | None = None) -> dict[str, Any]:
    """``{"passed", "score"}`` of the criteria now (their checks within ``time_limit``
    seconds); ``passed`` is None when not gradable."""
    from ..criteria import evaluate_all, parse_criterion, task_passed, weighted_score

    criterion_ctx = criterion_context(ctx, rt, sandbox_name, events,
                                      final_text=dialog[-1]["agent"] if dialog else "", dialog=dialog,
                                      time_limit=time_limit)
    results = await evaluate_all([parse_criterion(c) for c in criteria], criterion_ctx)
    return {"passed": task_passed(results), "score": weighted_score(results)}
