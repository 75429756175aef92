"""Execute one task plan through Dagster in this process (the CLI's ``run``/``task run``).

Runs land in the project's instance (``DAGSTER_HOME``, default ``.dagster_home`` beside
``.agentenv``), so ``dagster dev`` shows them afterwards.
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
from ..runtime.collector import fewer_full_sweeps
from .compute_logs import compute_logs_yaml
from .definitions import build_job, run_config
from .io_manager import context_io_manager
from .ops import IO_MANAGER_KEY
from .resources import RESOURCE_KEY, agentenv_resources
from .retries import retry_in_process
from .rows import range_tags
from .sqlite_storage import local_storage_yaml
from .translator import TaskTranslator


@dataclass
class RunResult:
    success: bool
    run_id: str
    job_name: str
    dagster_home: str
    context_path: Path
    context: TaskStepContext  # the run's one row (empty for a run of several)
    errors: list[str] = field(default_factory=list)
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
        for failure in self.context.metadata.get("failed_steps") or []:
            kind = "failed" if failure.get("is_fatal") else "failed (tolerated)"
            lines.append(f"  step {failure['step_id']} {kind}: {failure['error']}")
        return "\n".join(lines)


# Offline by default: no telemetry, no newsletter prompt in the UI; a code location of
# thousands of tasks needs more than the code server's default 180 s to start.
DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\ncode_servers:\n  local_startup_timeout: 900\n"


def dagster_yaml(home: Path) -> str:
    """The project instance's settings: no telemetry or UI prompts, the local storage and
    compute logs."""
    return DAGSTER_YAML + local_storage_yaml(home) + compute_logs_yaml(home)


def project_dagster_home(config: AgentEnvConfig) -> Path:
    """``DAGSTER_HOME`` if set, else the project's ``.dagster_home`` (created on first use)."""
    home = Path(os.environ.get("DAGSTER_HOME") or config.root / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists() or _moved(settings, home):
        settings.write_text(dagster_yaml(home))
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def opened_instance(config: AgentEnvConfig, instance: dg.DagsterInstance | None = None):
    """The instance given, else the project's: to use as ``with``, which closes only the latter."""
    if instance is not None:
        return nullcontext(instance)
    project_dagster_home(config)
    return dg.DagsterInstance.get()


def _moved(settings: Path, home: Path) -> bool:
    """A dagster.yaml this project wrote for an instance folder that has moved since (a
    settings file of the user's own is left alone)."""
    text = settings.read_text()
    return local_storage_yaml(home) not in text and "class: LocalSqliteStorage" in text


@fewer_full_sweeps()
def execute_plan(
    plan: TaskPlan,
    config: AgentEnvConfig,
    *,
    initial_context: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    instance: dg.DagsterInstance | None = None,
    partition_key: str | None = None,
    partition_keys: list[str] | None = None,
    rows_in_flight: int | None = None,
    tags: dict[str, str] | None = None,
) -> RunResult:
    """Run the task, one of its partitions (``partition_key``), or several in one run
    (``partition_keys``, a single-run backfill: every op runs its step for all of them,
    ``rows_in_flight`` at once)."""
    io_manager = context_io_manager(config)  # the state folder, or S3 ([stores] backend)
    job = build_job(plan, executor_def=dg.in_process_executor)  # a retry re-executes it here too
    home = project_dagster_home(config) if instance is None else Path(instance.root_directory)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    seed = tempfile.TemporaryFile("w+")  # no name on disk: it ends with this process, however that ends
    json.dump(initial_context or {}, seed)
    seed.flush()
    resources = agentenv_resources(config, initial_context_path=f"/proc/self/fd/{seed.fileno()}",
                                   rows_in_flight=rows_in_flight)
    launch: dict[str, Any] = {"partition_key": partition_key}
    if partition_keys is not None and len(partition_keys) == 1:
        launch = {"partition_key": partition_keys[0]}
    elif partition_keys:
        launch = _range_launch(plan, partition_keys)
    defs = dg.Definitions(
        jobs=[job], resources={**resources, IO_MANAGER_KEY: io_manager},
    )
    try:
        with (dg.DagsterInstance.get() if instance is None else nullcontext(instance)) as active:
            job_def = defs.get_job_def(job.name)
            result = job_def.execute_in_process(
                instance=active, raise_on_error=False, **{**launch, "tags": {**(tags or {}), **launch.get("tags", {})}},
            )
            run_ids = [result.run_id, *retry_in_process(active, job_def, result.run_id, io_manager)]
            success = active.get_run_by_id(run_ids[-1]).status == dg.DagsterRunStatus.SUCCESS
    finally:
        seed.close()
    for run_id in run_ids:  # the safety net: the teardown op did it on success
        resources[RESOURCE_KEY].teardown(run_id)
    contexts = io_manager.final_contexts(run_ids[-1])
    context = next(iter(contexts.values())) if len(contexts) == 1 else TaskStepContext()
    output_dir = output_dir or config.root / "out" / job.name
    output_dir.mkdir(parents=True, exist_ok=True)
    context_path = output_dir / "context.json"
    if len(contexts) <= 1:
        context_path.write_text(json.dumps(context.to_safe_dict(), indent=2, default=str))
    else:  # a dataset's rows, by key: one line, straight from the contexts
        context_path.write_bytes(redacted_json(contexts))
    return RunResult(
        success=success, run_id=run_ids[-1], job_name=job.name, dagster_home=str(home),
        context_path=context_path, context=context, contexts=contexts, retried_runs=run_ids[:-1],
    )


def _range_launch(plan: TaskPlan, keys: list[str]) -> dict[str, Any]:
    """A run of several partitions: tagged with their range (in dataset order), configured
    with their values."""
    rows = plan.document.partitions or {}
    unknown = [k for k in keys if k not in rows]
    if unknown:
        raise ValueError(f"task '{plan.task_id}' has no partitions {unknown}")
    ordered = [k for k in rows if k in set(keys)]
    return {"run_config": run_config(plan, TaskTranslator(), {k: rows[k] for k in ordered}),
            "tags": range_tags(plan, ordered)}

