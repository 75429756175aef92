"""What travels between ops: the contexts of the rows a run carries, by partition key.

A run targets the task itself (one row, key ``""``), one partition (a dataset row), or a
range of partitions (a shard of rows run together, as a single-run backfill would). Every
op runs its step for all its rows at once, ``rows_in_flight`` at a time, so a thousand-row
dataset costs a handful of ops rather than a thousand runs.
"""

from __future__ import annotations

from typing import Any, Iterable

import dagster as dg

from ..context import TaskStepContext

UNPARTITIONED = ""
ROWS = "rows"
# the tags of a run over a range of partitions (what a single-run backfill sets)
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def batch(contexts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {ROWS: contexts}


def rows_of(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return payload.get(ROWS, {})


def merge_upstream(upstream: Iterable[dict[str, Any]], *, every: bool) -> dict[str, TaskStepContext]:
    """Per row, the merged contexts of the ancestors. ``every``: only rows every ancestor
    passed on (a row that failed on one branch stops there), else any row seen."""
    payloads = [rows_of(u) for u in upstream]
    keys: list[str] = []
    for rows in payloads:
        keys += [k for k in rows if k not in keys]
    if every:
        keys = [k for k in keys if all(k in rows for rows in payloads)]
    return {key: TaskStepContext.merge_dicts(rows[key] for rows in payloads if key in rows) for key in keys}


def run_keys(context: dg.OpExecutionContext, seeds: dict[str, Any]) -> list[str]:
    """The rows a root op starts: those its config seeds, else the run's partitions."""
    if seeds:
        return list(seeds)
    if context.has_partition_key_range:
        return list(context.partition_keys)
    return [context.partition_key] if context.has_partition_key else [UNPARTITIONED]


def row_seed(context: dg.OpExecutionContext, seeds: dict[str, Any], key: str) -> dict[str, Any] | None:
    """A row's dataset values: from the op config, else from the job's partitioned config."""
    if key in seeds or key == UNPARTITIONED:
        return seeds.get(key)
    partitioned = context.job_def.partitioned_config
    if partitioned is None:
        return None
    config = partitioned.get_run_config_for_partition_key(key)
    return config["ops"][context.op_handle.name]["config"].get(ROWS, {}).get(key)
