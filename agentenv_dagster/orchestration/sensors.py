"""Sensors: nothing leaks when a run fails or is cancelled, and a changed task file runs.

Running by default: the teardown pair (what a failed or cancelled run's ledger still has running is ended and reported
in its event log), the reaper (runs whose process died) and ``agentenv_retry_failed_runs`` (a ``retry_config`` span
re-executed in a child run). Stopped by default: ``agentenv_task_files`` (a run per new or changed task document or
stored version; the cursor remembers what was launched) and ``agentenv_stale_scores`` (``staleness.py``).
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import dagster as dg

from ..compiler import compile_location
from ..config import AgentEnvConfig
from ..plan import TaskPlan
from .io_manager import context_io_manager
from .reaper import reap_dead_runs
from .resources import RESOURCE_KEY, AgentEnvResource
from .retries import launch_retry
from .schedules import task_run_requests
from .staleness import stale_scores_sensor
from .translator import TAG_CODE_VERSION, TAG_CONTENT_HASH, TAG_TASK_ID, TAG_TASK_VERSION, TaskTranslator

FAILED_RUNS_SENSOR = "agentenv_teardown_failed_runs"
CANCELED_RUNS_SENSOR = "agentenv_teardown_canceled_runs"
RETRY_SENSOR = "agentenv_retry_failed_runs"
REAPER_SENSOR = "agentenv_reap_dead_runs"
TASK_FILES_SENSOR = "agentenv_task_files"
TAG_TORN_DOWN = "agentenv/torn_down"

log = logging.getLogger("agentenv_dagster")


def end_run_deployments(
    instance: dg.DagsterInstance, run: dg.DagsterRun, resource: AgentEnvResource,
    logger: logging.Logger | None = None,
) -> list[str] | None:
    """Close the run's ledger (later deployments of the run are refused) and end what it still has running; the
    instances ended, or None for a run that never ran in this project (no run folder under its state dir). Reported in
    the run's event log and as its ``agentenv/torn_down`` tag."""
    resource = resource_of_run(resource, run)
    if not resource.run_dir(run.run_id).is_dir():  # it did not run here (another project's run)
        return None
    ended = resource.teardown(run.run_id)
    left = f"{len(ended)} deployment(s) running; ended: {', '.join(ended)}" if ended else "nothing running"
    message = f"agentenv: the {_ADJECTIVE.get(run.status, run.status.value.lower())} run left {left}"
    (logger or log).info(f"run {run.run_id}: {message}")
    instance.report_engine_event(message, dagster_run=run)
    instance.add_run_tags(run.run_id, {TAG_TORN_DOWN: str(len(ended))})
    return ended


_ADJECTIVE = {dg.DagsterRunStatus.FAILURE: "failed", dg.DagsterRunStatus.CANCELED: "canceled"}


def resource_of_run(resource: AgentEnvResource, run: dg.DagsterRun) -> AgentEnvResource:
    """The resource the run itself used: its launchpad config may name another project."""
    settings = (((run.run_config or {}).get("resources") or {}).get(RESOURCE_KEY) or {}).get("config") or {}
    project_dir = settings.get("project_dir")
    if project_dir and project_dir != resource.project_dir:
        return AgentEnvResource(project_dir=project_dir)
    return resource


def _teardown_sensor(status: dg.DagsterRunStatus, name: str) -> dg.RunStatusSensorDefinition:
    @dg.run_status_sensor(
        run_status=status, name=name, default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=15,
        # every run, not only those launched from this location: `dagster job execute` and
        # `agentenv-dagster run` runs have no location; the run folder says whose a run is
        monitor_all_code_locations=True,
        description=f"Ends the envs, agents and sandboxes a {_ADJECTIVE[status]} run left running.",
    )
    def _sensor(context: dg.RunStatusSensorContext, agentenv: AgentEnvResource):  # the RESOURCE_KEY resource
        end_run_deployments(context.instance, context.dagster_run, agentenv, context.log)
        # None, not a SkipReason: the sensor then goes on to the next run in the same tick

    return _sensor


def teardown_sensors() -> list[dg.SensorDefinition]:
    return [_teardown_sensor(dg.DagsterRunStatus.FAILURE, FAILED_RUNS_SENSOR),
            _teardown_sensor(dg.DagsterRunStatus.CANCELED, CANCELED_RUNS_SENSOR), reaper_sensor()]


def reaper_sensor() -> dg.SensorDefinition:
    """``reaper.reap_dead_runs`` every two minutes: runs whose process died (``kill -9``, a lost run worker)."""

    @dg.sensor(name=REAPER_SENSOR, minimum_interval_seconds=120, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Ends what runs killed mid-way left running and marks those runs failed; "
               "prunes run folders older than [stores] keep_runs_days.")
    def _sensor(context: dg.SensorEvaluationContext, agentenv: AgentEnvResource):  # the RESOURCE_KEY resource
        reaped = reap_dead_runs(context.instance, agentenv.load_config())
        return dg.SkipReason(f"reaped {len(reaped)} dead run(s): {', '.join(reaped)}" if reaped
                             else "no run whose process died")

    return _sensor


