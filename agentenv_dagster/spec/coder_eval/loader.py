"""Load Coder Eval task and experiment YAML: parse, validate, resolve paths beside the file.

Every problem is a :class:`SpecError` located as ``<file>: field '<dotted.path>': <reason>``
and all of a file's problems are raised together as one :class:`TaskLoadError`; warnings
(unknown top-level keys, ...) are returned, never printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from ...errors import SpecError, TaskLoadError
from .base import WARNINGS_KEY, describe_errors
from .experiment import ExperimentDefinition
from .resolve import resolve_experiment, resolve_task
from .task import TaskDefinition

YAML_SUFFIXES = (".yaml", ".yml")
M = TypeVar("M", bound=BaseModel)


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
    task, warnings = _validate(TaskDefinition, read_yaml_mapping(path, "task"), path)
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
    ``success_criteria``), ``"experiment"`` (``experiment_id`` and ``variants``), else None."""
    path = Path(path)
    if path.suffix.lower() not in YAML_SUFFIXES or not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    if {"task_id", "success_criteria"} <= data.keys():
        return "task"
    return "experiment" if {"experiment_id", "variants"} <= data.keys() else None


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """The file's YAML mapping; an unreadable file, bad YAML (with line and column) or another
    shape is a :class:`TaskLoadError`."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskLoadError([SpecError(f"cannot read file: {exc.strerror}", file=source)]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise TaskLoadError([SpecError(f"invalid YAML{where}: {exc.problem or exc.context}", file=source)]) from None
    except yaml.YAMLError as exc:
        raise TaskLoadError([SpecError(f"invalid YAML: {exc}", file=source)]) from None
    if not isinstance(data, dict):
        got = "an empty document" if data is None else type(data).__name__
        raise TaskLoadError([SpecError(f"a Coder Eval {what} must be a YAML mapping, got {got}", file=source)])
    return data


def _validate(model: type[M], data: dict[str, Any], path: Path) -> tuple[M, list[str]]:
    warnings: list[str] = []
    try:
        value = model.model_validate(data, context={WARNINGS_KEY: warnings})
    except ValidationError as exc:
        raise TaskLoadError([error.located(str(path)) for error in describe_errors(exc, model)]) from None
    return value, [f"{path}: {warning}" for warning in warnings]


def _raise_if_any(problems: list[SpecError], path: Path) -> None:
    if problems:
        raise TaskLoadError([problem.located(str(path)) for problem in problems])
