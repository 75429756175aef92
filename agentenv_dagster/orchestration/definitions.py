"""build_definitions: a folder of task documents -> a Dagster code location.

Staged like kedro-dagster: compile the files, then plans -> jobs, plans -> asset specs and
checks, config -> resources. A file that does not compile becomes a placeholder job that
explains the problem (lenient, the default) or stops the load (``strict=True``, for CI).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import dagster as dg

from ..compiler import compile_location
from ..config import AgentEnvConfig, load_config
from ..errors import SpecError, TaskLoadError
from ..naming import job_name
from ..plan import TaskPlan
from ..steps.base import TaskStep
from .executors import job_executor
from .io_manager import context_io_manager
from .ops import AFTER, IO_MANAGER_KEY, TEARDOWN_OP, step_op, teardown_op
from .resources import agentenv_resources
from .rows import ROWS, VARIANT_TAG
from .schedules import task_schedules
from .review_tags import review_tag_sensor
from .retries import span_tags
from .sensors import task_sensors
from .suites import suite_asset, suites_sensor
from .translator import TAG_STEP_ASSETS, TaskTranslator

log = logging.getLogger("agentenv_dagster")
POOL_TAG = "dagster/concurrency_key"  # a node's pool (op definitions are shared across tasks)


def build_job(
    plan: TaskPlan, translator: TaskTranslator | None = None, executor_def: dg.ExecutorDefinition | None = None,
) -> dg.JobDefinition:
    """One job per task: a node per step (aliases of the shared per-type ops), the
    ``depends_on`` edges, a final teardown node, the step fields as default op config. A
    dataset task is partitioned by row: each partition's config is its row's fields. The
    executor: ``executor_def``, else the one the plan calls for (``executors.job_executor``)."""
    translator = translator or TaskTranslator()
    deps: dict[dg.NodeInvocation, dict] = {}
    node_defs = {}
    for step in plan.steps:
        op_def = step_op(step.type)
        node_defs[op_def.name] = op_def
        invocation = dg.NodeInvocation(
            op_def.name, alias=translator.get_node_name(step), retry_policy=translator.get_retry_policy(step),
            tags={
                **translator.get_op_tags(step), TAG_STEP_ASSETS: translator.get_step_assets_tag(plan, step),
                **({POOL_TAG: pool} if (pool := translator.get_pool(plan, step)) else {}),
                **span_tags(plan, step, translator),
            },
        )
        sources = plan.context_sources(step.id)
        deps[invocation] = _fan_in(
            [translator.get_node_name(plan.step_by_id[d]) for d in sources],
            after=[translator.get_node_name(plan.step_by_id[d]) for d in plan.edges[step.id] if d not in sources],
        )
    teardown = teardown_op()
    node_defs[teardown.name] = teardown
    sinks = [translator.get_node_name(plan.step_by_id[s]) for s in plan.sinks]
    deps[dg.NodeInvocation(teardown.name, alias=TEARDOWN_OP)] = _fan_in(sinks)
    graph = dg.GraphDefinition(
        name=translator.get_job_name(plan), node_defs=list(node_defs.values()), dependencies=deps,
        description=translator.get_job_description(plan),
    )
    config, tags = _job_config(plan, translator), translator.get_job_tags(plan)
    return dg.JobDefinition(graph_def=graph, config=config, tags=tags,
                            executor_def=executor_def or job_executor(AgentEnvConfig(), plan))


def _job_config(plan: TaskPlan, translator: TaskTranslator) -> dg.ConfigMapping | dg.PartitionedConfig:
    if not plan.document.partitions:
        return step_defaults(run_config(plan, translator))
    rows = RowConfig(plan, translator)
    return dg.PartitionedConfig(partitions_def=translator.get_partitions_def(plan),
                                run_config_for_partition_key_fn=rows, tags_for_partition_key_fn=rows.tags)


class RowConfig:
    """A partition's run config (its row's values in the root ops, its variant's steps) and
    tags; ``rows.run_keys`` reads the plan from it for a run that names no partition."""

    def __init__(self, plan: TaskPlan, translator: TaskTranslator):
        self.plan, self.translator = plan, translator

    def __call__(self, key: str) -> dict:
        return run_config(self.plan, self.translator, {key: self.plan.document.partitions[key]})

    def tags(self, key: str) -> dict[str, str]:
        variant = self.plan.document.variant_of(key)
        return {VARIANT_TAG: variant} if variant is not None else {}


def step_defaults(defaults: dict) -> dg.ConfigMapping:
    """A job's step fields as defaults the launchpad shows, without Dagster's dict ``config=``.

    A dict makes Dagster build the job's whole run-config schema twice (once to copy the
    defaults into it) and snapshot every resource, executor and logger type, with defaults,
    in every job: a third of a location's load and of each job snapshot, for types that are
    the same in every job. Here only ``ops`` carries the defaults (a node given in the run
    config replaces that node's default); ``execution``, ``resources`` and ``loggers`` pass
    through and are checked against the job's own schema when a run is validated.
    """
    untyped = dg.Field(dg.Permissive(), is_required=False)
    schema = {"ops": dg.Field(dg.Permissive(), default_value=defaults["ops"]),
              "execution": untyped, "resources": untyped, "loggers": untyped}
    return dg.ConfigMapping(config_fn=partial(_over_defaults, defaults["ops"]), config_schema=schema)


def _over_defaults(ops: dict, config: dict) -> dict:
    return {**config, "ops": {**ops, **config.get("ops", {})}}


def run_config(plan: TaskPlan, translator: TaskTranslator, rows: dict[str, dict] | None = None) -> dict:
    """Op config: each step's fields (of the rows' variant, under an experiment), and for
    dataset rows their values in the root ops. The steps keep their ``<row.field>`` tokens:
    every row is filled from its own values as it runs, so one config serves a partition, a
    range of them, or the launchpad."""
    roots = {s.id for s in plan.steps if not plan.edges[s.id]}
    return {"ops": {
        translator.get_node_name(step): {"config": {
            "step": step_config(step),
            **({ROWS: rows} if rows and step.id in roots else {}),
        }}
        for step in plan.document.steps_for(next(iter(rows), None) if rows else None)
    }}


def step_config(step: TaskStep) -> dict:
    """The fields a step sets (a default is filled again when the op parses them): what the
    task document says, and what every job snapshot and run carries — a thousand
    tasks' worth of defaults is megabytes the webserver loads for nothing."""
    return {"id": step.id, "type": step.type,
            **step.model_dump(mode="json", exclude_none=True, exclude_defaults=True, by_alias=True)}


