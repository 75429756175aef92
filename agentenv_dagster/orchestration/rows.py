"""Which rows a run carries, by partition key, and what the instance knows of them.

A run targets the task itself (one row, key ``""``), one partition (a dataset row), or several
run together (as a single-run backfill does): a thousand-row dataset costs a handful of ops, not
a thousand runs.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Collection, Iterator

import dagster as dg

from ..steps.base import VERIFICATION, TaskStep

if TYPE_CHECKING:
    from ..plan import TaskPlan
    from ..spec.loader import TaskDocument

UNPARTITIONED = ""
ROWS = "rows"
STEPS = "steps"
# the tags of a run over a range of partitions (what a single-run backfill sets)
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
# "failed": of the rows a run names (all of them, unpartitioned), only those that did not pass
ROWS_TAG, FAILED_ROWS = "agentenv/rows", "failed"
STEP_ASSETS_TAG = "agentenv/assets"  # a node's asset keys (the translator sets it)
REGRESSION_TAG = "agentenv/regression"  # a verifier node's: its task's regression gate settings (JSON)
TASK_ID_TAG = "agentenv/task_id"  # a task job's (and so its runs'): the task id
VARIANT_TAG = "agentenv/variant"  # an experiment's variant the run's steps are (one a run)
REPLICATE_TAG = "agentenv/replicate"  # which of a task's replicates (trials, repeats) the run is
CONTENT_HASH_TAG = "agentenv/content_hash"  # a task job's and each node's: the plan its definitions were built from

# The plan of each task graph this process built (``task_job.build_task``), by graph name and content hash: what an
# op of any job running its assets reads a dataset's rows and variants from; every process loading the location has it.
_PLANS: dict[tuple[str, str], "TaskPlan"] = {}


def register_plan(graph_name: str, plan: "TaskPlan") -> None:
    _PLANS[(graph_name, plan.document.content_hash)] = plan


def plan_of(context: dg.OpExecutionContext) -> "TaskPlan | None":
    """The plan the op's task graph was built from."""
    return _PLANS.get((op_graph(context).name, context.op.tags.get(CONTENT_HASH_TAG, "")))


def op_graph(context: dg.OpExecutionContext) -> dg.GraphDefinition:
    """The task graph the op is a node of, in the task's own job or the implicit asset job (one node of it)."""
    parent = context.op_handle.parent
    return context.job_def.graph.get_node(parent).definition if parent is not None else context.job_def.graph


def task_id_of(context: dg.OpExecutionContext) -> str:
    """The task the op's run is of: the run's tag (a task job's runs carry it), else its plan's."""
    plan = plan_of(context)
    return context.run.tags.get(TASK_ID_TAG) or (plan.task_id if plan is not None else context.job_name)


def run_keys(context: dg.OpExecutionContext, selected: list[str] | None) -> list[str]:
    """The rows a root op starts: those its config selects, else the run's partitions; a run of a dataset job that
    names none takes the dataset's selection (every row, or a draw of ``sample_per_stratum``)."""
    if selected:
        keys = list(selected)
    elif context.has_partition_key_range:
        keys = list(context.partition_keys)
    else:
        keys = [context.partition_key] if context.has_partition_key else [UNPARTITIONED]
    plan = plan_of(context)
    if plan is None or not plan.document.partitions:
        return keys
    document = plan.document
    failed_only = context.run.tags.get(ROWS_TAG) == FAILED_ROWS
    variant = run_variant(context, document)
    if keys == [UNPARTITIONED]:
        if document.variant_steps is not None and variant not in document.variant_steps:
            raise dg.Failure(description=f"an experiment job runs one variant a run: launch a partition, or set "
                             f"the run tag {VARIANT_TAG} to one of {list(document.variant_steps)}")
        # of every row (of the variant), those that did not pass; else what the dataset selects
        keys = ([k for k in document.partitions if document.variant_of(k) == variant] if failed_only
                else document.selected_rows(variant))
        context.log.info(f"no rows named: {len(keys)} rows of the dataset")
    if unknown := [k for k in keys if k not in document.partitions]:
        raise dg.Failure(description=f"task '{plan.task_id}' has no rows {unknown[:5]}")
    if variant is not None and (other := [k for k in keys if document.variant_of(k) != variant]):
        raise dg.Failure(description=f"this run's steps are variant '{variant}'; it cannot run partitions {other[:5]}")
    if failed_only:
        named, keys = keys, rows_not_passed(context.instance, op_graph(context), keys)
        context.log.info(f"{ROWS_TAG}={FAILED_ROWS}: {len(keys)} of {len(named)} rows did not pass: {keys[:20]}")
    return keys


def run_variant(context: dg.OpExecutionContext, document: "TaskDocument") -> str | None:
    """The experiment variant a run's steps are: its partition's, else its tag's."""
    if context.has_partition_key:
        return document.variant_of(context.partition_key)  # (None for a task without variants)
    return context.run.tags.get(VARIANT_TAG) if document.variant_steps is not None else None


def range_tags(plan, keys: list[str]) -> dict[str, str]:
    """The partition range a run over ``keys`` shows in Dagster (first and last in dataset order)."""
    if plan.document.variant_steps is not None:  # a range of variant x row keys is not one variant's rows
        return {}
    order = {key: i for i, key in enumerate(plan.document.partitions or {})}
    return {RANGE_START_TAG: min(keys, key=order.__getitem__), RANGE_END_TAG: max(keys, key=order.__getitem__)}


