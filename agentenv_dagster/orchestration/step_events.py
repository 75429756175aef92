"""What a step wrote, as Dagster events: materializations (a row's under its partition, its ``results``
with the ``outcome`` the CLI counts), observations of what it loaded, check evaluations, and planned
materializations of what a stopped row will never reach (Dagster shows those as failed partitions).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import dagster as dg

from ..context import TaskStepContext
from ..reports.evaluation import row_outcome
from ..reports.render import row_page_url
from ..steps.base import ARTIFACT, PRODUCER, VERIFICATION, TaskStep
from ..steps.scoring import verification_passed
from .dagster_internals import CODE_VERSION_TAG, evaluation_target, report_planned
from .provenance import (
    Provenance, artifact_tags, collection_version, loaded_version, produced_entry, results_version,
    verification_version,
)
from .regression import REGRESSION_CHECK, node_regression, score_evaluation
from .rows import REPLICATE_TAG, UNPARTITIONED, VARIANT_TAG, node_assets, op_graph, plan_of, task_id_of
from .usage import usage_metadata

# A run whose reports the CLI writes: the folder, and the task id its rows' pages are filed under
REPORTS_TAG, REPORTS_TASK_TAG = "agentenv/reports", "agentenv/reports_task_id"
ROWS_A_QUERY = 1000  # rows a query of their check targets names (SQLite takes a bounded number of parameters)


def report_unreached(context: dg.OpExecutionContext, keys: list[str]) -> None:
    """Each task asset (and check) the stopped rows will not get, as planned: a failed run's planned partitions
    are what Dagster shows as failed (OSS storage keeps no failure events), so a backfill can pick those rows."""
    graph = op_graph(context)
    structure = graph.dependency_structure
    seen, todo = set(), [context.op_handle.name]  # the op's node and every node after it
    while todo:
        if (name := todo.pop()) not in seen:
            seen.add(name)
            todo += [i.node_name for inputs in structure.output_to_downstream_inputs_for_node(name).values()
                     for i in inputs]
    unreached = []  # their task-scoped assets (verifications, collections), with their checks
    for name in sorted(seen):
        assets = node_assets(graph.node_named(name).tags)
        checks = [*assets["checks"], *([REGRESSION_CHECK] if assets["regression"] else [])]
        unreached += [(dg.AssetKey(path), checks if kind == VERIFICATION else [])
                      for kind, _, path in assets["produced"] if kind != ARTIFACT]
    partitions = context.assets_def.partitions_def if context.has_assets_def else context.job_def.partitions_def
    rows = [key or None for key in keys if key != UNPARTITIONED or partitions is None]
    report_planned(context, unreached, rows, partitions)


def asset_provenance(context: dg.OpExecutionContext, key: dg.AssetKey | None = None) -> Provenance:
    """How the node stamps the materializations of its task asset (``key``, else its tag's): ``provenance.py``."""
    task_assets = [path for kind, _, path in node_assets(context.op.tags)["produced"] if kind != ARTIFACT]
    return Provenance.of_node(context, key or (dg.AssetKey(task_assets[0]) if task_assets else None))


def asset_events(
    assets: dict[str, Any], step: TaskStep, ctx: TaskStepContext, partition: str | None, *,
    prices: dict[str, dict[str, float]], replicate: int | None, provenance: Provenance, row_page: str | None,
) -> Iterator[Any]:
    """Materializations of what the step wrote (stamped with their ``provenance``; a verification with its
    ``replicate`` and ``row_page``) and observations of the versions it read; its checks: ``check_evaluations``."""
    for artifact_id, path in assets["loaded"].items():
        loaded = loaded_version(ctx, artifact_id, step.id)
        metadata = {"loaded_by_step": step.id, **({"version": loaded} if loaded else {})}
        yield dg.AssetObservation(asset_key=dg.AssetKey(path), metadata=metadata)
    for kind, name, path in assets["produced"]:
        key = dg.AssetKey(path)
        if kind == VERIFICATION and (entry := (ctx.metadata.get("verifications") or {}).get(name)) is not None:
            metadata = {**verification_metadata(entry),
                        **usage_metadata(ctx, entry, prices, getattr(step, "prompt_id", None)),
                        **({"replicate": replicate} if replicate is not None else {}),
                        **({"row_page": dg.MetadataValue.url(row_page)} if row_page else {})}
            yield dg.AssetMaterialization(asset_key=key, metadata=metadata, partition=partition,
                                          tags=provenance.tags(ctx, verification_version(entry)))
        elif kind == PRODUCER and (entry := produced_entry(ctx, name)) is not None:
            yield dg.AssetMaterialization(asset_key=key, metadata=collection_metadata(entry), partition=partition,
                                          tags=provenance.tags(ctx, collection_version(entry)))
        elif kind == ARTIFACT:  # a new version of a stored artifact the step names (shared by tasks: no partition)
            if (universe := (produced_entry(ctx, step.id) or {}).get("file_artifact_universe") or {}).get("id") == name:
                yield dg.AssetMaterialization(asset_key=key, metadata={
                    "version": universe["version"], "written_by_step": step.id,
                    **({"row": partition} if partition else {}),
                }, tags=artifact_tags(universe["version"]))


def result_materialization(key: dg.AssetKey, row: str | None, ctx: TaskStepContext, failure: dict[str, Any] | None,
                           provenance: Provenance) -> dg.AssetMaterialization:
    """A row's outcome as its ``results`` materialization: where it stopped and why, each step's status."""
    timings = ctx.metadata.get("step_timings") or {}
    failed = {record["step_id"]: record for record in ctx.metadata.get("failed_steps") or []}
    steps = [{
        "step": step_id,
        "status": ("stopped" if failed[step_id].get("is_fatal") else "failed (tolerated)") if step_id in failed else "done",
        "seconds": float(timing.get("duration_seconds") or 0.0),
        "error": str(failed.get(step_id, {}).get("error", ""))[:300],
    } for step_id, timing in timings.items()]
    metadata: dict[str, Any] = {
        "status": "stopped" if failure else "done",
        "outcome": "errored" if failure else row_outcome(ctx),
        "steps": _table(steps, step="string", status="string", seconds="float", error="string"),
    }
    if failure:
        metadata.update(stopped_at=str(failure.get("step_id")), error=str(failure.get("error", ""))[:500])
    if scores := {name: entry.get("score") for name, entry in (ctx.metadata.get("verifications") or {}).items()}:
        metadata["scores"] = dg.MetadataValue.json(scores)
    return dg.AssetMaterialization(asset_key=key, partition=row, metadata=metadata,
                                   tags=provenance.tags(ctx, results_version(ctx, failure)))


def row_page_link(context: dg.OpExecutionContext) -> Callable[[str], str | None]:
    """Each row's page (``row.html``, written as the CLI's run ends) as a link, for a run whose reports the CLI
    writes (its tags say where); for any other run, no link."""
    if not (folder := context.run.tags.get(REPORTS_TAG)):
        return lambda key: None
    plan = plan_of(context)
    task_id = context.run.tags.get(REPORTS_TASK_TAG) or task_id_of(context)
    variant = context.run.tags.get(VARIANT_TAG) or "default"
    replicate = int(context.run.tags.get(REPLICATE_TAG) or 0)

    def link(key: str) -> str | None:
        row = plan.document.row_of(key) if plan is not None and key else key
        try:
            return row_page_url(folder, f"{task_id}/{row}" if row else task_id, variant, replicate)
        except ValueError:  # an id that cannot name a report folder: the reports refuse it too
            return None

    return link


def verification_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    rows = entry.get("results") or []
    metadata: dict[str, Any] = {
        "passed": verification_passed(entry),
        "graded": entry.get("graded", True),
        "format": entry.get("format") or "rows",
        "criteria": _table([{
            "id": str(row.get("id") or row.get("description") or row.get("criterion_type") or i),
            "result": str(row.get("result", row.get("evaluation_status"))),
            "score": float(row.get("score") or 0.0),
            "weight": float(row.get("weight", 1) or 0),
            "justification": str(row.get("justification") or row.get("message") or row.get("details")
                                 or row.get("error") or "")[:500],
        } for i, row in enumerate(rows)], id="string", result="string", score="float", weight="float",
            justification="string"),
    }
    if entry.get("score") is not None:
        metadata["score"] = dg.MetadataValue.float(float(entry["score"]))
    if entry.get("reason"):
        metadata["reason"] = entry["reason"]
    if entry.get("format") == "coder_eval":  # whole rows: what a suite rollup aggregates
        metadata["results"] = dg.MetadataValue.json(rows)
        if entry.get("prompt_error"):
            metadata["prompt_error"] = entry["prompt_error"]
    if judge_model := (entry.get("judge") or {}).get("model"):
        metadata["judge_model"] = judge_model
    return metadata


def collection_metadata(entry: dict[str, Any]) -> dict[str, Any]:
    artifacts, universe = entry.get("artifacts") or {}, entry.get("file_artifact_universe")
    return {"file_count": len(artifacts), "files": dg.MetadataValue.json(artifacts),
            **({"universe_id": universe["id"], "universe_version": universe["version"]} if universe else {})}


def _table(records: list[dict[str, Any]], **column_types: str) -> dg.TableMetadataValue:
    """``records`` as a metadata table with ``column_types`` (name: type) as its schema, even when empty."""
    return dg.MetadataValue.table([dg.TableRecord(r) for r in records], schema=dg.TableSchema(
        columns=[dg.TableColumn(name, kind) for name, kind in column_types.items()]))


def check_evaluations(
    instance: dg.DagsterInstance, assets: dict[str, Any], contexts: dict[str, TaskStepContext],
) -> Iterator[dg.AssetCheckEvaluation]:
    """Each declared check (and ``no_regression``, with a gate) of each row's verification as that row's partition
    of the check, pointing at the materialization it judged: Dagster counts it current only while that is latest."""
    regression = node_regression(assets)
    for name, path in [(name, path) for kind, name, path in assets["produced"] if kind == VERIFICATION]:
        entries = {k: e for k, c in contexts.items() if (e := (c.metadata.get("verifications") or {}).get(name))}
        if not entries:
            continue
        key = dg.AssetKey(path)
        per_row = regression.window + 1 if regression is not None else 1  # the judged one and a baseline
        recent = _recent_materializations(instance, key, [row for row in entries if row], per_row)
        for row, entry in entries.items():
            newest = recent.get(row or None, ([], True))
            record = newest[0][0] if newest[0] else None
            target = evaluation_target(record) if record else None
            # one evaluation per declared check; unknown (not graded) fails with severity WARN
            outcomes = entry.get("checks") or {"passed": verification_passed(entry)}
            metadata = {"score": entry["score"]} if entry.get("score") is not None \
                else {"reason": entry.get("reason", "not graded")}
            for check in assets["checks"]:
                passed = outcomes.get(check)
                yield dg.AssetCheckEvaluation(
                    asset_key=key, check_name=check, passed=bool(passed), metadata=metadata, partition=row or None,
                    target_materialization_data=target,
                    severity=dg.AssetCheckSeverity.WARN if passed is None else dg.AssetCheckSeverity.ERROR,
                )
            if regression is not None:
                tags = (record.asset_materialization.tags or {}) if record else {}
                yield score_evaluation(instance, key, row or None, entry.get("score"), regression,
                                       judged_run=record.run_id if record else None,
                                       code_version=tags.get(CODE_VERSION_TAG), target=target, newest=newest)


def _recent_materializations(
    instance: dg.DagsterInstance, key: dg.AssetKey, rows: list[str], per_row: int,
) -> dict[str | None, tuple[list[dg.EventLogRecord], bool]]:
    """Each of ``rows``' ``per_row`` newest materialization records (the first judged, the rest a baseline) and
    whether they are all; a query per ``ROWS_A_QUERY`` rows, as SQLite takes a bounded number of parameters."""
    recent: dict[str | None, tuple[list[dg.EventLogRecord], bool]] = {}
    for start in range(0, max(len(rows), 1), ROWS_A_QUERY):
        chunk = rows[start:start + ROWS_A_QUERY]
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, asset_partitions=chunk or None), limit=max(len(chunk), 1) * per_row)
        for record in page.records:  # newest first
            recent.setdefault(record.partition_key, ([], not page.has_more))[0].append(record)
    return recent
