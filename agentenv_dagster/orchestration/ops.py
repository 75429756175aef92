"""One op definition per step type, reused by every task through node aliases.

The op merges its ancestors' contexts, runs the step (for every row the run carries, see
``rows.py``), reports what the step wrote as asset events (verification scores, collected
files, loaded artifacts; a row's under its partition) and hands the contexts on.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from functools import lru_cache
from typing import Any, Iterator

import dagster as dg
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationPlanned,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, DagsterEventType

from ..context import TaskStepContext
from ..naming import node_name
from ..steps.base import ARTIFACT, PRODUCER, VERIFICATION, TaskStep
from ..steps.execution import StepFailed, default_seed
from ..steps.scoring import verification_passed
from .io_manager import FAILED_SUFFIX, FINAL_STEP
from .resources import ARTIFACTS_KEY, JUDGE_KEY, RESOURCE_KEY, AgentEnvResource
from .retries import carry_retries, self_retry_pending
from .rows import (
    REPLICATE_TAG, ROWS, UNPARTITIONED, batch, merge_upstream, node_assets, row_seed, rows_of, run_keys, step_fields,
)
from .translator import TAG_CONTENT_HASH, TAG_SEED, TAG_STEP_TYPE, TAG_TASK_ID
from .usage import usage_metadata

IO_MANAGER_KEY = "task_context_io_manager"
TEARDOWN_OP = FINAL_STEP


AFTER = "after"  # dependencies that order a node without handing it their context


def _ins() -> dict[str, dg.In]:
    return {"upstream": dg.In(list[Any], default_value=[], description="ancestor contexts"),
            AFTER: dg.In(dg.Nothing, description="dependencies whose contexts another upstream already holds")}


@lru_cache(maxsize=None)
def step_op(step_type: str) -> dg.OpDefinition:
    """The op of one step type; ``config.step`` holds the step's fields (launchpad-editable),
    ``config.rows`` the dataset values of the rows a root op starts."""

    @dg.op(
        name=_op_name(step_type),
        ins=_ins(),
        out=dg.Out(io_manager_key=IO_MANAGER_KEY),
        config_schema={
            "step": dg.Field(dg.Permissive(), description="the step's fields"),
            ROWS: dg.Field(dg.Permissive(), is_required=False,
                           description="root ops: row id -> the row's values (a dataset's partitions)"),
        },
        required_resource_keys={RESOURCE_KEY, ARTIFACTS_KEY, JUDGE_KEY, IO_MANAGER_KEY},  # + failed rows' contexts
        tags={TAG_STEP_TYPE: step_type},
        description=f"Runs an agent-env `{step_type}` step.",
    )
    def _step(context, upstream):
        yield from run_step_op(context, step_type, upstream)

    return _step


def run_step_op(context: dg.OpExecutionContext, step_type: str, upstream: list[dict]) -> Iterator[Any]:
    """Run the step for each of the op's rows, ``rows_in_flight`` at once. A row whose step
    fails fatally stops there (its context is kept for the final one); the op fails when no
    row is left, ending what the run deployed."""
    resource: AgentEnvResource = getattr(context.resources, RESOURCE_KEY)
    run_id = context.run_id
    task_id = context.run.tags.get(TAG_TASK_ID) or context.job_name
    refuse_changed_task(context)
    step = resource.parse_step(step_type, step_fields(context))
    if upstream:
        contexts = merge_upstream(upstream, every=True)
    else:
        seeds = context.op_config.get(ROWS) or {}
        contexts = {
            # a re-execution (a retry) is the same task instance as its root run
            key: resource.initial_context(context.run.root_run_id or run_id, task_id, key, row_seed(context, seeds, key))
            for key in run_keys(context, seeds)
        }
        defaults = _seed_defaults(context)
        for ctx in contexts.values():
            default_seed(ctx, defaults)
    if not contexts:  # a launch of only the rows that did not pass, and every row passed
        yield dg.Output(batch({}), metadata={"rows": 0})
        return
    io_manager = getattr(context.resources, IO_MANAGER_KEY)
    carry_retries(context, step, contexts, io_manager)
    if len(contexts) == 1 and self_retry_pending(context, step):  # the budget comes before fail_task_on_error
        step = step.model_copy(update={"fail_task_on_error": True})
    try:
        outcomes = resource.execute_rows(
            step, contexts, run_id, task_id, context.log,
            judge=getattr(context.resources, JUDGE_KEY), artifacts=getattr(context.resources, ARTIFACTS_KEY),
        )
    except BaseException:
        # Interrupted (run terminated from the UI) or an unexpected error: nothing may leak.
        resource.teardown(run_id)
        raise
    failed = {key: o for key, o in outcomes.items() if isinstance(o, StepFailed)}
    if failed or context.retry_number:  # (a retry that succeeded clears what its attempt left)
        # Keep the failed rows' contexts (their failed_steps record, a partial PromptResponse).
        io_manager.write(
            run_id, f"{context.op_handle}{FAILED_SUFFIX}", batch({key: contexts[key].to_dict() for key in failed}))
    if failed and not self_retry_pending(context, step):
        report_unreached(context, list(failed))
    if failed and len(failed) == len(outcomes):
        torn_down = [] if self_retry_pending(context, step) else resource.teardown(run_id)
        first = next(iter(failed.values()))
        raise dg.Failure(
            description=str(first) if len(failed) == 1 else f"{len(failed)} rows failed; the first: {first}",
            metadata={"error_type": first.record["error_type"], "torn_down": torn_down,
                      **({"failed_rows": sorted(failed)} if len(failed) > 1 else {})},
        )
    assets = node_assets(context.op.tags)
    replicate = int(context.run.tags[REPLICATE_TAG]) if REPLICATE_TAG in context.run.tags else None
    prices = resource.load_config().model.prices if assets["produced"] else {}
    kept = {key: contexts[key] for key in outcomes if key not in failed}
    # a materialization a row, then a check evaluation a row and check, in one burst (the
    # checks' query for the materializations they judge writes those first)
    with _batched_event_writes(context.instance):
        for key, outcome in outcomes.items():
            if key in failed:
                context.log.error(f"row '{key}': {outcome}")
                continue
            if outcome.failure:
                context.log.warning(f"step '{step.id}' failed (tolerated, fail_task_on_error=false){_row(key)}: "
                                    f"{outcome.failure['error']}")
            yield from asset_events(assets, outcome.step, contexts[key], key or None, prices=prices,
                                    replicate=replicate)
        yield from check_evaluations(context.instance, assets, kept)
    done = {key: ctx.to_dict() for key, ctx in kept.items()}
    durations = [o.duration_seconds for key, o in outcomes.items() if key not in failed]
    metadata: dict[str, Any] = {"duration_seconds": round(max(durations, default=0.0), 3)}
    if len(outcomes) > 1:
        metadata.update({"rows": len(outcomes), "failed_rows": sorted(failed)})
    yield dg.Output(batch(done), metadata=metadata)


def _batched_event_writes(instance: dg.DagsterInstance):
    """The project's local event log writes a burst of materializations together
    (``sqlite_storage.LocalSqliteEventLogStorage.batched_writes``); other storages one by one."""
    batched = getattr(instance.event_log_storage, "batched_writes", None)
    return batched() if batched is not None else nullcontext()


def report_unreached(context: dg.OpExecutionContext, keys: list[str]) -> None:
    """Each task asset the stopped rows will not get (from this step on) as a planned
    materialization, and each of its checks as a planned evaluation: in a failed run, that is
    what Dagster shows as a failed partition of the asset and an execution-failed partition of
    the check (open source storage keeps no failure events), so a backfill can pick out just
    those rows."""
    partitions = context.job_def.partitions_def
    rows = [key or None for key in keys if key != UNPARTITIONED or partitions is None]
    step_key = str(context.op_handle)
    events = []
    subset = partitions.subset_with_partition_keys(rows) if partitions is not None and rows else None
    for asset_key, checks in unreached_assets(context.job_def, context.op_handle.name):
        events += [DagsterEvent.build_asset_materialization_planned_event(
            context.job_name, step_key, AssetMaterializationPlannedData(asset_key, partition=row)) for row in rows]
        events += [DagsterEvent(  # as Dagster's run planning builds it
            event_type_value=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value, job_name=context.job_name,
            message=f"{context.job_name} intends to execute asset check {check} on asset {asset_key.to_string()}",
            event_specific_data=AssetCheckEvaluationPlanned(
                asset_key=asset_key, check_name=check, partitions_subset=subset),
            step_key=step_key) for check in checks if rows]
    for event in events:
        context.instance.report_dagster_event(event, run_id=context.run_id, log_level=logging.DEBUG)


def unreached_assets(job: dg.JobDefinition, node: str) -> list[tuple[dg.AssetKey, list[str]]]:
    """The task-scoped assets (verifications, collections) of ``node`` and every node after it,
    each with its checks."""
    structure = job.graph.dependency_structure
    seen, todo = set(), [node]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [i.node_name for inputs in structure.output_to_downstream_inputs_for_node(name).values()
                     for i in inputs]
    unreached = []
    for name in sorted(seen):
        assets = node_assets(job.graph.node_named(name).tags)
        unreached += [(dg.AssetKey(path), assets["checks"] if kind == VERIFICATION else [])
                      for kind, _, path in assets["produced"] if kind != ARTIFACT]
    return unreached


def _seed_defaults(context: dg.OpExecutionContext) -> dict[str, Any] | None:
    """The task's default token values, from the run's tag (the launchpad can edit it)."""
    raw = context.run.tags.get(TAG_SEED)
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        value = raw
    if value is not None and not isinstance(value, dict):
        raise dg.Failure(description=f"run tag '{TAG_SEED}' must be a JSON object of token values, got {raw!r}")
    return value


def _row(key: str) -> str:
    return f" (row '{key}')" if key else ""


def refuse_changed_task(context) -> None:
    """A re-execution must run the task its parent ran: refuse when the content changed."""
    parent_id = context.run.parent_run_id
    if not parent_id:
        return
    parent = context.instance.get_run_by_id(parent_id)
    before = parent.tags.get(TAG_CONTENT_HASH) if parent else None
    now = context.job_def.tags.get(TAG_CONTENT_HASH)
    if before and now and before != now:
        raise dg.Failure(
            description=f"re-execution refused: the task changed since run {parent_id} "
            f"(content hash {before} -> {now}); launch a new run instead"
        )


@lru_cache(maxsize=None)
def teardown_op() -> dg.OpDefinition:
    @dg.op(
        name=TEARDOWN_OP, ins=_ins(), out=dg.Out(io_manager_key=IO_MANAGER_KEY),
        required_resource_keys={RESOURCE_KEY, IO_MANAGER_KEY},
        description="Ends every env and agent the run deployed; its output is the final context. "
        "Fails the run when a row stopped at a failing step.",
    )
    def _teardown(context, upstream):
        resource: AgentEnvResource = getattr(context.resources, RESOURCE_KEY)
        torn_down = resource.teardown(context.run_id)
        final = batch({k: c.to_dict() for k, c in merge_upstream(upstream, every=False).items()})
        io_manager = getattr(context.resources, IO_MANAGER_KEY)
        stopped = io_manager.failed_rows(context.run_id)
        if stopped:  # the others finished; the run fails so Dagster marks the stopped rows failed
            io_manager.write(context.run_id, FINAL_STEP, final)
            raise dg.Failure(
                description=f"{len(stopped)} of {len(stopped) + len(rows_of(final))} rows stopped at a failing "
                f"step (their verifications are failed partitions): {', '.join(stopped[:20])}"
                + (" ..." if len(stopped) > 20 else ""),
                metadata={"torn_down": torn_down, "failed_rows": dg.MetadataValue.json(stopped[:1000])},
            )
        return dg.Output(final, metadata={"torn_down": torn_down})

    return _teardown


def asset_events(
    assets: dict[str, Any], step: TaskStep, ctx: TaskStepContext, partition: str | None = None,
    *, prices: dict[str, dict[str, float]] | None = None, replicate: int | None = None,
) -> Iterator[Any]:
    """Materializations for what the step wrote, observations of what it read (the version
    loaded), under the keys the translator gave the step's node; a verification says which
    replicate of its row it is. Its checks follow: ``check_evaluations``."""
    for artifact_id, path in assets["loaded"].items():
        loaded = _loaded_version(ctx, step.id, artifact_id)
        metadata = {"loaded_by_step": step.id, **({"version": loaded} if loaded else {})}
        yield dg.AssetObservation(asset_key=dg.AssetKey(path), metadata=metadata)
    for kind, name, path in assets["produced"]:
        key = dg.AssetKey(path)
        if kind == VERIFICATION:
            entry = (ctx.metadata.get("verifications") or {}).get(name)
            if entry is not None:
                metadata = {**verification_metadata(entry),
                            **usage_metadata(ctx, entry, prices or {}, getattr(step, "prompt_id", None)),
                            **({"replicate": replicate} if replicate is not None else {})}
                yield dg.AssetMaterialization(asset_key=key, metadata=metadata, partition=partition)
        elif kind == PRODUCER:
            entry = _produced(ctx, name)
            if entry is not None:
                yield dg.AssetMaterialization(asset_key=key, metadata=collection_metadata(entry), partition=partition)
        elif kind == ARTIFACT:  # a new version of a stored artifact the step names (shared by tasks: no partition)
            universe = (_produced(ctx, step.id) or {}).get("file_artifact_universe") or {}
            if universe.get("id") == name:
                yield dg.AssetMaterialization(asset_key=key, metadata={
                    "version": universe["version"], "written_by_step": step.id,
                    **({"row": partition} if partition else {}),
                })


def _produced(ctx: TaskStepContext, step_id: str) -> dict[str, Any] | None:
    """What a producer step recorded: collected files, or an env snapshot's universe."""
    collected = (ctx.metadata.get("collected_artifacts") or {}).get(step_id)
    if collected is not None:
        return collected
    snapshots = ctx.metadata.get("env_snapshotted_universes") or {}
    if step_id in snapshots:
        return {"artifacts": {}, "file_artifact_universe": snapshots[step_id]}
    return None


