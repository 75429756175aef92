"""Load agent-env task documents: parse, check the DAG, validate each step's fields.

Every problem in a file is collected and reported at once, each located as
``<file>: step '<id>': field '<f>': <message>``; a pydantic dump never reaches the user.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import BaseModel, ValidationError

from ..errors import SpecError, TaskLoadError, clip, excerpt
from ..ids import UnsafeIdError, check_id
from .depends import check_dag, check_retry_targets, normalize_depends_on
from .documents import ValueProblem, check_values, parse_json, read_text

if TYPE_CHECKING:
    from ..steps.base import TaskStep
    from ..steps.registry import StepRegistry
    from .coder_eval.dataset import RowSampling

NOT_A_STEP_LIST = "JSON file must contain a list of step dicts"
# An experiment's partition key: Dagster's MultiPartitionKey, the dimensions' keys in the
# order of their names (``row``, ``variant``); a task without a dataset is keyed by variant.
VARIANT_SEPARATOR = "|"


def variant_key(row: str | None, variant: str) -> str:
    return f"{row}{VARIANT_SEPARATOR}{variant}" if row else variant


@dataclass(frozen=True)
class TaskDocument:
    """A validated task: its id, version and typed steps, and where it came from."""

    task_id: str
    version: int | None
    steps: tuple["TaskStep", ...]
    source: str
    format: str = "agent-env"  # or "coder-eval": a Coder Eval YAML lowered to steps
    # A dataset task's rows: partition key (row id) -> the metadata.seed that fills its steps.
    partitions: dict[str, dict[str, Any]] | None = None
    # The stored form's ``seed``: what its ``<key>`` tokens become when the run's metadata.seed
    # does not set them, so a task aimed with ``-D metadata.seed.key=...`` also runs as it is.
    seed: dict[str, Any] | None = None
    # A dataset's ``sample_per_stratum``: the rows a run takes when it names none.
    sampling: RowSampling | None = None
    # A task under an experiment: each variant's steps (same ids, types and joins as
    # ``steps``, the first variant's); ``partitions`` are then keyed ``<row>|<variant>``.
    variant_steps: dict[str, tuple["TaskStep", ...]] | None = None
    # How many rows of a dataset hold their deployments at once (Coder Eval ``dataset.max_sandboxes``).
    max_sandboxes: int | None = None
    # How many replicates a launch runs (a simulation's ``n_trials``; under an experiment, a
    # variant's ``repeats``, or its trials in a simulation), by variant (``""``: the task
    # itself); absent is 1.
    replicates: dict[str, int] | None = None
    # What the task is about, in its author's words (Coder Eval ``description``).
    description: str | None = None

    def step_documents(self) -> list[dict[str, Any]]:
        return [step.to_document() for step in self.steps]

    def selected_rows(self, variant: str | None = None) -> list[str]:
        """The partitions a run that names none takes: a new stratified draw (seeded by
        ``sample_seed``), or every row; of an experiment, under ``variant``."""
        rows = self.sampling.draw() if self.sampling else self.row_ids()
        if self.variant_steps is None:
            return rows
        return [variant_key(row, variant) for row in rows] if rows else [variant]

    def row_ids(self) -> list[str]:
        """The dataset's row ids, in order (an experiment's partitions are rows x variants)."""
        return list(dict.fromkeys(filter(None, map(self.row_of, self.partitions or {}))))

    def row_of(self, key: str) -> str:
        """A partition's row id (``""`` for an experiment's variant without a dataset)."""
        if self.variant_steps is None:
            return key
        return key.split(VARIANT_SEPARATOR)[0] if VARIANT_SEPARATOR in key else ""

    def variant_of(self, key: str) -> str | None:
        return key.rsplit(VARIANT_SEPARATOR, 1)[-1] if self.variant_steps is not None else None

    def replicates_of(self, variant: str | None) -> int:
        return (self.replicates or {}).get(variant or "", 1)

    def steps_for(self, key: str | None) -> tuple["TaskStep", ...]:
        """The steps a partition runs: its variant's, else the task's."""
        variant = self.variant_of(key) if key else None
        return self.variant_steps[variant] if variant is not None else self.steps

    @property
    def content_hash(self) -> str:
        """Hash of what runs (id + steps), so a re-execution can refuse a changed task."""
        canonical = json.dumps(
            {"id": self.task_id, "steps": self.step_documents(), "partitions": self.partitions,
             **({"seed": self.seed} if self.seed else {}),
             **({"sample": [self.sampling.per_stratum, self.sampling.seed]} if self.sampling else {}),
             **({"variants": {v: [s.to_document() for s in steps] for v, steps in self.variant_steps.items()}}
                if self.variant_steps else {}),
             **({"replicates": self.replicates} if self.replicates else {})},
            sort_keys=True, default=str,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def load_task_file(path: str | Path, registry: "StepRegistry") -> TaskDocument:
    """Read one JSON task document; raise :class:`TaskLoadError` with every problem in it."""
    path = Path(path)
    source = str(path)
    try:
        data = parse_json(read_text(path), check=False)
        check_values(data)
    except ValueProblem as exc:
        raise TaskLoadError([_at_step(exc, data).located(source)]) from None
    except SpecError as exc:
        raise TaskLoadError([exc.located(source)]) from None
    return parse_task_document(data, source=source, default_id=path.stem, registry=registry)


def _at_step(problem: ValueProblem, data: Any) -> SpecError:
    """A value problem inside a step, located at the step's id and its field there."""
    path = problem.path
    if isinstance(data, dict) and path[:1] == ("steps",):
        data, path = data["steps"], path[1:]
    if not (isinstance(data, list) and path and path[0].isdigit() and len(path) > 1):
        return problem
    step = data[int(path[0])]
    if not (isinstance(step, dict) and isinstance(step.get("id"), str)):
        return problem
    return SpecError(problem.message, step_id=step["id"], field=".".join(path[1:]))