def retry_sensor() -> dg.RunFailureSensorDefinition:
    """Watches this location's jobs only: a retry re-executes the failed run's own job, and only a run launched from a
    code location can be queued again (``agentenv-dagster run`` retries in its own process)."""

    @dg.run_failure_sensor(
        name=RETRY_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=15,
        description="Re-executes the retry_config span of a failed run in a child run (at most max_retries).",
    )
    def _sensor(context: dg.RunFailureSensorContext, agentenv: AgentEnvResource):
        run = context.dagster_run
        if context.repository_def is None or not context.repository_def.has_job(run.job_name):
            return
        io = context_io_manager(resource_of_run(agentenv, run).load_config())
        launch_retry(context.instance, context.repository_def.get_job(run.job_name), run, io, RETRY_SENSOR, context.log)

    return _sensor


def task_file_sensor(
    tasks_dir: Path, config: AgentEnvConfig, plans: list[TaskPlan], jobs: list[dg.JobDefinition],
    translator: TaskTranslator,
) -> dg.SensorDefinition:
    """Each tick compiles the task folder and the task store afresh and launches every task whose run key (task id,
    version, content hash) is not in the cursor. A changed task runs its current content (the step fields are op
    config) when its job here still fits it (same steps, types, edges, assets, rows); else it waits for a reload."""
    loaded = {translator.get_job_name(p): p for p in plans}
    store = (config.state_dir / "tasks").resolve()

    def origin(plan: TaskPlan) -> Path:
        """Its file, or its folder of the task store: every stored version is one task, launched by one job."""
        source = Path(plan.document.source).resolve()
        return source.parent if source.parent.parent == store else source

    @functools.cache
    def loaded_shape(name: str) -> tuple:
        return job_shape(loaded[name], translator)

    @dg.sensor(
        name=TASK_FILES_SENSOR, jobs=[job for job in jobs if job.name in loaded] or None,
        default_status=dg.DefaultSensorStatus.STOPPED, minimum_interval_seconds=30,
        description=f"Launches a task's job once per new or changed task document in `{tasks_dir}` "
                    "and per new version in the task store.",
    )
    def _sensor(context: dg.SensorEvaluationContext):
        launched: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
        report = compile_location(tasks_dir, config)
        requests, waiting = [], []
        for plan in report.plans:
            name, tags = translator.get_job_name(plan), translator.get_job_tags(plan)
            key = f"{tags[TAG_TASK_ID]}:{tags[TAG_TASK_VERSION]}:{tags[TAG_CONTENT_HASH]}"
            if launched.get(name) == key:
                continue
            if name not in loaded or origin(loaded[name]) != origin(plan):
                waiting.append(f"{plan.document.source}: task '{plan.task_id}' has no job here yet: "
                               "reload the code location to launch it")
            elif job_shape(plan, translator) != loaded_shape(name):
                waiting.append(f"{plan.document.source}: task '{plan.task_id}' changed its steps, edges, "
                               "assets or rows: reload the code location to launch it")
            else:
                requests += task_run_requests(plan, translator, run_key=key)
                launched[name] = key
        for line in waiting:
            context.log.info(line)
        if report.errors:
            waiting.append(f"{len(report.errors)} problem(s) in task files, e.g. {report.errors[0]}")
        skip_reason = None if requests else ("; ".join(waiting) or "no new or changed task")
        cursor = json.dumps(launched, sort_keys=True)
        return dg.SensorResult(run_requests=requests, skip_reason=skip_reason, cursor=cursor)

    return _sensor


def job_shape(plan: TaskPlan, translator: TaskTranslator) -> tuple:
    """What a run cannot change through run config: the graph's nodes (op, tags — assets and pool —, retry policy),
    edges and rows; not the code version nor content hash, so a task whose steps only changed their fields runs."""
    from .task_job import task_graph  # task_job imports this module (through definitions)

    graph, _, _ = task_graph(plan, translator, code_versions={})
    nodes = []
    for invocation, inputs in graph.dependencies.items():
        tags = {k: v for k, v in (invocation.tags or {}).items() if k not in (TAG_CODE_VERSION, TAG_CONTENT_HASH)}
        nodes.append((
            invocation.alias or invocation.name, invocation.name, tuple(sorted(tags.items())),
            invocation.retry_policy,
            tuple(sorted((i, tuple(sorted(d.node for d in dep.get_node_dependencies()))) for i, dep in inputs.items())),
        ))
    return tuple(sorted(nodes)), tuple(plan.document.partitions or ())


def task_sensors(
    tasks_dir: Path, config: AgentEnvConfig, plans: list[TaskPlan], jobs: list[dg.JobDefinition],
    translator: TaskTranslator,
) -> list[dg.SensorDefinition]:
    """The code location's sensors: the teardown pair, the reaper, span retries, the task files and stale scores."""
    return [*teardown_sensors(), retry_sensor(), task_file_sensor(tasks_dir, config, plans, jobs, translator),
            stale_scores_sensor(plans, jobs, translator)]
