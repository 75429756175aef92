"""Coder Eval success criteria: pure checkers over a sandbox directory and an agent's tool calls.

Importing this package registers every built-in type in ``CRITERION_TYPES``;
``parse_criterion`` validates one criterion of a task file, ``evaluate_all`` grades a task's.
"""

from . import (  # noqa: F401 - importing a family registers its types
    classification,
    cli,
    files,
    json_check,
    judges,
    python_checks,
    reference,
    run_command,
    trajectory,
    uipath,
)
from .aggregate import CriterionAggregate, ThresholdCheck, aggregate, classification_metrics
from .base import (
    CheckerMisuseError,
    Criterion,
    CriterionContext,
    CriterionResult,
    JudgeInfrastructureError,
    StopEarly,
    ToolCall,
    evaluate_all,
    task_passed,
    weighted_score,
)
from .registry import CRITERION_TYPES, criterion, parse_criterion

__all__ = [
    "CRITERION_TYPES",
    "CheckerMisuseError",
    "Criterion",
    "CriterionAggregate",
    "CriterionContext",
    "CriterionResult",
    "JudgeInfrastructureError",
    "StopEarly",
    "ThresholdCheck",
    "ToolCall",
    "aggregate",
    "classification_metrics",
    "criterion",
    "evaluate_all",
    "parse_criterion",
    "task_passed",
    "weighted_score",
]
