"""build_definitions: a folder of task documents -> a Dagster code location.

Staged like kedro-dagster: compile the files, then plans -> each task's assets and job (``task_job``), its checks and
suite, config -> resources. A file that does not compile becomes a placeholder job that explains the problem (lenient,
the default) or stops the load (``strict=True`` or ``AGENTENV_STRICT=1``, for CI).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import dagster as dg

from ..compiler import compile_location
from ..config import EXECUTORS, AgentEnvConfig, RegressionSettings, load_config
from ..errors import SpecError, TaskLoadError
from ..naming import job_name
from ..plan import TaskPlan
from .executors import job_executor
from .io_manager import context_io_manager
from .dagster_internals import CODE_VERSION_TAG
from .ops import IO_MANAGER_KEY
from .regression import REGRESSION_CHECK, regression_check_specs, score_evaluation
from .resources import agentenv_resources
from .schedules import task_schedules
from .review_tags import review_tag_sensor
from .sensors import task_sensors
from .suites import suite_asset, suites_sensor
from .task_job import build_task
from .translator import TaskTranslator

log = logging.getLogger("agentenv_dagster")
STRICT_ENV = "AGENTENV_STRICT"


def build_job(
    plan: TaskPlan, translator: TaskTranslator | None = None, executor_def: dg.ExecutorDefinition | None = None,
    config: AgentEnvConfig | None = None, resources: dict | None = None,
) -> dg.JobDefinition:
    """The task's job on its own, bound to ``resources`` (default: the location's, from ``config``): its op graph
    backing its assets (``task_job.build_task``), the stored artifacts it loads as their upstream."""
    translator = translator or TaskTranslator()
    config = config or load_config()
    resources = resources if resources is not None else location_resources(config)
    task = build_task(plan, translator, executor_def or job_executor(config, plan), config)
    defs = dg.Definitions(assets=[task.assets, *translator.get_artifact_specs([plan])], jobs=[task.job],
                          resources=resources)
    return defs.resolve_job_def(task.job.name)


def build_definitions(
    tasks_dir: str | Path,
    *,
    project_dir: str | Path | None = None,
    translator: TaskTranslator | None = None,
    strict: bool = False,
    experiments: dict[str, list[str]] | None = None,
    executor: str | None = None,
) -> dg.Definitions:
    """The code location of every task document under ``tasks_dir``. ``experiments`` (file ->
    Coder Eval task ids) and ``executor`` replace the config's ``[experiments]`` and ``[dagster]
    executor``. Strict (``strict`` or ``AGENTENV_STRICT=1``): a file that does not compile
    raises :class:`TaskLoadError`, one ``<file>: step '<id>': <message>`` line per problem."""
    tasks_dir = Path(tasks_dir).resolve()
    project_dir = Path(project_dir).resolve() if project_dir else tasks_dir.parent
    translator = translator or TaskTranslator()
    strict = strict or strict_from_env()
    config = with_overrides(load_config(project_dir), experiments=experiments, executor=executor)
    report = compile_location(tasks_dir, config)
    resources = location_resources(config)
    plans, jobs, suites, assets, checks = [], [], [], [], []
    for plan in report.plans:
        try:  # Dagster's own checks (names, keys) refuse one task, not the location
            task = build_task(plan, translator, job_executor(config, plan), config)
            regression = config.regression.for_task(plan.task_id)
            suite = suite_asset(plan, translator, regression)
            check_specs = [*translator.get_check_specs(plan), *regression_check_specs(plan, translator, regression)]
        except (dg.DagsterInvalidDefinitionError, dg.DagsterInvariantViolationError) as exc:
            report.errors.append(SpecError(f"Dagster refuses its definitions: {exc}", file=str(plan.document.source)))
            continue
        plans.append(plan)
        jobs.append(task.job)
        assets.append(task.assets)
        suites += [suite] if suite is not None else []
        if check_specs:
            checks.append(verification_checks(check_specs, f"{translator.get_job_name(plan)}__checks", regression))
    if report.errors and strict:
        raise TaskLoadError(report.errors)
    for problem in [*map(str, report.errors), *report.warnings]:
        log.warning(problem)
    jobs += broken_task_jobs(report.errors, {j.name for j in jobs})
    return dg.Definitions(
        jobs=jobs,
        assets=[*translator.get_artifact_specs(plans), *assets, *suites],
        asset_checks=checks,
        resources=resources,
        # the implicit asset job's, which runs an asset backfill, Materialize in the asset graph
        # and `dg launch --assets`: the same as the task jobs', so its rows stream and are bounded
        executor=job_executor(config),
        sensors=[*task_sensors(tasks_dir, config, plans, jobs, translator), review_tag_sensor(),
                 *suites_sensor(suites)],
        schedules=task_schedules(plans, config, jobs, translator),
    )


def strict_from_env() -> bool:
    """``AGENTENV_STRICT``: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``/unset."""
    value = os.environ.get(STRICT_ENV, "")
    if (word := value.strip().lower()) not in ("1", "true", "yes", "on", "", "0", "false", "no", "off"):
        raise ValueError(f"{STRICT_ENV}={value[:40]!r}: expected 1 or 0 (true/false, yes/no, on/off)")
    return word in ("1", "true", "yes", "on")


def with_overrides(
    config: AgentEnvConfig, *, experiments: dict[str, list[str]] | None, executor: str | None,
) -> AgentEnvConfig:
    """The config with a code location's own ``[experiments]`` and ``[dagster] executor``."""
    if executor is not None and executor not in EXECUTORS:
        raise ValueError(f"executor '{executor}': expected one of {', '.join(EXECUTORS)}")
    if experiments is not None:
        config = config.model_copy(update={"experiments": {str(file): list(ids) for file, ids in experiments.items()}})
    if executor is not None:
        config = config.model_copy(update={"dagster": config.dagster.model_copy(update={"executor": executor})})
    return config