def parse_task_document(
    data: Any, *, source: str, default_id: str, registry: "StepRegistry", format: str = "agent-env"
) -> TaskDocument:
    """Both stored forms: a bare list of steps, or ``{id, type: "task", version, steps}``
    (plus an optional ``seed`` of default token values)."""
    task_id, version, raw_steps, seed = default_id, None, data, None
    if isinstance(data, dict):
        if data.get("type") != "task" or "steps" not in data:
            raise TaskLoadError([SpecError(NOT_A_STEP_LIST, file=source)])
        task_id = str(data.get("id") or default_id)
        if data.get("id") is not None:
            try:  # it names the task's folder in the store, and its instances' artifacts
                check_id(data["id"], "task id")
            except UnsafeIdError as exc:
                raise TaskLoadError([SpecError(str(exc), file=source, field="id")]) from None
        version = data.get("version")
        raw_steps = data["steps"]
        seed = data.get("seed")
        if seed is not None and not (isinstance(seed, dict) and all(
                isinstance(v, (str, int, float, bool)) for v in seed.values())):
            raise TaskLoadError([SpecError(
                f"'seed' must map token names to strings or numbers, got {excerpt(seed)}", file=source, field="seed")])
    if not isinstance(raw_steps, list):
        raise TaskLoadError([SpecError(NOT_A_STEP_LIST, file=source)])

    errors: list[SpecError] = []
    steps: list[TaskStep] = []
    for position, raw in enumerate(raw_steps):
        try:
            steps.append(_parse_step(raw, position, registry))
        except SpecError as exc:
            errors.append(exc.located(source))
    # The DAG is checked over every step with an id, even when some failed field validation.
    edges = [
        (raw["id"], _depends_on_or_none(raw))
        for raw in raw_steps if isinstance(raw, dict) and isinstance(raw.get("id"), str)
    ]
    errors.extend(e.located(source) for e in check_dag(edges))
    if not errors:
        retry_targets = [
            (s.id, s.depends_on, s.retry_config.retry_from_step_id if s.retry_config else None)
            for s in steps
        ]
        errors.extend(e.located(source) for e in check_retry_targets(retry_targets))
    if errors:
        raise TaskLoadError(errors)
    return TaskDocument(task_id=task_id, version=version, steps=tuple(steps), source=source, format=format,
                        seed=seed or None)


def _depends_on_or_none(raw: dict[str, Any]) -> list[Any] | None:
    """depends_on for the DAG check; a malformed one is reported by the step itself."""
    try:
        return normalize_depends_on(raw.get("depends_on"))
    except SpecError:
        return None


def _parse_step(raw: Any, position: int, registry: "StepRegistry") -> "TaskStep":
    if not isinstance(raw, dict):
        raise SpecError(f"step at position {position} is not an object: {excerpt(raw)}")
    step_id = raw.get("id")
    if not isinstance(step_id, str) or not step_id:
        raise SpecError(f"step at position {position} needs a non-empty string 'id'", field="id")
    step_type = raw.get("type")
    if step_type is None:
        raise SpecError("required field is missing", step_id=step_id, field="type")
    cls = registry.get(step_type) if isinstance(step_type, str) else None
    if cls is None:
        shown = clip(step_type) if isinstance(step_type, str) else excerpt(step_type)
        raise SpecError(f"Unknown task step type: {shown}", step_id=step_id, field="type")
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        first, *rest = validation_problems(exc, cls)
        message = "; ".join([first[1], *(f"field '{f}': {m}" if f else m for f, m in rest)])
        raise SpecError(message, step_id=step_id, field=first[0]) from None


def validation_problems(exc: ValidationError, cls: type) -> list[tuple[str | None, str]]:
    """Each error of ``exc`` (validating ``cls``) as (field path, message), in the user's words."""
    return [_describe(err, cls) for err in exc.errors()]


def _describe(err: dict[str, Any], cls: type) -> tuple[str | None, str]:
    """(field path, message) for one pydantic error, in the user's words."""
    loc = [str(part) for part in err.get("loc", ())]
    field = ".".join(loc) or None
    kind = err.get("type")
    if kind == "extra_forbidden":
        model = _model_at(cls, loc[:-1])
        known = [name for name in model.model_fields if name != "type"] if model else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return field, f"unknown field{hint}"
    if kind == "missing":
        return field, "required field is missing"
    if kind in ("value_error", "assertion_error"):
        error = err.get("ctx", {}).get("error")
        if isinstance(error, SpecError):
            return error.field or field, error.message
        return field, str(error) if error is not None else err["msg"]
    return field, f"{err['msg']} (got {excerpt(err.get('input'))})"


def _model_at(cls: type, path: list[str]) -> type[BaseModel] | None:
    """The pydantic model whose fields an error path ends in (``retry_config.x`` is a
    field of RetryConfig, ``artifacts.0.x`` of ArtifactRef), or None when it is not one."""
    model: Any = cls
    for part in path:
        if part.isdigit():
            continue  # a list index: the element type was taken with the field
        field = model.model_fields.get(part)
        model = _first_model(field.annotation) if field is not None else None
        if model is None:
            return None
    return model


def _first_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _first_model(arg)
        if found is not None:
            return found
    return None