def task_graph_of(job: dg.JobDefinition) -> dg.GraphDefinition:
    """The op graph of a task job: the graph backing its assets (its one node), or the job's own."""
    nodes = job.graph.nodes
    if len(nodes) == 1 and isinstance(nodes[0].definition, dg.GraphDefinition):
        return nodes[0].definition
    return job.graph


def node_step_key(job: dg.JobDefinition, node: str) -> str:
    """The step key of a node of a task job's graph."""
    graph = task_graph_of(job)
    return node if graph is job.graph else f"{graph.name}.{node}"


def node_assets(tags: dict[str, str]) -> dict[str, Any]:
    """A node's asset keys from its tag: ``produced`` [kind, name, path], ``loaded``, the ``checks`` its
    verifications' step declares, and its task's ``regression`` gate (the settings' JSON, or None)."""
    raw = tags.get(STEP_ASSETS_TAG)
    return {"produced": [], "loaded": {}, "checks": [], **(json.loads(raw) if raw else {}),
            "regression": tags.get(REGRESSION_TAG)}


def rows_not_passed(instance: dg.DagsterInstance, graph: dg.GraphDefinition, keys: list[str]) -> list[str]:
    """Of ``keys``, the rows to run again (``graph`` is the task's): a verification of theirs was never
    materialized (the row stopped before it, or never ran), or its latest materialization did not pass."""
    latest = [latest_metadata(instance, dg.AssetKey(path), keys, ("passed",)) for node in graph.nodes
              for kind, _, path in node_assets(node.tags)["produced"] if kind == VERIFICATION]
    return [k for k in keys if any(k not in found or _value(found[k].get("passed")) is not True for found in latest)]


def latest_metadata(
    instance: dg.DagsterInstance, key: dg.AssetKey, rows: list[str], labels: Collection[str],
) -> dict[str, dict[str, Any]]:
    """Each row's latest materialization metadata of ``key``, the entries named in ``labels``
    (rows never materialized left out): two queries for the whole dataset, not one a row."""
    latest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, dg.DagsterEventType.ASSET_MATERIALIZATION)
    ids = sorted(latest[row] for row in set(rows) if row in latest)
    pages = (instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key, storage_ids=chunk), limit=len(chunk))
             for chunk in _chunks(ids))
    return {record.partition_key: _entries(record, labels) for page in pages for record in page.records}


def latest_replicates(
    instance: dg.DagsterInstance, key: dg.AssetKey, rows: list[str], replicates: int, labels: Collection[str],
) -> dict[tuple[str, int], dict[str, Any]]:
    """Each (row, replicate)'s latest materialization metadata of ``key`` (the entries named in ``labels``): the
    newest records of all the rows, then on its own each row whose replicates are not all among them."""
    if replicates == 1:
        return {(row, 0): metadata for row, metadata in latest_metadata(instance, key, rows, labels).items()}
    ran = set(instance.event_log_storage.get_latest_storage_id_by_partition(
        key, dg.DagsterEventType.ASSET_MATERIALIZATION))
    found: dict[tuple[str, int], dict[str, Any]] = {}

    def keep(partitions: list[str], limit: int) -> None:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=partitions), limit=limit, ascending=False).records
        for record in records:
            replicate = int(_value(record.asset_materialization.metadata.get("replicate")) or 0)
            found.setdefault((record.partition_key, replicate), _entries(record, labels))

    for chunk in _chunks(rows):
        keep(chunk, len(chunk) * replicates)
    for row in rows:
        if row in ran and any((row, r) not in found for r in range(replicates)):
            keep([row], 10 * replicates)
    return found


def _chunks(items: list[Any], size: int = 500) -> Iterator[list[Any]]:
    """``items`` in slices small enough for one query (SQLite caps a query's bound parameters)."""
    return (items[start:start + size] for start in range(0, len(items), size))


def _entries(record: dg.EventLogRecord, labels: Collection[str]) -> dict[str, Any]:
    return {label: value for label, value in record.asset_materialization.metadata.items() if label in labels}


def _value(metadata_value: Any) -> Any:
    return getattr(metadata_value, "value", metadata_value)


def step_config(step: TaskStep) -> dict[str, Any]:
    """The fields a step sets, defaults left out (the op fills them again): what job snapshots and runs carry."""
    return {"id": step.id, "type": step.type,
            **step.model_dump(mode="json", exclude_none=True, exclude_defaults=True, by_alias=True)}


def step_fields(context: dg.OpExecutionContext) -> dict[str, Any]:
    """The op's step fields: its config (the launchpad can edit it); where that is the job's defaults,
    an experiment run of another variant gets that variant's fields."""
    fields = context.op_config["step"]
    plan = plan_of(context)
    variant = run_variant(context, plan.document) if plan is not None else None
    if variant is None or not fields:
        return fields
    chosen = {s.id: s for s in plan.document.variant_steps[variant]}
    step_id = fields.get("id")
    if step_id in chosen and step_id in plan.step_by_id and fields == step_config(plan.step_by_id[step_id]):
        return step_config(chosen[step_id])
    return fields
