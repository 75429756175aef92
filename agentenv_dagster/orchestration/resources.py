"""AgentEnvResource: the Dagster face of the runtime (config, runs, teardown).

It holds settings only; each op builds a plain :class:`StepRuntime` from it, so the step
code never sees Dagster.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import dagster as dg

from ..compiler import step_registry
from ..config import AgentEnvConfig, load_config
from ..context import TaskStepContext
from ..runtime.base import RunInfo, StepRuntime
from ..runtime.local import Ledger
from ..steps.base import TaskStep
from ..steps.execution import StepOutcome, run_step


class AgentEnvResource(dg.ConfigurableResource):
    """``project_dir`` holds ``.agentenv/config.toml``; ``initial_context_path`` seeds a
    re-run (``task run --context``) with a saved context."""

    project_dir: str
    initial_context_path: str | None = None

    def load_config(self) -> AgentEnvConfig:
        return load_config(Path(self.project_dir))

    @property
    def runs_dir(self) -> Path:
        return self.load_config().state_dir / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def parse_step(self, step_type: str, fields: dict) -> TaskStep:
        cls = step_registry(self.load_config()).get(step_type)
        if cls is None:
            raise dg.Failure(f"Unknown task step type: {step_type}")
        return cls.model_validate(fields)

    def initial_context(self, run_id: str, task_id: str) -> TaskStepContext:
        data = json.loads(Path(self.initial_context_path).read_text()) if self.initial_context_path else {}
        ctx = TaskStepContext.from_dict(data)
        ctx.instance_id = ctx.instance_id or f"{task_id}-{run_id[:8]}"
        ctx.metadata.setdefault("run_group_id", run_id)
        ctx.metadata.setdefault("task_id", task_id)
        return ctx

    def execute(self, step: TaskStep, ctx: TaskStepContext, run_id: str, task_id: str,
                logger: logging.Logger) -> StepOutcome:
        """Run one step on its own event loop (the op owns the loop)."""
        config = self.load_config()
        run = RunInfo(run_id=run_id, task_id=task_id, run_dir=self.run_dir(run_id))

        async def go() -> StepOutcome:
            async with StepRuntime(config, run, logger) as rt:
                return await run_step(step, ctx, rt)

        return asyncio.run(go())

    def teardown(self, run_id: str) -> list[str]:
        """End everything the run deployed; later deployments of the run are refused."""
        return Ledger.of_run(self.run_dir(run_id)).close()
