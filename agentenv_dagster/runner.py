"""The plain asyncio walker: agent-env's way of running a task, without Dagster.

One shared context, every ready step launched at once on one event loop, a fatal failure
stops launches and lets in-flight steps finish. It is the baseline ``bench/overhead.py``
measures the Dagster runs against, and it runs the same step code.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from .config import AgentEnvConfig
from .context import TaskStepContext
from .plan import TaskPlan
from .runtime.base import RunInfo, StepRuntime
from .steps.execution import default_seed, run_step


async def run_plan(
    plan: TaskPlan, config: AgentEnvConfig, *, context: TaskStepContext | None = None,
    run_id: str | None = None, teardown: bool = True,
) -> TaskStepContext:
    run_id = run_id or uuid.uuid4().hex
    ctx = context or TaskStepContext()
    ctx.instance_id = ctx.instance_id or f"{plan.task_id}-{run_id[:8]}"
    ctx.metadata.setdefault("run_group_id", run_id)
    ctx.metadata.setdefault("task_id", plan.task_id)
    default_seed(ctx, plan.document.seed)
    run = RunInfo(run_id=run_id, task_id=plan.task_id, run_dir=run_dir(config, run_id))
    done: set[str] = set()
    running: dict[asyncio.Task, str] = {}
    first_error: BaseException | None = None
    async with StepRuntime(config, run) as rt:
        try:
            while True:
                if first_error is None:
                    for step in plan.steps:
                        if step.id in done or step.id in running.values():
                            continue
                        if all(dep in done for dep in plan.edges[step.id]):
                            running[asyncio.create_task(run_step(step, ctx, rt))] = step.id
                if not running:
                    break
                finished, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    step_id = running.pop(task)
                    error = task.exception()
                    if error is None:
                        done.add(step_id)
                    elif first_error is None:
                        first_error = error
        finally:
            if teardown:
                rt.provider.teardown()
    if first_error is not None:
        raise first_error
    return ctx


def run_dir(config: AgentEnvConfig, run_id: str) -> Path:
    return config.state_dir / "runs" / run_id
