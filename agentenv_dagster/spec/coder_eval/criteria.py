"""The task-level rules of ``success_criteria``; each criterion itself is validated by
:func:`agentenv_dagster.criteria.parse_criterion`, which knows the criterion types.

Here: removed types refused with a migration hint, the ``command_not_executed`` alias, at
least one criterion, and the cross-field questions a task asks of its criteria (which need an
agent trajectory, which consume the reference, which set suite thresholds).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from ...errors import SpecError
from .base import FieldErrors, describe_errors, validate_each

REMOVED_CRITERION_TYPES = {
    "program_stdout_equals": "Use 'run_command' with 'expected_stdout' and 'stdout_match' instead.",
    "code_lints": "Use 'run_command' to run your linter directly instead.",
    "scored_command": "Use 'run_command' with 'score_from_stdout: true' instead.",
}
# command_not_executed is command_executed that must match nothing.
ALIASES = {"command_not_executed": {"type": "command_executed", "min_count": 0, "max_count": 0}}

REFERENCE_DIR_TOKEN = "$REFERENCE_DIR"


def parse_success_criteria(value: Any) -> Any:
    """Every criterion parsed (aliases rewritten, removed types refused); all problems at once."""
    if not isinstance(value, list):
        return value
    if not value:
        raise ValueError("At least one success criterion must be defined")
    return validate_each(value, lambda _, item: _parse_criterion(item))


def _parse_criterion(item: Any) -> BaseModel:
    from agentenv_dagster.criteria import parse_criterion

    if not isinstance(item, dict):
        raise ValueError(f"a criterion must be a mapping, got {type(item).__name__}")
    kind = item.get("type")
    if kind in REMOVED_CRITERION_TYPES:
        raise SpecError(f"Criterion type '{kind}' has been removed. {REMOVED_CRITERION_TYPES[kind]}", field="type")
    if kind in ALIASES:
        item = {**item, **ALIASES[kind]}
    try:
        return parse_criterion(item)
    except ValidationError as exc:
        raise FieldErrors(_criterion_errors(exc, item)) from None


def _criterion_errors(exc: ValidationError, item: dict[str, Any]) -> list[SpecError]:
    """The errors of one criterion, located inside it. "Did you mean" needs the criterion's
    model, which is learnt by parsing the criterion again without its unknown keys."""
    unknown = {err["loc"][0] for err in exc.errors() if err["type"] == "extra_forbidden" and len(err["loc"]) == 1}
    model = _model_of({key: value for key, value in item.items() if key not in unknown}) if unknown else BaseModel
    return describe_errors(exc, model)


def _model_of(item: dict[str, Any]) -> type[BaseModel]:
    from agentenv_dagster.criteria import parse_criterion

    try:
        return type(parse_criterion(item))
    except ValueError:
        return BaseModel


def uses_token(path: str, token: str) -> bool:
    """``path`` addresses ``token``: the bare token or token + separator (not ``$TOKENX``)."""
    return path == token or (path.startswith(token) and path[len(token)] in "/\\")


def reference_offenders(criteria: list[BaseModel]) -> list[str]:
    """Criteria that consume the reference solution (a missing one would degrade silently)."""
    offenders = []
    for criterion in criteria:
        kind = getattr(criterion, "type", None)
        if kind == "reference_comparison":
            offenders.append(f"{kind} (needs a reference to compare against)")
        elif any(uses_token(path, REFERENCE_DIR_TOKEN) for path in getattr(criterion, "files", None) or []):
            offenders.append(f"{kind} (files: uses {REFERENCE_DIR_TOKEN})")
        elif REFERENCE_DIR_TOKEN in (getattr(criterion, "command", None) or ""):
            offenders.append(f"{kind} (command: uses {REFERENCE_DIR_TOKEN})")
    return offenders


def agent_only_types(criteria: list[BaseModel]) -> list[str]:
    """The types of criteria that read an agent trajectory, sorted."""
    return sorted({getattr(c, "type", "") for c in criteria if getattr(type(c), "requires_agent", False)})


def first_suite_thresholds(criteria: list[BaseModel]) -> int | None:
    """The index of the first criterion with suite thresholds (they need a dataset)."""
    return next((i for i, c in enumerate(criteria) if getattr(c, "suite_thresholds", None)), None)
