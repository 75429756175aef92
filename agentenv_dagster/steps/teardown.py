"""teardown_sandboxes: best-effort stop of named deployments in the middle of a run."""

from __future__ import annotations

import asyncio

from pydantic import model_validator

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from .base import AGENT, ENV, SANDBOX, TaskStep
from .registry import step


@step("teardown_sandboxes")
class TeardownSandboxesStep(TaskStep):
    reads = {"agent_names": AGENT, "env_ids": ENV, "sandbox_names": SANDBOX}

    fail_task_on_error: bool = False
    agent_names: list[str] = []
    env_ids: list[str] = []
    sandbox_names: list[str] = []

    @model_validator(mode="after")
    def _check(self) -> "TeardownSandboxesStep":
        if not (self.agent_names or self.env_ids or self.sandbox_names):
            raise ValueError("teardown_sandboxes needs at least one of agent_names, env_ids, sandbox_names")
        if self.fail_task_on_error:
            raise ValueError(
                "teardown_sandboxes is best-effort (a failed terminate is logged, never raised); "
                "fail_task_on_error must be false"
            )
        return self

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        instance_ids = [
            *(a.instance_id for a in ctx.deployed_agents if a.agent_name in self.agent_names),
            *(e.instance_id for e in ctx.deployed_envs if e.env_id in self.env_ids),
            *(s.instance_id for s in ctx.deployed_sandboxes if s.sandbox_name in self.sandbox_names),
            # containers run on a named sandbox end with it, as they would inside its VM upstream
            *(c.get("instance_id") for c in ctx.metadata.get("deployed_docker_containers") or []
              if c.get("sandbox_name") in self.sandbox_names),
        ]
        done = ctx.metadata_list("torn_down_sandbox_ids")
        for instance_id in instance_ids:
            if not instance_id or instance_id in done:
                continue
            try:
                await asyncio.to_thread(rt.provider.terminate, instance_id)
            except Exception as exc:  # best-effort by contract
                rt.log.warning("teardown of %s failed: %s", instance_id, exc)
                continue
            done.append(instance_id)
