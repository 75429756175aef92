"""Which of a task's rows are stale (a task asset ``STALE`` or ``MISSING``, as the UI shows), and the runs that
refresh them: ``run --stale-only`` runs just those rows, the ``agentenv_stale_scores`` sensor launches them."""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from ..config import AgentEnvConfig
from ..plan import TaskPlan
from ..steps.base import ARTIFACT
from .dagster_internals import FRESH, MISSING, StaleStatuses
from .provenance import digest
from .rows import UNPARTITIONED
from .translator import TaskTranslator

STALE_SCORES_SENSOR = "agentenv_stale_scores"


@dataclass
class StaleRows:
    """Of the rows asked about (``""``: a task without rows), the stale ones with why; the others are fresh."""

    stale: dict[str, list[str]] = field(default_factory=dict)

    def summary(self, limit: int = 3) -> str:
        """The stale rows' reasons in a line: the first ``limit`` rows', and how many more."""
        shown = [f"{f'row {key}: ' if key else ''}{'; '.join(reasons)}"
                 for key, reasons in list(self.stale.items())[:limit]]
        more = len(self.stale) - limit
        return " | ".join(shown) + (f" | and {more} more row(s)" if more > 0 else "")


def task_asset_keys(plan: TaskPlan, translator: TaskTranslator) -> list[dg.AssetKey]:
    """The task's own assets (what its job materializes): verifications, collections, results."""
    keys = [key for step in plan.steps for kind, _, key in translator.produced_asset_keys(plan.task_id, step)
            if kind != ARTIFACT]
    return [*keys, translator.get_results_asset_key(plan)]


def plan_asset_graph(plan: TaskPlan, config: AgentEnvConfig):
    """The task's asset graph as the project's code location builds it, with the stored artifacts upstream."""
    from .definitions import location_resources  # definitions -> sensors -> this module
    from .task_job import build_task

    translator = TaskTranslator()
    task = build_task(plan, translator, dg.in_process_executor, config)
    return dg.Definitions(assets=[task.assets, *translator.get_artifact_specs([plan])],
                          resources=location_resources(config)).resolve_asset_graph()


def stale_rows(instance: dg.DagsterInstance, asset_graph, plan: TaskPlan, keys: list[str],
               translator: TaskTranslator | None = None) -> StaleRows:
    """Which of ``keys`` (partition keys; ``[""]``: no rows) are stale or missing, against ``asset_graph``."""
    statuses = StaleStatuses(instance, asset_graph)
    found = StaleRows()
    assets = [key for key in task_asset_keys(plan, translator or TaskTranslator()) if asset_graph.has(key)]
    for row in keys:
        partition = row if row != UNPARTITIONED else None
        reasons, missing = [], []
        for key in assets:
            status = statuses.status(key, partition)
            if status == MISSING:
                missing.append(f"{key.to_user_string()}: never materialized")
            elif status != FRESH:
                reasons += [f"{key.to_user_string()}: {cause}" for cause in statuses.causes(key, partition)
                            ] or [f"{key.to_user_string()}: stale"]
        reasons = ["never materialized"] if missing and len(missing) == len(assets) else [*reasons, *missing]
        if reasons:
            found.stale[row] = reasons
    return found


def stale_scores_sensor(plans: list[TaskPlan], jobs: list[dg.JobDefinition],
                        translator: TaskTranslator) -> dg.SensorDefinition:
    """Each tick, launches each task's and variant's stale or missing (selected) rows as one run, keyed by the code
    versions and rows: a failed run is not launched again until something changes."""
    from .schedules import task_run_requests  # schedules -> task_job -> ... -> this module

    by_name = {job.name: job for job in jobs}
    tasks = [(plan, by_name[translator.get_job_name(plan)]) for plan in plans
             if translator.get_job_name(plan) in by_name]

    @dg.sensor(
        name=STALE_SCORES_SENSOR, jobs=[job for _, job in tasks] or None,
        default_status=dg.DefaultSensorStatus.STOPPED, minimum_interval_seconds=60,
        description="Launches the tasks (a dataset's rows) whose scores are stale or were never "
                    "materialized: a changed task, agent, model, judge or upstream artifact.")
    def _sensor(context: dg.SensorEvaluationContext):
        graph = context.repository_def.asset_graph
        requests, fresh = [], 0
        for plan, _ in tasks:
            versions = [graph.get(key).code_version for key in task_asset_keys(plan, translator) if graph.has(key)]
            for variant in plan.document.variant_steps or [None]:
                keys = plan.document.selected_rows(variant) if plan.document.partitions else [UNPARTITIONED]
                found = stale_rows(context.instance, graph, plan, keys, translator)
                if not found.stale:
                    fresh += 1
                    continue
                context.log.info(f"{plan.task_id}{f' [{variant}]' if variant else ''}: {found.summary()}")
                rows = [k for k in keys if k in found.stale]
                run_key = "stale:" + digest([plan.task_id, variant, versions, rows])
                requests += task_run_requests(plan, translator, run_key=run_key, variants=[variant],
                                              rows=rows if plan.document.partitions else None)
        if requests:
            return dg.SensorResult(run_requests=requests)
        return dg.SkipReason(f"every score is current ({fresh} task(s) and variant(s) fresh)")

    return _sensor
