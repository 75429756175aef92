"""Execute one task plan through Dagster in this process (the CLI's ``run``/``task run``), in the
project's instance (``DAGSTER_HOME``, default ``.dagster_home`` beside ``.agentenv``): ``dagster dev`` shows the runs.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from ..config import AgentEnvConfig
from ..context import TaskStepContext, redacted_json
from ..plan import TaskPlan
from .dagster_internals import LocationJob, run_here, location_job as dagster_location_job
from .definitions import build_job
from .task_job import run_config
from .executors import job_executor
from .io_manager import context_io_manager
from .ops import IO_MANAGER_KEY
from .progress import console_config, run_label, watching
from .resources import RESOURCE_KEY, agentenv_resources
from .retries import retry_in_process
from .reaper import reap_dead_runs
from .rows import VARIANT_TAG, range_tags
from .translator import TAG_CONTENT_HASH, TaskTranslator


@dataclass
class RunResult:
    success: bool
    run_id: str
    job_name: str
    dagster_home: str
    context_path: Path
    context: TaskStepContext  # the run's one row (empty for a run of several)
    contexts: dict[str, TaskStepContext] = field(default_factory=dict)  # by partition key
    retried_runs: list[str] = field(default_factory=list)  # failed runs a retry_config re-executed

    def summary(self) -> str:
        lines = [
            *(f"run {run_id} of job '{self.job_name}': FAILURE (retried)" for run_id in self.retried_runs),
            f"run {self.run_id} of job '{self.job_name}': {'SUCCESS' if self.success else 'FAILURE'}",
            f"  dagster instance: {self.dagster_home}",
            f"  context:          {self.context_path}",
        ]
        for verifier_id, entry in (self.context.metadata.get("verifications") or {}).items():
            score = entry.get("score")
            shown = f"{score:.3f}" if score is not None else f"not graded ({entry.get('reason', '')})"
            lines.append(f"  verification {verifier_id}: {shown}")
        for step_id, entry in (self.context.metadata.get("collected_artifacts") or {}).items():
            lines.append(f"  collected by {step_id}: {sorted(entry.get('artifacts') or {})}")
        lines += [f"  step {failure['step_id']} {'failed' if failure.get('is_fatal') else 'failed (tolerated)'}: "
                  f"{failure['error']}" for failure in self.context.metadata.get("failed_steps") or []]
        return "\n".join(lines)


def dagster_yaml(home: Path) -> str:
    """The settings of the project's instance at ``home``: offline, Dagster's own storage there
    (``deploy/dagster.yaml`` for PostgreSQL), runs from the UI or daemon forked from a warm process."""
    return """telemetry:
  enabled: false
nux:
  enabled: false
run_launcher:
  module: agentenv_dagster.orchestration.run_launcher
  class: ForkingRunLauncher