def verification_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    rows = entry.get("results") or []
    metadata: dict[str, Any] = {
        "passed": verification_passed(entry),
        "graded": entry.get("graded", True),
        "format": entry.get("format") or "rows",
        "criteria": dg.MetadataValue.table(
            records=[
                dg.TableRecord({
                    "id": str(row.get("id") or row.get("description") or row.get("criterion_type") or i),
                    "result": str(row.get("result", row.get("evaluation_status"))),
                    "score": float(row.get("score") or 0.0),
                    "weight": float(row.get("weight", 1) or 0),
                    "justification": str(
                        row.get("justification") or row.get("message") or row.get("details") or row.get("error") or ""
                    )[:500],
                })
                for i, row in enumerate(rows)
            ],
            schema=dg.TableSchema(columns=[
                dg.TableColumn("id", "string"), dg.TableColumn("result", "string"),
                dg.TableColumn("score", "float"), dg.TableColumn("weight", "float"),
                dg.TableColumn("justification", "string"),
            ]),
        ),
    }
    if entry.get("score") is not None:
        metadata["score"] = dg.MetadataValue.float(float(entry["score"]))
    if entry.get("reason"):
        metadata["reason"] = entry["reason"]
    if entry.get("format") == "coder_eval":  # whole rows: what a suite rollup aggregates
        metadata["results"] = dg.MetadataValue.json(rows)
        if entry.get("prompt_error"):
            metadata["prompt_error"] = entry["prompt_error"]
    judge = entry.get("judge") or {}
    if judge.get("model"):
        metadata["judge_model"] = judge["model"]
    return metadata