def _fan_in(upstream: list[str], after: list[str] = ()) -> dict:
    """A node's ``depends_on`` edges: ``upstream`` hands it their contexts, ``after`` only
    orders it (a dependency another one descends from: loading its context again, and merging
    it, would cost a dataset run a read and a merge per row for nothing)."""
    return {
        name: dg.MultiDependencyDefinition([dg.DependencyDefinition(node, "result") for node in nodes])
        for name, nodes in (("upstream", upstream), (AFTER, after)) if nodes
    }


def build_definitions(
    tasks_dir: str | Path,
    *,
    project_dir: str | Path | None = None,
    translator: TaskTranslator | None = None,
    strict: bool = False,
) -> dg.Definitions:
    """The code location of every task document under ``tasks_dir``."""
    tasks_dir = Path(tasks_dir).resolve()
    project_dir = Path(project_dir).resolve() if project_dir else tasks_dir.parent
    translator = translator or TaskTranslator()
    config = load_config(project_dir)
    report = compile_location(tasks_dir, config)
    resources = location_resources(config)
    plans, jobs, suites, specs, checks = [], [], [], [], []
    for plan in report.plans:
        try:  # Dagster's own checks (names, keys) refuse one task, not the location
            job = build_job(plan, translator, job_executor(config, plan))
            suite = suite_asset(plan, translator)
            plan_specs, check_specs = translator.get_asset_specs(plan), translator.get_check_specs(plan)
        except dg.DagsterInvalidDefinitionError as exc:
            report.errors.append(SpecError(f"Dagster refuses its definitions: {exc}", file=str(plan.document.source)))
            continue
        plans.append(plan)
        jobs.append(job)
        suites += [suite] if suite is not None else []
        specs += plan_specs
        if check_specs:
            checks.append(verification_checks(check_specs, f"{translator.get_job_name(plan)}__checks"))
    if report.errors and strict:
        raise TaskLoadError(report.errors)
    for problem in [*map(str, report.errors), *report.warnings]:
        log.warning(problem)
    jobs += broken_task_jobs(report.errors, {j.name for j in jobs})
    return dg.Definitions(
        jobs=jobs,
        assets=[*translator.get_artifact_specs(plans), *specs, *suites],
        asset_checks=checks,
        resources=resources,
        sensors=[*task_sensors(tasks_dir, config, plans, jobs, translator), review_tag_sensor(),
                 *suites_sensor(suites)],
        schedules=task_schedules(plans, config, jobs, translator),
    )


def location_resources(config: AgentEnvConfig) -> dict:
    """The resources of the code location (and of a job built on its own, see ``location``)."""
    return {
        **agentenv_resources(config),
        IO_MANAGER_KEY: context_io_manager(config),  # the state folder, or S3
    }


def verification_checks(check_specs: list[dg.AssetCheckSpec], name: str) -> dg.AssetChecksDefinition:
    """Declares a task's pass/fail checks (its job reports them as it runs); run on its own
    it re-reads the latest materialization's ``passed`` metadata (the partition's, for a row).
    One definition per task: Dagster's asset job wires each check definition's inputs against
    its own check keys, so one definition for every task costs time quadratic in the number
    of tasks."""

    @dg.multi_asset_check(specs=check_specs, can_subset=True, name=name)
    def _checks(context):
        run = context.op_execution_context
        rows = [run.partition_key] if run.has_partition_key else None
        for check_key in context.selected_asset_check_keys:
            records = context.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=check_key.asset_key, asset_partitions=rows), limit=1).records
            event = records[0].event_log_entry if records else None
            metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
            passed = metadata.get("passed")
            value = getattr(passed, "value", passed)
            yield dg.AssetCheckResult(
                asset_key=check_key.asset_key, check_name=check_key.name, passed=bool(value),
                severity=dg.AssetCheckSeverity.WARN if value is None else dg.AssetCheckSeverity.ERROR,
                metadata={"from_run": event.run_id if event else "never materialized"},
            )

    return _checks


def broken_task_jobs(errors: list[SpecError], taken: set[str]) -> list[dg.JobDefinition]:
    """A placeholder job per broken file, so the UI lists it with its problems."""
    by_file: dict[str, list[str]] = {}
    for error in errors:
        by_file.setdefault(error.file or "?", []).append(str(error))
    jobs = []
    for file, problems in by_file.items():
        name = f"{job_name(Path(file).stem)}__invalid"
        if name in taken:
            continue
        text = "\n".join(problems)

        @dg.op(name=f"{name}_explain")
        def _explain(context, _text: str = text) -> None:
            raise dg.Failure(description=f"This task file does not compile:\n{_text}")

        jobs.append(dg.JobDefinition(
            graph_def=dg.GraphDefinition(name=name, node_defs=[_explain]),
            description=f"INVALID task file `{file}`:\n\n" + "\n".join(f"- {p}" for p in problems),
            tags={"agentenv/invalid": "true"},
        ))
    return jobs
