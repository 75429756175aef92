"""Schedules: a task that carries a cron schedule gets a Dagster schedule of its job.

The cron comes from ``[schedules]`` in ``.agentenv/config.toml`` (task id -> cron; it wins) or a
Coder Eval task's ``schedule:<preset>`` tag (``hourly`` … ``yearly``: tags are kebab-case
``key:value`` words, so they cannot hold a cron). A dataset task's tick runs its selected rows in
one run, as the CLI does; an experiment's job (``<task_id>__<experiment_id>``) runs each variant.
"""

from __future__ import annotations

import logging

import dagster as dg

from ..config import AgentEnvConfig, ScheduleEntry
from ..errors import TaskLoadError
from ..plan import TaskPlan
from .rows import REPLICATE_TAG, VARIANT_TAG, range_tags
from .translator import TaskTranslator

log = logging.getLogger("agentenv_dagster")
TAG_PRESETS = {name: f"@{name}" for name in ("hourly", "daily", "weekly", "monthly", "yearly")}


def task_run_requests(
    plan: TaskPlan, translator: TaskTranslator, *, run_key: str | None = None,
    variants: list[str | None] | None = None, rows: list[str] | None = None,
) -> list[dg.RunRequest]:
    """The runs of the task as ``plan`` has it: one per replicate (a simulation's trials), and under an experiment per
    variant and replicate (a run is one variant; ``variants``: only those). Each has its steps as op config, its id,
    version and content hash as tags, and a dataset task's ``rows`` (default: its selected rows, every row or a new
    stratified draw), tagged with their range. Each run key names them: a schedule's tick of several runs needs keys."""
    from .task_job import run_config  # task_job imports this module (through definitions)

    requests = []
    for variant in variants or plan.document.variant_steps or [None]:
        count = plan.document.replicates_of(variant)
        for replicate in range(count):  # a stratified sample: a new draw each
            keys = (rows or plan.document.selected_rows(variant)) if plan.document.partitions else None
            key = ":".join(filter(None, (run_key, variant, f"replicate-{replicate}" if count > 1 else None))) or None
            tags = {**translator.get_job_tags(plan), **({VARIANT_TAG: variant} if variant else {}),
                    **({REPLICATE_TAG: str(replicate)} if count > 1 else {}),
                    **(range_tags(plan, keys) if keys is not None and len(keys) != 1 else {})}
            requests.append(dg.RunRequest(
                run_key=key, job_name=translator.get_job_name(plan), tags=tags,
                run_config=run_config(plan, translator, keys),
                partition_key=keys[0] if keys is not None and len(keys) == 1 else None))
    return requests


def task_schedules(
    plans: list[TaskPlan], config: AgentEnvConfig, jobs: list[dg.JobDefinition], translator: TaskTranslator,
) -> list[dg.ScheduleDefinition]:
    """One schedule per task that has a cron; a schedule that cannot be built is logged and
    left out (like a bad task file, it must not take the code location down)."""
    by_name = {job.name: job for job in jobs}
    for unknown in sorted(set(config.schedules) - {plan.task_id for plan in plans}):
        log.warning(f"[schedules] {unknown}: no task with this id in the tasks folder; not scheduled")
    schedules = []
    for plan in plans:
        entry = config.schedules.get(plan.task_id) or tag_schedule(plan)
        job = by_name.get(translator.get_job_name(plan))
        if entry is None or job is None:
            continue
        try:
            schedules.append(task_schedule(plan, entry, job, translator))
        except dg.DagsterInvalidDefinitionError as exc:
            log.warning(f"[schedules] {plan.task_id}: not scheduled: {exc}")
    return schedules


def task_schedule(
    plan: TaskPlan, entry: ScheduleEntry, job: dg.JobDefinition, translator: TaskTranslator,
) -> dg.ScheduleDefinition:
    def _tick(context: dg.ScheduleEvaluationContext):
        yield from task_run_requests(plan, translator)  # a schedule yields its requests (a list is refused)

    return dg.ScheduleDefinition(
        name=f"{job.name}_schedule", cron_schedule=entry.cron, job=job, execution_fn=_tick,
        execution_timezone=entry.timezone,
        default_status=dg.DefaultScheduleStatus[entry.default_status.upper()],
        description=f"Runs task `{plan.task_id}` on `{entry.cron}` ({entry.timezone}).",
    )


def tag_schedule(plan: TaskPlan) -> ScheduleEntry | None:
    """A Coder Eval task's ``schedule:<preset>`` tag, if it has one (its own job's: an
    experiment's job is scheduled by its id in ``[schedules]``)."""
    if plan.document.format != "coder-eval" or plan.document.variant_steps is not None:
        return None
    from ..spec.coder_eval import load_coder_eval_task

    try:
        tags = load_coder_eval_task(plan.document.source).task.tags
    except (TaskLoadError, OSError) as exc:  # it compiled a moment ago; it changed since
        log.warning(f"{plan.document.source}: tags not read, not scheduled: {exc}")
        return None
    presets = [t.partition(":")[2] for t in tags if t.partition(":")[0] == "schedule"]
    if not presets:
        return None
    if presets[0] not in TAG_PRESETS:
        log.warning(f"{plan.document.source}: tag 'schedule:{presets[0]}': unknown schedule "
                    f"(one of {', '.join(TAG_PRESETS)}; or a cron in [schedules] of .agentenv/config.toml)")
        return None
    return ScheduleEntry(cron=TAG_PRESETS[presets[0]])
