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
from ..context import TaskStepContext
from ..plan import TaskPlan
from .definitions import build_job
from .io_manager import TaskContextIOManager, final_context
from .ops import IO_MANAGER_KEY
from .resources import RESOURCE_KEY, agentenv_resources


@dataclass
class RunResult:
    success: bool
    run_id: str
    job_name: str
    dagster_home: str
    context_path: Path
    context: TaskStepContext
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
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


def project_dagster_home(config: AgentEnvConfig) -> Path:
    """``DAGSTER_HOME`` if set, else the project's ``.dagster_home`` (created on first use)."""
    home = Path(os.environ.get("DAGSTER_HOME") or config.root / ".dagster_home")
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    if not settings.exists():  # no network here: opt out of telemetry, keep the defaults
        settings.write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def execute_plan(
    plan: TaskPlan,
    config: AgentEnvConfig,
    *,
    initial_context: dict[str, Any] | None = None,
    output_dir: Path | None = None,
    instance: dg.DagsterInstance | None = None,
    partition_key: str | None = None,
) -> RunResult:
    runs_dir = config.state_dir / "runs"
    job = build_job(plan)
    home = project_dagster_home(config) if instance is None else Path(instance.root_directory)
    config.state_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=config.state_dir, delete=False) as seed:
        json.dump(initial_context or {}, seed)
    resources = agentenv_resources(config, initial_context_path=seed.name)
    defs = dg.Definitions(
        jobs=[job], resources={**resources, IO_MANAGER_KEY: TaskContextIOManager(base_dir=str(runs_dir))},
    )
    try:
        with (dg.DagsterInstance.get() if instance is None else nullcontext(instance)) as active:
            result = defs.get_job_def(job.name).execute_in_process(
                instance=active, raise_on_error=False, partition_key=partition_key,
            )
    finally:
        os.unlink(seed.name)
    resources[RESOURCE_KEY].teardown(result.run_id)  # the safety net: the teardown op did it on success
    context = final_context(runs_dir, result.run_id)
    output_dir = output_dir or config.root / "out" / job.name
    output_dir.mkdir(parents=True, exist_ok=True)
    context_path = output_dir / "context.json"
    context_path.write_text(json.dumps(context.to_safe_dict(), indent=2, default=str))
    return RunResult(
        success=result.success, run_id=result.run_id, job_name=job.name, dagster_home=str(home),
        context_path=context_path, context=context,
    )

