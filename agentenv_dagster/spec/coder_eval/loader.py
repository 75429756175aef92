"""Load Coder Eval task and experiment YAML: parse, validate, resolve paths beside the file.

Every problem is a :class:`SpecError` located as ``<file>: field '<dotted.path>': <reason>``
and all of a file's problems are raised together as one :class:`TaskLoadError`; warnings
(unknown top-level keys, ...) are returned, never printed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from ...errors import SpecError, TaskLoadError
from ..documents import load_yaml, mapping_key_lines, read_text
from .base import WARNINGS_KEY, describe_errors
from .experiment import ExperimentDefinition
from .resolve import resolve_experiment, resolve_task
from .task import TaskDefinition

YAML_SUFFIXES = (".yaml", ".yml")
M = TypeVar("M", bound=BaseModel)
NOT_A_TASK = "not a Coder Eval task (a mapping with task_id and success_criteria)"
AN_EXPERIMENT = ("a Coder Eval experiment, not a task: run a task under it with "
                 "`agentenv-dagster run TASK --experiment FILE` (or list it under [experiments])")


@dataclass(frozen=True)
class LoadedCoderEvalTask:
    """A validated task with its paths resolved, where it came from, and its load warnings."""

    task: TaskDefinition
    source: Path
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LoadedExperiment:
    experiment: ExperimentDefinition
    source: Path
    warnings: list[str] = field(default_factory=list)


def load_coder_eval_task(path: str | Path) -> LoadedCoderEvalTask:
    """Read one task YAML; raise :class:`TaskLoadError` with every problem in it."""
    path = Path(path)
    data = read_yaml_mapping(path, "task")
    if not _looks_like_a_task(data):
        kind = _kind_of(data)
        raise TaskLoadError([SpecError(AN_EXPERIMENT if kind == "experiment" else NOT_A_TASK, file=str(path))])
    task, warnings = _validate(TaskDefinition, data, path)
    task, problems = resolve_task(task, path.parent.resolve())
    _raise_if_any(problems, path)
    return LoadedCoderEvalTask(task=task, source=path, warnings=warnings)


def load_coder_eval_experiment(path: str | Path) -> LoadedExperiment:
    """Read one experiment YAML; raise :class:`TaskLoadError` with every problem in it."""
    path = Path(path)
    experiment, warnings = _validate(ExperimentDefinition, read_yaml_mapping(path, "experiment"), path)
    experiment, problems = resolve_experiment(experiment, path.parent.resolve())
    _raise_if_any(problems, path)
    return LoadedExperiment(experiment=experiment, source=path, warnings=warnings)


def is_coder_eval_document(path: str | Path) -> bool:
    """Whether ``path`` is a Coder Eval task or experiment, by content."""
    return coder_eval_kind(path) is not None


def coder_eval_kind(path: str | Path) -> str | None:
    """``"task"`` for a Coder Eval task (a YAML mapping with ``task_id`` and
    ``success_criteria``), ``"experiment"`` (``experiment_id`` and ``variants``), else None
    (also for a file that cannot be read or parsed within the input limits)."""
    path = Path(path)
    if path.suffix.lower() not in YAML_SUFFIXES or not path.is_file():
        return None
    try:
        data = load_yaml(path)
    except SpecError:
        return None
    return _kind_of(data)


def _kind_of(data: Any) -> str | None:
    if not isinstance(data, dict):
        return None
    if {"task_id", "success_criteria"} <= data.keys():
        return "task"
    return "experiment" if {"experiment_id", "variants"} <= data.keys() else None


def _looks_like_a_task(data: dict[str, Any]) -> bool:
    """A task, or an attempt at one whose problems are worth naming: it has task fields
    besides ``task_id``, or a key that is (close to) ``success_criteria``."""
    if _kind_of(data) == "task":
        return True
    keys = [key for key in data if isinstance(key, str)]
    fields = set(TaskDefinition.model_fields) - {"task_id"}
    return bool(fields & set(keys)) or any(difflib.get_close_matches("success_criteria", keys, n=1))


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The file's YAML mapping, read within the input limits; an unreadable file, bad YAML
    (with line and column), a document over a limit or another shape is a
    :class:`TaskLoadError`."""
    source = str(path)
    try:
        data = load_yaml(path)
    except SpecError as exc:
        raise TaskLoadError([exc]) from None
    if not isinstance(data, dict):
        got = "an empty document" if data is None else type(data).__name__
        raise TaskLoadError([SpecError(f"a Coder Eval {what} must be a YAML mapping, got {got}", file=source)])
    return data


def _validate(model: type[M], data: dict[str, Any], path: Path) -> tuple[M, list[str]]:
    warnings: list[str] = []
    try:
        value = model.model_validate(data, context={WARNINGS_KEY: warnings})
    except ValidationError as exc:
        errors = describe_errors(exc, model)
        raise TaskLoadError([error.located(str(path)) for error in _misspelled_required(errors, data, path)]) from None
    return value, [f"{path}: {warning}" for warning in warnings]


def _misspelled_required(errors: list[SpecError], data: dict[str, Any], path: Path) -> list[SpecError]:
    """A required top-level field reported missing while the document has an unknown key
    close to it (``sucess_criteria``) is that key's problem: named at its line, with the
    right spelling."""
    unknown = [key for key in data if isinstance(key, str) and key not in TaskDefinition.model_fields
               and key not in ExperimentDefinition.model_fields]
    lines: dict[str, int] | None = None
    found = []
    for error in errors:
        top_level = error.field and "." not in error.field
        close = (difflib.get_close_matches(error.field, unknown, n=1)
                 if top_level and error.message == "required field is missing" else [])
        if not close:
            found.append(error)
            continue
        if lines is None:
            try:
                lines = mapping_key_lines(read_text(path))
            except SpecError:  # gone since it was read: the problem stands without a line
                lines = {}
        found.append(SpecError(f"unknown field (did you mean '{error.field}'? '{error.field}' is required)",
                               field=close[0], line=lines.get(close[0])))
    return found


def _raise_if_any(problems: list[SpecError], path: Path) -> None:
    if problems:
        raise TaskLoadError([problem.located(str(path)) for problem in problems])