def collection_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    artifacts = entry.get("artifacts") or {}
    metadata: dict[str, Any] = {
        "file_count": len(artifacts),
        "files": dg.MetadataValue.json(artifacts),
    }
    universe = entry.get("file_artifact_universe")
    if universe:
        metadata["universe_id"] = universe["id"]
        metadata["universe_version"] = universe["version"]
    return metadata


ROWS_A_QUERY = 1000


def check_evaluations(
    instance: dg.DagsterInstance, assets: dict[str, Any], contexts: dict[str, TaskStepContext],
) -> Iterator[dg.AssetCheckEvaluation]:
    """Each declared check of each row's verification, as that row's partition of the check
    (so the UI shows which rows passed and which fell short), pointing at the materialization
    it judged: Dagster counts a partition's check as current only while that is its latest."""
    for kind, name, path in assets["produced"]:
        if kind != VERIFICATION:
            continue
        entries = {k: e for k, c in contexts.items() if (e := (c.metadata.get("verifications") or {}).get(name))}
        if not entries:
            continue
        key = dg.AssetKey(path)
        targets = _latest_materializations(instance, key, [row for row in entries if row])
        for row, entry in entries.items():
            yield from _check_evaluations(key, entry, assets["checks"], row or None, targets.get(row or None))


def _latest_materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, rows: list[str],
) -> dict[str | None, AssetCheckEvaluationTargetMaterializationData]:
    """The latest materialization of each of ``rows`` (of the asset, when none), a query per
    ``ROWS_A_QUERY``: the op has just written one a row, so they are the newest of those
    partitions (and SQLite takes a bounded number of parameters). The project's local storage
    answers from the event log's columns; others read the events."""
    lean = getattr(instance.event_log_storage, "latest_materializations", None)
    latest: dict[str | None, AssetCheckEvaluationTargetMaterializationData] = {}
    for start in range(0, max(len(rows), 1), ROWS_A_QUERY):
        chunk = rows[start:start + ROWS_A_QUERY]
        if lean is not None and chunk:
            found = lean(key, chunk)
        else:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=chunk or None), limit=max(len(chunk), 1)).records
            found = {r.partition_key: (r.storage_id, r.run_id, r.timestamp) for r in reversed(records)}  # newest wins
        latest.update({row: AssetCheckEvaluationTargetMaterializationData(storage_id=storage_id, run_id=run_id,
                                                                          timestamp=timestamp)
                       for row, (storage_id, run_id, timestamp) in found.items()})
    return latest


