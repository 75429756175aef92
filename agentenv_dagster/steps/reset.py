"""reset_env: return a deployed env to a clean state through its data plane (``data/reset``).

Meant for warm reuse (one env, several tasks): placed before prompt_agent, it clears what an
earlier task left. Best-effort by default, as upstream.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import model_validator

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.dataplane import env_base_url
from .base import ENV, TaskStep
from .registry import step

RESET = "data/reset"


@step("reset_env")
class ResetEnvStep(TaskStep):
    """A missing env or one whose card does not offer ``data/reset`` is skipped; a failed
    reset is logged and swallowed unless ``fail_task_on_error`` is set."""

    reads = {"env_id": ENV}

    fail_task_on_error: bool = False
    env_id: str

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("env_id"):
            raise ValueError("reset_env step requires 'env_id'")
        return data

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        deployed = ctx.find_env(self.env_id)
        if deployed is None:
            rt.log.warning("reset_env: no deployed env '%s' in context; skipping", self.env_id)
            return
        try:
            base_url = env_base_url(deployed.mcp_url) if deployed.mcp_url else None
            if base_url is None or not await _offers_reset(rt, base_url):
                rt.log.info("reset_env: env '%s' does not support reset; skipping", self.env_id)
                return
            await rt.dataplane.reset(base_url)
            rt.log.info("reset_env: reset env '%s'", self.env_id)
        except Exception as exc:
            rt.log.warning("reset_env: reset failed (%s); continuing", repr(exc)[:160])
            if self.fail_task_on_error:
                raise


async def _offers_reset(rt: StepRuntime, base_url: str) -> bool:
    """False only when the env card lists its operations without ``data/reset`` (or the env
    serves no card); an unreachable env is an error, left to the reset call to report."""
    try:
        card = await rt.dataplane.card(base_url)
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code != 404
    except (httpx.HTTPError, ValueError):
        return True
    capabilities = card.get("capabilities") if isinstance(card, dict) else None
    operations = capabilities.get("operations") if isinstance(capabilities, dict) else None
    return not isinstance(operations, list) or RESET in operations
