"""``dataset:``: one task fanned out into one row-task per row.

Rows come inline (``rows``) or from JSONL files (``paths``, relative to the task YAML,
concatenated in order). Row ids become directory names, so they are checked over the whole
dataset, before any ``--split`` / sampling narrows it.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from pydantic import Field, model_validator

from ...errors import SpecError, excerpt
from ..documents import MAX_NESTING, check_values, read_text
from .base import Strict

SAMPLE_SEED = 0  # the --sample draw's seed unless --seed names one (upstream fixes it at 0)
ROW_ID_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class Dataset(Strict):
    # JSONL files of rows, relative to the task YAML (exclusive with `rows`)
    paths: list[str] | None = None
    # the rows inline (exclusive with `paths`)
    rows: list[dict[str, Any]] | None = None
    # the row field that is the row's id (and partition key)
    id_field: str = "id"
    # run at most this many rows of each stratum
    sample_per_stratum: int | None = Field(default=None, ge=1)
    # the row field whose values are the strata
    stratify_field: str = "expected_skill"
    # the seed of the stratified draw (unset: a new draw every run)
    sample_seed: int | None = None
    # Newer upstream: the row field ``--split`` selects on (unlabelled rows: absent, null, "").
    split_field: str = "split"
    # Ours: how many rows hold their sandbox, container and agent at once (a row releases them
    # as it leaves the run); unset, the run's --max-sandboxes or its rows in flight.
    max_sandboxes: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_source(self) -> "Dataset":
        if self.paths is None and self.rows is None:
            raise ValueError("Dataset must specify either 'paths' or 'rows'")
        if self.paths is not None and self.rows is not None:
            raise ValueError("Dataset must specify only one of 'paths' or 'rows'")
        if self.paths is not None and not self.paths:
            raise SpecError("Dataset.paths must be a non-empty list", field="paths")
        return self


def read_jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of one JSONL file (read within the input limits); blank lines are skipped,
    a bad line is named."""
    if not path.is_file():
        raise FileNotFoundError(f"Dataset file not found: {path}")
    try:
        text = read_text(path)
    except SpecError as exc:
        raise ValueError(f"Dataset {path}: {exc.message}") from None
    rows: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
            check_values(row)
        except json.JSONDecodeError as exc:
            raise ValueError(f"Dataset {path}: invalid JSON on line {number}: {exc}") from None
        except RecursionError:
            raise ValueError(f"Dataset {path}: line {number}: nested deeper than {MAX_NESTING} levels") from None
        except ValueError as exc:  # a value outside the input limits
            raise ValueError(f"Dataset {path}: line {number}: {exc}") from None
        if not isinstance(row, dict):
            raise ValueError(f"Dataset {path}: row on line {number} is not a JSON object: {excerpt(row)}")
        rows.append(row)
    return rows


def load_dataset_rows(dataset: Dataset, base_dir: Path) -> list[dict[str, Any]]:
    """Every row, inline or from the JSONL ``paths`` (relative ones resolved against ``base_dir``)."""
    if dataset.rows is not None:
        return [dict(row) for row in dataset.rows]
    return [row for path in dataset.paths or [] for row in read_jsonl_rows(base_dir / path)]


def check_row_ids(rows: list[dict[str, Any]], dataset: Dataset, task_id: str) -> None:
    """Each row has an id, unique, usable as a directory name."""
    seen: set[str] = set()
    for index, row in enumerate(rows):
        if dataset.id_field not in row:
            raise ValueError(f"Dataset row {index} for task '{task_id}' missing id_field '{dataset.id_field}': {excerpt(row)}")
        row_id = str(row[dataset.id_field])
        if not ROW_ID_PATTERN.match(row_id):
            raise ValueError(
                f"Dataset row id {excerpt(row_id)} must match {ROW_ID_PATTERN.pattern} (letters, digits, underscore, hyphen, dot)"
            )
        if row_id in seen:
            raise ValueError(f"Duplicate dataset row id for task '{task_id}': {excerpt(row_id)}")
        seen.add(row_id)


class SplitSelectorError(ValueError):
    """A labelled dataset with no row in the requested split: the run stops, it is not skipped."""


def select_rows(
    rows: list[dict[str, Any]], dataset: Dataset, *, split: str | None = None, sample: int | None = None,
    seed: int = SAMPLE_SEED,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows a run takes, and warnings: ``split`` first, then ``sample`` (uniform, drawn with
    ``seed``, upstream's fixed 0 by default) else ``sample_per_stratum`` (seeded by
    ``sample_seed`` only; strata this small stay whole)."""
    warnings: list[str] = []
    if split is not None:
        labelled = [row for row in rows if row.get(dataset.split_field) not in (None, "")]
        if labelled:
            chosen = [row for row in labelled if str(row[dataset.split_field]) == split]
            if not chosen:
                raise SplitSelectorError(f"no row has {dataset.split_field}={split!r}")
            if len(labelled) < len(rows):
                warnings.append(f"{len(rows) - len(labelled)} unlabelled row(s) dropped by --split {split}")
            rows = chosen
    if sample is not None:
        keep = {id(row) for row in random.Random(seed).sample(rows, min(sample, len(rows)))}
        return [row for row in rows if id(row) in keep], warnings
    if dataset.sample_per_stratum is not None:
        rows = stratified_sample(rows, lambda row: str(row.get(dataset.stratify_field, "")),
                                 dataset.sample_per_stratum, dataset.sample_seed)
    return rows, warnings


T = TypeVar("T")


def stratified_sample(items: list[T], stratum: Callable[[T], str], per_stratum: int, seed: int | None) -> list[T]:
    """``per_stratum`` items of each stratum (a smaller stratum whole), in their order; the
    draw is seeded by ``seed`` only (None: a new draw every time), as upstream's."""
    strata: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        strata.setdefault(stratum(item), []).append(index)
    draw = random.Random(seed)
    keep = {i for members in strata.values()
            for i in (members if len(members) <= per_stratum else draw.sample(members, per_stratum))}
    return [item for i, item in enumerate(items) if i in keep]


@dataclass(frozen=True)
class RowSampling:
    """A dataset's ``sample_per_stratum`` over its row ids: what a run of the task without
    chosen rows (a launch, a schedule tick, a sensor) takes, drawn again for each run."""

    per_stratum: int
    seed: int | None
    strata: dict[str, str]  # row id -> its stratum (the stratify_field's value)

    def draw(self) -> list[str]:
        return stratified_sample(list(self.strata), self.strata.__getitem__, self.per_stratum, self.seed)


def row_sampling(rows: list[dict[str, Any]], dataset: Dataset) -> RowSampling | None:
    if dataset.sample_per_stratum is None:
        return None
    return RowSampling(dataset.sample_per_stratum, dataset.sample_seed,
                       {str(row[dataset.id_field]): str(row.get(dataset.stratify_field, "")) for row in rows})