def _check_evaluations(
    key: dg.AssetKey, entry: dict[str, Any], checks: list[str], partition: str | None,
    target: AssetCheckEvaluationTargetMaterializationData | None,
) -> Iterator[dg.AssetCheckEvaluation]:
    """One evaluation per declared check; unknown (not graded) fails with severity WARN."""
    outcomes = entry.get("checks") or {"passed": verification_passed(entry)}
    metadata = {"score": entry["score"]} if entry.get("score") is not None else {"reason": entry.get("reason", "not graded")}
    for name in checks:
        passed = outcomes.get(name)
        yield dg.AssetCheckEvaluation(
            asset_key=key, check_name=name, passed=bool(passed), metadata=metadata, partition=partition,
            target_materialization_data=target,
            severity=dg.AssetCheckSeverity.WARN if passed is None else dg.AssetCheckSeverity.ERROR,
        )


def _loaded_version(ctx: TaskStepContext, step_id: str, artifact_id: str) -> int | None:
    for key in ("loaded_environment_artifacts", "loaded_file_artifact_universes"):
        for entry in ctx.metadata.get(key) or []:
            if entry.get("id") == artifact_id and entry.get("step_id", step_id) == step_id:
                return entry.get("version")
    return None


def _op_name(step_type: str) -> str:
    return node_name(step_type)
