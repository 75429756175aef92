"""sync_env_clock: arm a deployed env's virtual clock, then sync its servers to it.

As upstream: ``PUT {gateway}/clock/set-time``, ``GET {gateway}/clock/state`` for the
``env_get_time_url``, then ``sync_time`` (``urn:agentenv:clock/v1``) on each server that
advertises it. An embedded env is its own gateway and its own one server, so both calls go to
its base URL. Place it right before the steps whose tool calls should see the virtual time.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import Field, field_validator

from ..context import DeployedEnv, TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.dataplane import CARD_PATH, env_base_url
from .base import ENV, TaskStep
from .registry import step

CLOCK_URI = "urn:agentenv:clock/v1"
MAX_RATE = 86400.0  # 1 real second = 1 virtual day


@step("sync_env_clock")
class SyncEnvClockStep(TaskStep):
    """``virtual_seconds_per_real_second`` is the clock's speed: 1.0 real time, 0 frozen,
    86400 at most (1 real s = 1 virtual day)."""

    reads = {"env_id": ENV}

    env_id: str
    virtual_time: str
    virtual_seconds_per_real_second: float = Field(default=1.0, ge=0, le=MAX_RATE)
    tolerate_missing_sync_time: bool = True
    timeout_seconds: int = 30

    @field_validator("virtual_time", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if not isinstance(value, str):
            raise ValueError("virtual_time must be an RFC3339 string")
        return value

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        deployed = ctx.find_env(self.env_id)
        if deployed is None:
            raise RuntimeError(f"Env '{self.env_id}' not found in context.deployed_envs")
        gateway = gateway_url(deployed)
        armed = await rt.http.put(
            f"{gateway}/clock/set-time", timeout=self.timeout_seconds,
            json={"virtual_time": self.virtual_time,
                  "virtual_seconds_per_real_second": self.virtual_seconds_per_real_second},
        )
        if armed.status_code >= 400:
            raise RuntimeError(f"clock arm failed (HTTP {armed.status_code}): {armed.text}")
        state = (await rt.http.get(f"{gateway}/clock/state", timeout=self.timeout_seconds)).json()
        env_get_time_url = state.get("env_get_time_url")

        synced, skipped = [], []
        service = deployed.mcp_server_name or self.env_id
        outcome = await self._sync_one(rt, gateway, service, env_get_time_url)
        (synced if outcome.get("synced") else skipped).append({"service": service, "environment": service, **outcome})

        ctx.metadata_list("clock_configurations").append({
            "step_id": self.id, "env_id": self.env_id, "virtual_time": self.virtual_time,
            "virtual_seconds_per_real_second": self.virtual_seconds_per_real_second,
            "env_get_time_url": env_get_time_url, "synced": synced, "skipped": skipped,
        })
        rt.log.info("sync_env_clock env=%s: armed rate=%s; synced=%s skipped=%s", self.env_id,
                    self.virtual_seconds_per_real_second, [s["service"] for s in synced],
                    [s["service"] for s in skipped])
        if not synced:
            rt.log.warning("sync_env_clock env=%s: clock armed but NO server synced (%s) — every tool still "
                           "answers wall time", self.env_id, [(s["service"], s.get("reason")) for s in skipped])

    async def _sync_one(self, rt: StepRuntime, base_url: str, service: str, env_get_time_url: str | None) -> dict:
        """``sync_time`` on one server if its card advertises clock/v1; skipped (or raised) per
        ``tolerate_missing_sync_time`` otherwise."""
        try:
            response = await rt.http.get(f"{base_url}{CARD_PATH}", timeout=self.timeout_seconds)
            response.raise_for_status()
            card = response.json()
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404 and self.tolerate_missing_sync_time:
                return {"synced": False, "reason": "no_env_card"}
            raise
        method = _extension_method(card, CLOCK_URI, "sync_time")
        if method is None:
            if self.tolerate_missing_sync_time:
                rt.log.info("sync_env_clock: %s does not advertise %s; skipping", service, CLOCK_URI)
                return {"synced": False, "reason": "not_advertised"}
            raise RuntimeError(f"{service} does not advertise {CLOCK_URI}")
        if not env_get_time_url:
            raise RuntimeError(f"gateway did not expose env_get_time_url; cannot sync {service}")
        response = await rt.http.request(
            method["method"], f"{base_url}{method['endpoint']}", timeout=self.timeout_seconds,
            json={"env_get_time_url": env_get_time_url},
        )
        response.raise_for_status()
        return {"synced": True, "result": response.json()}


def gateway_url(env: DeployedEnv) -> str:
    """Where an env's control surface (clock, triggers) is: its gateway, else its base URL."""
    gateway = (env.model_extra or {}).get("gateway_url")
    if gateway:
        return gateway.rstrip("/")
    if not env.mcp_url:
        raise RuntimeError(f"Deployed env '{env.env_id}' has no URL to reach it at")
    return env_base_url(env.mcp_url)


def _extension_method(card: dict, uri: str, name: str) -> dict[str, str] | None:
    """The HTTP verb and endpoint of one method of a card extension (the method's own endpoint,
    else the extension's; POST unless advertised); None when the card lacks it."""
    for ext in (card.get("capabilities") or {}).get("extensions") or []:
        if ext.get("uri") != uri:
            continue
        params = ext.get("params") or {}
        entry = (params.get("methods") or {}).get(name)
        endpoint = (entry or {}).get("endpoint") or params.get("endpoint")
        if entry is None or not endpoint:
            return None
        return {"method": (entry.get("method") or "POST").upper(), "endpoint": endpoint}
    return None