"""


def project_dagster_home(config: AgentEnvConfig) -> Path:
    """``DAGSTER_HOME`` if set, else the project's ``.dagster_home`` (its ``dagster.yaml`` written on first use)."""
    home = Path(os.environ.get("DAGSTER_HOME") or config.root / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    if not (settings := home / "dagster.yaml").exists():
        settings.write_text(dagster_yaml(home))
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def opened_instance(config: AgentEnvConfig, instance: dg.DagsterInstance | None = None):
    """The instance given, else the project's: to use as ``with``, which closes only the latter."""
    if instance is not None:
        return nullcontext(instance)
    project_dagster_home(config)
    return dg.DagsterInstance.get()


def execute_plan(
    plan: TaskPlan,
    config: AgentEnvConfig,
    *,
    initial_context: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    instance: dg.DagsterInstance | None = None,
    partition_keys: list[str] | None = None,
    rows_in_flight: int | None = None,
    max_sandboxes: int | None = None,
    tags: dict[str, str] | None = None,
) -> RunResult:
    """Run the task, or some of its partitions in one run (``partition_keys``, as a single-run backfill does), in this
    process with the job's executor. A task the project's code location has as it is runs as the location's job (the
    UI lists it there and can re-execute it); any other (a file elsewhere, ``-D`` overrides) as a job of its own."""
    io_manager = context_io_manager(config)  # the state folder, or S3 ([stores] backend)
    job_name = TaskTranslator().get_job_name(plan)
    home = project_dagster_home(config) if instance is None else Path(instance.root_directory)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    seed = tempfile.TemporaryFile("w+")  # no name on disk: it ends with this process, however that ends
    json.dump(initial_context or {}, seed)
    seed.flush()
    # This process's descriptor, by its pid: a run re-executed from the UI (another process)
    # reads it while this process lives, and gets a clear error after (not another file).
    seed_path = f"/proc/{os.getpid()}/fd/{seed.fileno()}" if initial_context else None
    overrides = {k: v for k, v in (("initial_context_path", seed_path),
                                   ("rows_in_flight", rows_in_flight), ("max_sandboxes", max_sandboxes)) if v}
    resources = agentenv_resources(config, **overrides)
    run_config, run_tags = _launch(plan, partition_keys)
    location = location_job(config, plan)
    if location is not None:  # its resources as the location binds them; this run's settings as run config
        job_def = location.job_def
        run_config = {**run_config, "resources": {RESOURCE_KEY: {"config": {
            "project_dir": str(config.root), **overrides}}}}  # run config replaces a resource's whole config
    else:
        job_def = build_job(plan, executor_def=job_executor(config, plan), config=config,
                            resources={**resources, IO_MANAGER_KEY: io_manager})  # a retry re-executes it here too
    run_config = {**console_config(job_def), **run_config}  # Dagster's event lines on the console, or not
    run_tags = {**(tags or {}), **run_tags}
    with seed, opened_instance(config, instance) as active:
        reap_dead_runs(active, config)  # what runs killed earlier left behind
        with watching(active, run_label(job_name, run_tags), rows=len(partition_keys or [""])) as new_id:
            run_id = run_here(job_def, active, run_config, run_tags, location, run_id=new_id)
            run_ids = [run_id, *retry_in_process(active, job_def, run_id, io_manager)]
        success = active.get_run_by_id(run_ids[-1]).status == dg.DagsterRunStatus.SUCCESS
    for run_id in run_ids:  # the safety net: the teardown op did it, unless the run stopped before it
        resources[RESOURCE_KEY].teardown(run_id)
    contexts = io_manager.final_contexts(run_ids[-1])
    context = next(iter(contexts.values())) if len(contexts) == 1 else TaskStepContext()
    output_dir = output_dir or config.root / "out" / job_name
    output_dir.mkdir(parents=True, exist_ok=True)
    context_path = output_dir / "context.json"
    if len(contexts) <= 1:
        context_path.write_text(json.dumps(context.to_safe_dict(), indent=2, default=str))
    else:  # a dataset's rows, by key: one line, straight from the contexts
        context_path.write_bytes(redacted_json(contexts))
    return RunResult(success=success, run_id=run_ids[-1], job_name=job_name, dagster_home=str(home),
                     context_path=context_path, context=context, contexts=contexts, retried_runs=run_ids[:-1])


def location_job(config: AgentEnvConfig, plan: TaskPlan) -> LocationJob | None:
    """The job the project's code location (its ``workspace.yaml``) has for this task, when its content is the same."""
    workspace = config.root / "workspace.yaml"
    found = dagster_location_job(str(workspace), TaskTranslator().get_job_name(plan)) if workspace.is_file() else None
    same = found is not None and found.job_def.tags.get(TAG_CONTENT_HASH) == plan.document.content_hash
    return found if same else None


def _launch(plan: TaskPlan, partition_keys: list[str] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The run config and tags of a run of the task, of one partition, or of several (tagged as a backfill is)."""
    if not partition_keys:
        return {}, {}
    rows = plan.document.partitions or {}
    if unknown := [k for k in partition_keys if k not in rows]:
        raise ValueError(f"task '{plan.task_id}' has no partition {unknown[0]!r}" if len(partition_keys) == 1
                         else f"task '{plan.task_id}' has no partitions {unknown}")
    ordered = [k for k in rows if k in set(partition_keys)]
    variant = plan.document.variant_of(ordered[0])
    tags = {"dagster/partition": ordered[0], **({VARIANT_TAG: variant} if variant else {})} \
        if len(partition_keys) == 1 else range_tags(plan, ordered)
    return run_config(plan, TaskTranslator(), ordered), tags