def location_resources(config: AgentEnvConfig) -> dict:
    """The resources of the code location and of a job built alone; the IO manager writes to the state folder or S3."""
    return {**agentenv_resources(config), IO_MANAGER_KEY: context_io_manager(config)}


def verification_checks(check_specs: list[dg.AssetCheckSpec], name: str,
                        regression: RegressionSettings) -> dg.AssetChecksDefinition:
    """A task's checks (its job reports them as it runs); run on its own, a check judges the latest
    materialization (a row's): ``passed`` re-reads its metadata, ``no_regression`` compares its score
    with earlier ones. One definition per task, as one for all costs time quadratic in the tasks."""

    @dg.multi_asset_check(specs=check_specs, can_subset=True, name=name)
    def _checks(context):
        run = context.op_execution_context
        rows = [run.partition_key] if run.has_partition_key else None
        for check_key in context.selected_asset_check_keys:
            records = context.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=check_key.asset_key, asset_partitions=rows), limit=1).records
            event = records[0].event_log_entry if records else None
            metadata = event.asset_materialization.metadata if event and event.asset_materialization else {}
            if check_key.name == REGRESSION_CHECK:
                score = metadata.get("score")
                evaluation = score_evaluation(
                    context.instance, check_key.asset_key, rows[0] if rows else None, getattr(score, "value", score),
                    regression, judged_run=event.run_id if event else None,
                    code_version=(event.asset_materialization.tags or {}).get(CODE_VERSION_TAG) if event else None)
                passed, severity, description = evaluation.passed, evaluation.severity, evaluation.description
                kept = evaluation.metadata
            else:  # what the evaluation in the run said: its score, or why it was not graded
                value = getattr(metadata.get("passed"), "value", metadata.get("passed"))
                passed, description = bool(value), None
                severity = dg.AssetCheckSeverity.WARN if value is None else dg.AssetCheckSeverity.ERROR
                kept = {label: metadata[label] for label in ("score", "reason") if label in metadata}
            yield dg.AssetCheckResult(
                asset_key=check_key.asset_key, check_name=check_key.name, passed=passed, severity=severity,
                description=description, metadata={**kept, "from_run": event.run_id if event else "never materialized"})

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

        @dg.op(name=f"{name}_explain")
        def _explain(context, _text: str = "\n".join(problems)) -> None:
            raise dg.Failure(description=f"This task file does not compile:\n{_text}")

        jobs.append(dg.JobDefinition(
            graph_def=dg.GraphDefinition(name=name, node_defs=[_explain]), tags={"agentenv/invalid": "true"},
            description=f"INVALID task file `{file}`:\n\n" + "\n".join(f"- {p}" for p in problems)))
    return jobs
