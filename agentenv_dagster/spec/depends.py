"""`depends_on`: accepted forms, normalisation and the DAG checks, with agent-env's wording."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from typing import Any, Sequence

from ..errors import SpecError, excerpt

DEPENDS_ON_ENTRY_HINT = 'a depends_on entry is a step id or {"task_step_id": "<step id>"}'


def normalize_depends_on(value: Any) -> list[Any] | None:
    """Bare ids and ``{"task_step_id": ...}`` objects become plain ids; ``None`` stays ``None``
    (it means "after every earlier step", unlike ``[]``, a root)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise SpecError(f"depends_on is a list of step ids, not {excerpt(value)}", field="depends_on")
    ids: list[Any] = []
    for entry in value:
        if isinstance(entry, str):
            ids.append(entry)
        elif isinstance(entry, dict) and "task_step_id" in entry:
            ids.append(entry["task_step_id"])  # a non-string id is taken as-is, as upstream
        else:
            raise SpecError(f"{DEPENDS_ON_ENTRY_HINT}, not {excerpt(entry)}", field="depends_on")
    return ids


def check_dag(steps: Sequence[tuple[str, list[Any] | None]]) -> list[SpecError]:
    """Duplicate ids, forward/self references and unknown ids, as ``Task._validate_dag``."""
    errors: list[SpecError] = []
    all_ids = {step_id for step_id, _ in steps}
    seen: set[str] = set()
    seen_sorted: list[str] = []  # kept sorted as steps are seen, for the unknown-id message
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
            if _hashable(dep) and dep in seen:
                continue
            if _hashable(dep) and dep in all_ids:
                reason = (
                    "which doesn't come before it (forward refs are not allowed: "
                    "a step depends only on the steps before it)"
                )
            else:
                reason = f"which names no step in this task (steps before it: {excerpt(seen_sorted)})"
            errors.append(
                SpecError(
                    f"Step '{step_id}' at position {position} declares depends_on '{dep}', {reason}",
                    step_id=step_id,
                    field="depends_on",
                )
            )
        if step_id not in seen:
            seen.add(step_id)
            bisect.insort(seen_sorted, step_id)
    return errors


def _hashable(value: Any) -> bool:
    """A depends_on entry is taken as-is (even ``{"task_step_id": [..]}``); only a hashable
    one can name a step."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def check_retry_targets(steps: Sequence[tuple[str, list[Any] | None, str | None]]) -> list[SpecError]:
    """``retry_config.retry_from_step_id`` names the step itself or a dependency ancestor
    (absent depends_on = every earlier step), as ``Task._validate_dag``. Needs a valid DAG."""
    targets = {position: target for position, (step_id, _, target) in enumerate(steps)
               if target is not None and target != step_id}
    if not targets:
        return []
    ids = [step_id for step_id, _, _ in steps]
    position_of = {step_id: position for position, step_id in enumerate(ids)}
    errors: list[SpecError] = []
    for position, ancestors in ancestry_pass([(s, d) for s, d, _ in steps], lambda i: 1 << i):
        target = targets.get(position)
        if target is None or (target in position_of and ancestors >> position_of[target] & 1):
            continue
        step_id = ids[position]
        ancestor_ids = sorted(ids[i] for i in range(position) if ancestors >> i & 1)
        errors.append(
            SpecError(
                f"Step '{step_id}' at position {position} declares retry_config.retry_from_step_id "
                f"'{target}' which is not in the step's dependency ancestry "
                f"(ancestor ids: {excerpt(ancestor_ids)})",
                step_id=step_id,
                field="retry_config",
            )
        )
    return errors


def ancestry_pass(
    steps: Sequence[tuple[str, list[Any] | None]], contribution: Callable[[int], int], *, keep: bool = False,
) -> Iterator[tuple[int, int]]:
    """For each step in list order (a topological order): its position and the union (a bit
    set) of ``contribution(a)`` over its dependency ancestors ``a``, in one pass.

    An absent depends_on (every earlier step) takes the union over every earlier step at once;
    a step's union is kept only until its last explicit dependent has taken it (every one with
    ``keep``), so a chain holds one union at a time. Needs a valid DAG (:func:`check_dag`)."""
    position_of = {step_id: position for position, (step_id, _) in enumerate(steps)}
    last_use: dict[int, int] = {}
    for position, (_, depends_on) in enumerate(steps):
        for dep in depends_on or ():
            last_use[position_of[dep]] = position
    inherited: dict[int, int] = {}  # position -> the union of its ancestors and itself
    everything = 0  # the union over every step so far
    for position, (_, depends_on) in enumerate(steps):
        if depends_on is None:
            union = everything
        else:
            union = 0
            for dep in depends_on:
                union |= inherited[position_of[dep]]
        yield position, union
        own = contribution(position)
        everything |= own
        if keep or position in last_use:
            inherited[position] = union | own
        if not keep:
            for dep in depends_on or ():
                if last_use.get(position_of[dep]) == position:
                    inherited.pop(position_of[dep], None)


def resolve_edges(steps: Sequence[tuple[str, list[Any] | None]]) -> dict[str, tuple[str, ...]]:
    """Which steps each step waits for: absent = every earlier step, ``[]`` = none."""
    edges: dict[str, tuple[str, ...]] = {}
    earlier: list[str] = []
    for step_id, depends_on in steps:
        edges[step_id] = tuple(earlier) if depends_on is None else tuple(depends_on)
        earlier.append(step_id)
    return edges
