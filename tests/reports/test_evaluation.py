"""A row's outcome from its context alone: what its ``results`` asset says and the CLI's progress
counts, by the final status rules of the reports."""

from __future__ import annotations

import pytest

from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.reports.evaluation import row_outcome


def context(verifications=None, responses=(), failed_steps=()) -> TaskStepContext:
    return TaskStepContext.from_dict({
        "metadata": {"verifications": verifications or {}, "failed_steps": list(failed_steps)},
        "prompt_responses": [{"prompt_id": "ask", "response": "", **r} for r in responses],
    })


PASSED = {"score": 1.0}
FELL_SHORT = {"score": 0.5}


@pytest.mark.parametrize("row, outcome", [
    (context(), "passed"),  # nothing to grade: its steps are done
    (context({"a": PASSED, "b": {"passed": True, "score": 0.2}}), "passed"),
    (context({"a": PASSED, "b": FELL_SHORT}), "failed"),
    (context({"a": PASSED, "b": {"score": None, "reason": "no judge"}}), "not graded"),
    (context({"a": FELL_SHORT, "b": {"score": None}}), "failed"),
    (context({"a": PASSED}, [{"error_type": "AgentTimeout"}]), "failed"),  # upstream's TIMEOUT counts as failed
    (context({"a": PASSED}, [{"error_type": "NoScriptedReply"}]), "errored"),
    (context({"a": PASSED}, failed_steps=[{"step_id": "env", "error": "down", "is_fatal": True}]), "errored"),
    (context({"a": PASSED}, failed_steps=[{"step_id": "note", "error": "x", "is_fatal": False}]), "passed"),
    (context({"a": PASSED}, failed_steps=[{"step_id": "b", "error": "x", "is_fatal": True, "retried": True}]),
     "passed"),  # a retry ran the step again, and it passed
    (context({"a": PASSED}, failed_steps=[{"step_id": "ask", "step_type": "prompt_agent", "error": "x"}]), "errored"),
])
def test_a_row_s_outcome_is_its_worst_verdict(row, outcome):
    assert row_outcome(row) == outcome
