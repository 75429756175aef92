"""`depends_on`: accepted forms, normalisation and the DAG checks, with agent-env's wording."""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import SpecError

DEPENDS_ON_ENTRY_HINT = 'a depends_on entry is a step id or {"task_step_id": "<step id>"}'


def normalize_depends_on(value: Any) -> list[Any] | None:
    """Bare ids and ``{"task_step_id": ...}`` objects become plain ids; ``None`` stays ``None``
    (it means "after every earlier step", unlike ``[]``, a root)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise SpecError(f"depends_on is a list of step ids, not {value!r}", field="depends_on")
    ids: list[Any] = []
    for entry in value:
        if isinstance(entry, str):
            ids.append(entry)
        elif isinstance(entry, dict) and "task_step_id" in entry:
            ids.append(entry["task_step_id"])  # a non-string id is taken as-is, as upstream
        else:
            raise SpecError(f"{DEPENDS_ON_ENTRY_HINT}, not {entry!r}", field="depends_on")
    return ids


def check_dag(steps: Sequence[tuple[str, list[Any] | None]]) -> list[SpecError]:
    """Duplicate ids, forward/self references and unknown ids, as ``Task._validate_dag``."""
    errors: list[SpecError] = []
    all_ids = [step_id for step_id, _ in steps]
    seen: list[str] = []
    for position, (step_id, depends_on) in enumerate(steps):
        if step_id in seen:
            errors.append(
                SpecError(
                    f"Duplicate step id '{step_id}' at position {position}; "
                    "step ids must be unique within a task",
                    step_id=step_id,
                )
            )
        for dep in depends_on or []:
            if dep in seen:
                continue
            if dep in all_ids:
                reason = (
                    "which doesn't come before it (forward refs are not allowed: "
                    "a step depends only on the steps before it)"
                )
            else:
                reason = f"which names no step in this task (steps before it: {sorted(seen)})"
            errors.append(
                SpecError(
                    f"Step '{step_id}' at position {position} declares depends_on '{dep}', {reason}",
                    step_id=step_id,
                    field="depends_on",
                )
            )
        seen.append(step_id)
    return errors


def check_retry_targets(steps: Sequence[tuple[str, list[Any] | None, str | None]]) -> list[SpecError]:
    """``retry_config.retry_from_step_id`` names the step itself or a dependency ancestor
    (absent depends_on = every earlier step), as ``Task._validate_dag``. Needs a valid DAG."""
    edges = resolve_edges([(step_id, depends_on) for step_id, depends_on, _ in steps])
    ancestors: dict[str, set[Any]] = {}
    errors: list[SpecError] = []
    for position, (step_id, _, target) in enumerate(steps):
        deps = edges[step_id]
        ancestors[step_id] = set(deps).union(*(ancestors[d] for d in deps))
        if target is None or target == step_id or target in ancestors[step_id]:
            continue
        errors.append(
            SpecError(
                f"Step '{step_id}' at position {position} declares retry_config.retry_from_step_id "
                f"'{target}' which is not in the step's dependency ancestry "
                f"(ancestor ids: {sorted(ancestors[step_id])})",
                step_id=step_id,
                field="retry_config",
            )
        )
    return errors


def resolve_edges(steps: Sequence[tuple[str, list[Any] | None]]) -> dict[str, tuple[str, ...]]:
    """Which steps each step waits for: absent = every earlier step, ``[]`` = none."""
    edges: dict[str, tuple[str, ...]] = {}
    earlier: list[str] = []
    for step_id, depends_on in steps:
        edges[step_id] = tuple(earlier) if depends_on is None else tuple(depends_on)
        earlier.append(step_id)
    return edges
