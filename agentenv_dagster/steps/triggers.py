"""register_env_triggers and register_agent_triggers (``urn:agentenv:triggers/v1``), and
what a conversation does with them.

Env triggers live in the env: it watches its own tool calls, state and clock and runs the
actions, an ``nl`` action by prompting the *executor* agent over A2A, which then acts through
the env's MCP tools. Agent triggers live in an agent that advertises the extension (a
stakeholder or user simulator), and may wait on env triggers by ``env_id`` + ``trigger_id``:
between the turns of a multi-turn prompt_agent whose user is that agent, the run reads the
envs' trigger states and asks the agent to *decide* (:class:`AgentTriggerSession`) before
asking its brain.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterator

import httpx
from pydantic import field_validator

from ..context import DeployedAgent, DeployedEnv, TaskStepContext
from ..runtime.a2a_client import TRIGGERS_DECIDE_ENDPOINT, TRIGGERS_URI, A2AClient
from ..runtime.base import StepRuntime
from .agent_card import MCP_CONFIG, extension_request
from .base import AGENT, ENV, TaskStep
from .clock import gateway_url
from .conversation import DONE, UserEndpoint, UserTurn
from .registry import step

ROLE_HEADER = "AgentEnv-Role"
IN_FLIGHT = ("firing", "queued")  # env trigger statuses with fire work outstanding
SETTLE_SECONDS = 60  # how long a capture waits for in-flight env triggers
STATE_ATTEMPTS = 3


def _objects(value: Any) -> Any:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise ValueError("triggers must be a list of objects")
    return value


@step("register_env_triggers")
class RegisterEnvTriggersStep(TaskStep):
    """The executor must be deployed with a ``role`` outside ``watch_roles``: the env never
    watches the executor's own calls, so acting on a trigger cannot set off another."""

    reads = {"env_id": ENV, "executor_agent_name": AGENT}

    env_id: str
    triggers: list[dict[str, Any]]
    watch_roles: list[str] | None = None
    executor_agent_name: str | None = None
    executor_timeout_seconds: float = 120

    @field_validator("triggers", mode="before")
    @classmethod
    def _check_triggers(cls, value: Any) -> Any:
        return _objects(value)

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        deployed = ctx.find_env(self.env_id)
        if deployed is None:
            raise RuntimeError(f"Env '{self.env_id}' not found in context.deployed_envs")
        body: dict[str, Any] = {"triggers": self.triggers}
        if self.watch_roles is not None:
            body["watch_roles"] = self.watch_roles
        if self.executor_agent_name is not None:
            agent = self._executor(ctx)
            body["executor"] = {"a2a_url": agent.a2a_url or agent.api_url,
                                "timeout_seconds": self.executor_timeout_seconds, "role": agent.role}
            if token := rt.provider.server_auth.headers_for(agent.a2a_url or agent.api_url):
                body["executor"]["headers"] = token  # the env calls an agent of the run's own
            await _tag_env_calls(rt, agent, deployed)
        response = await rt.http.post(f"{gateway_url(deployed)}/triggers/register", json=body, timeout=30)
        if response.status_code >= 400:
            raise RuntimeError(f"trigger registration failed (HTTP {response.status_code}): {response.text}")
        result = response.json()
        rt.log.info("registered triggers on env=%s: %s", self.env_id, result)
        ctx.metadata_list("env_trigger_registrations").append({
            "step_id": self.id, "env_id": self.env_id, "added": result.get("added", []),
            "executor_agent_name": self.executor_agent_name,
        })

    def _executor(self, ctx: TaskStepContext) -> DeployedAgent:
        agent = ctx.find_agent(self.executor_agent_name)
        if agent is None:
            raise RuntimeError(f"Executor agent '{self.executor_agent_name}' not found in context.deployed_agents")
        if not agent.role:
            raise RuntimeError(
                f"Executor agent '{self.executor_agent_name}' was deployed without an explicit role; it would "
                "run under the default role and its own tool calls would fire triggers. Deploy it with a role "
                "outside watch_roles."
            )
        if self.watch_roles is not None and agent.role in self.watch_roles:
            raise RuntimeError(f"Executor agent role '{agent.role}' is in watch_roles {self.watch_roles} — "
                               "the executor's own tool calls would fire triggers (cascade).")
        return agent


async def _tag_env_calls(rt: StepRuntime, agent: DeployedAgent, env: DeployedEnv) -> None:
    """Have the executor send its role with every call to this env (re-registering the env's
    MCP server under the same name, with the ``AgentEnv-Role`` header), the local stand-in for
    a sandbox provider that stamps each agent's traffic with its role."""
    card = agent.a2a_card or {}
    request = extension_request(card, MCP_CONFIG, "add")
    if request is None or "headers" not in request.optional:
        rt.log.warning("executor '%s' takes no MCP headers; its calls to env '%s' run under the default role",
                       agent.agent_name, env.env_id)
        return
    body: dict[str, Any] = {"url": env.mcp_url,
                            "headers": {ROLE_HEADER: agent.role, **rt.provider.server_auth.headers_for(env.mcp_url)}}
    if "name" in request.optional:
        body["name"] = env.mcp_server_name or env.env_id
    await rt.a2a.post_extension(agent.a2a_url or agent.api_url, card, MCP_CONFIG, body)


@step("register_agent_triggers")
class RegisterAgentTriggersStep(TaskStep):
    """Conditions of type ``env_trigger`` (also nested under ``of``) must name a deployed env
    and a trigger a register_env_triggers step added there."""

    reads = {"agent_name": AGENT}

    agent_name: str
    triggers: list[dict[str, Any]]

    @field_validator("triggers", mode="before")
    @classmethod
    def _check_triggers(cls, value: Any) -> Any:
        return _objects(value)

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent '{self.agent_name}' not found in context.deployed_agents")
        endpoint = A2AClient.extension_endpoint(agent.a2a_card or {}, TRIGGERS_URI)
        if endpoint is None:
            raise RuntimeError(f"Agent '{self.agent_name}' does not advertise {TRIGGERS_URI}")
        deployed = {env.env_id for env in ctx.deployed_envs}
        registered: dict[str, set[str]] = {}
        for entry in ctx.metadata.get("env_trigger_registrations", []):
            registered.setdefault(entry["env_id"], set()).update(entry.get("added", []))
        for trigger in self.triggers:
            for env_id, trigger_id in _env_trigger_refs(trigger.get("when")):
                if env_id not in deployed:
                    raise RuntimeError(f"trigger '{trigger.get('id', '?')}' references env_trigger env_id "
                                       f"'{env_id}' not in context.deployed_envs {sorted(deployed)}")
                if trigger_id not in registered.get(env_id, set()):
                    raise RuntimeError(
                        f"trigger '{trigger.get('id', '?')}' references env_trigger '{trigger_id}' not registered "
                        f"on env '{env_id}' by a register_env_triggers step (registered there: "
                        f"{sorted(registered.get(env_id, set()))})"
                    )
        url = _join(agent.a2a_url or agent.api_url, endpoint)
        response = await rt.http.post(url, json={"triggers": self.triggers}, timeout=30)
        if response.status_code >= 400:
            raise RuntimeError(f"agent trigger registration failed (HTTP {response.status_code}): {response.text}")
        result = response.json()
        rt.log.info("registered agent triggers on agent=%s: %s", self.agent_name, result)
        ctx.metadata_list("agent_trigger_registrations").append({
            "step_id": self.id, "agent_name": self.agent_name, "added": result.get("added", []),
        })


def _env_trigger_refs(when: Any) -> Iterator[tuple[str, str]]:
    """(env_id, trigger_id) of every ``env_trigger`` condition in a possibly all/any-nested ``when``."""
    if not isinstance(when, dict):
        return
    if when.get("type") == "env_trigger":
        env_id, trigger_id = when.get("env_id"), when.get("trigger_id")
        if isinstance(env_id, str) and env_id and isinstance(trigger_id, str) and trigger_id:
            yield env_id, trigger_id
    for sub in when.get("of") or []:
        yield from _env_trigger_refs(sub)


@dataclass(frozen=True)
class AgentTriggerSession:
    """One conversation's stakeholder triggers: consulted before the user agent's brain."""

    step_id: str
    agent_name: str
    decide_url: str
    state_url: str
    timeout_seconds: float

    @classmethod
    def of(cls, ctx: TaskStepContext, step_id: str, user: UserEndpoint,
           timeout_seconds: float) -> "AgentTriggerSession | None":
        """Only a deployed user agent (not ``user_a2a_url``) that advertises the extension and
        was given triggers by a register_agent_triggers step is asked, as upstream."""
        card = user.card or {}
        endpoint = A2AClient.extension_endpoint(card, TRIGGERS_URI)
        registered = any(r.get("agent_name") == user.agent_name
                         for r in ctx.metadata.get("agent_trigger_registrations", []))
        if user.agent_name is None or endpoint is None or not registered:
            return None
        decide = _method_endpoint(card, "decide") or TRIGGERS_DECIDE_ENDPOINT
        return cls(step_id, user.agent_name, _join(user.url, decide), _join(user.url, endpoint), timeout_seconds)

    async def decide(self, ctx: TaskStepContext, rt: StepRuntime, turn: int, solver_message: str,
                     context_id: str) -> UserTurn | None:
        """The user's next turn when a trigger fired (or ended the conversation); None to
        fall through to the user agent's brain. Both what the envs reported and what fired
        are recorded per turn (``env_trigger_snapshots``, ``agent_trigger_firings``)."""
        envs = await read_env_triggers(ctx, rt)
        ctx.metadata_map("env_trigger_snapshots").setdefault(self.step_id, []).append({"turn": turn, "envs": envs})
        body = {"turn": turn, "solver_message": solver_message, "context_id": context_id, "env_triggers": envs}
        response = await rt.http.post(self.decide_url, json=body, timeout=self.timeout_seconds)
        if response.status_code >= 400:
            raise RuntimeError(f"agent-trigger /decide failed (HTTP {response.status_code}): {response.text}")
        decision = response.json()
        fired = list(decision.get("fired") or [])
        ctx.metadata_map("agent_trigger_firings").setdefault(self.step_id, []).append({"turn": turn, "fired": fired})
        rt.log.info("turn %d agent-trigger decide on %s: fired=%s done=%s", turn, self.agent_name, fired,
                    decision.get("done"))
        text = "\n".join(p["text"] for p in decision.get("parts") or [] if isinstance(p.get("text"), str))
        record = {"agent_triggers_fired": fired}
        if decision.get("done"):
            return UserTurn(text or None, record, stop_reason=DONE)
        return UserTurn(text, record) if fired and text else None

    async def record_state(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        """The agent's firing log into ``agent_trigger_state`` — provenance only, never fatal."""
        try:
            response = await rt.http.get(self.state_url, timeout=15)
            response.raise_for_status()
            ctx.metadata_map("agent_trigger_state")[self.step_id] = response.json().get("firing_log", [])
        except Exception as exc:
            rt.log.warning("agent-trigger state readback from %s failed (continuing): %s", self.agent_name, exc)


async def read_env_triggers(ctx: TaskStepContext, rt: StepRuntime) -> dict[str, dict[str, Any]]:
    """``{env_id: {trigger_id: status}}`` for every deployed env; ``{}`` for an env no
    register_env_triggers step registered on. Fail-closed: an unreadable state raises, since
    deciding on a guess would fire (or withhold) a stakeholder's reaction wrongly."""
    registered = _registered_env_ids(ctx)
    envs: dict[str, dict[str, Any]] = {}
    for env in ctx.deployed_envs:
        if env.env_id not in registered:
            envs[env.env_id] = {}
            continue
        try:
            state = await _trigger_state(rt, env)
        except (httpx.HTTPError, ValueError) as exc:
            raise RuntimeError(f"fail-closed: could not read /triggers/state for env '{env.env_id}': {exc}") from exc
        envs[env.env_id] = {t["id"]: t.get("status") for t in state.get("triggers", [])}
    return envs


async def capture_env_trigger_state(ctx: TaskStepContext, rt: StepRuntime, step_id: str) -> None:
    """After a prompt, each trigger-registered env's settled trigger state: the whole state
    (and clock) to the object store, a summary to ``env_trigger_state[env_id]``. Never raises."""
    registered = _registered_env_ids(ctx)
    for env in ctx.deployed_envs:
        if env.env_id not in registered:
            continue
        entry: dict[str, Any] = {"captured_at_utc": _now(), "capture_step_id": step_id}
        try:
            state = await _settled_trigger_state(rt, env)
            clock = await _clock_state(rt, env)
            triggers = state.get("triggers", [])
            dropped = state.get("events_dropped") or 0
            entry.update(
                statuses={t["id"]: t.get("status") for t in triggers},
                triggers={t["id"]: {k: t.get(k) for k in ("type", "status", "fire_count", "next_mark", "failure_count",
                                                          "last_failure_at")} for t in triggers},
                event_count=len(state.get("events", [])) + dropped, events_dropped=dropped,
                capture_is_final=not any(_in_flight(t) or (t.get("type") == "time" and t.get("status") == "armed")
                                         for t in triggers),
            )
            payload = {"instance_id": ctx.instance_id, "env_id": env.env_id, "gateway_url": gateway_url(env),
                       "capture_source": "prompt_agent", "captured_at_utc": entry["captured_at_utc"],
                       "clock": clock, "capture_is_final": entry["capture_is_final"], "state": state}
            key = (f"env_trigger_state/instance_id={ctx.instance_id or 'adhoc-' + uuid.uuid4().hex[:12]}/"
                   f"{env.env_id}-{uuid.uuid4().hex[:8]}.json")
            entry["object_url"] = rt.objects.put(key, json.dumps(payload, indent=2, default=str).encode())
        except Exception as exc:
            rt.log.warning("env trigger state capture failed for env '%s' (continuing): %s", env.env_id, exc)
            entry["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        ctx.metadata_map("env_trigger_state")[env.env_id] = entry


def _registered_env_ids(ctx: TaskStepContext) -> set[str]:
    return {r["env_id"] for r in ctx.metadata.get("env_trigger_registrations") or []
            if isinstance(r, dict) and r.get("env_id")}


async def _trigger_state(rt: StepRuntime, env: DeployedEnv) -> dict[str, Any]:
    """``GET /triggers/state``, tried a few times (an env busy firing may be slow to answer)."""
    error: Exception = RuntimeError("no attempt made")
    for attempt in range(STATE_ATTEMPTS):
        if attempt:
            await asyncio.sleep(0.5 * attempt)
        try:
            response = await rt.http.get(f"{gateway_url(env)}/triggers/state", timeout=15)
            response.raise_for_status()
            return response.json()
        except (httpx.HTTPError, ValueError) as exc:
            error = exc
    raise error


def _in_flight(trigger: dict[str, Any]) -> bool:
    return trigger.get("status") in IN_FLIGHT or bool(trigger.get("pending"))


async def _settled_trigger_state(rt: StepRuntime, env: DeployedEnv) -> dict[str, Any]:
    """The trigger state, re-read while a trigger is still firing — except a time trigger
    recurring without end, which never settles."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        state = await _trigger_state(rt, env)
        settling = any(_in_flight(t) and not _recurs_forever(t.get("when") or {}) for t in state.get("triggers", []))
        if not settling or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.25)


def _recurs_forever(when: dict[str, Any]) -> bool:
    return when.get("type") == "time" and "every" in when and "count" not in when and "until" not in when


async def _clock_state(rt: StepRuntime, env: DeployedEnv) -> dict[str, Any] | None:
    try:
        response = await rt.http.get(f"{gateway_url(env)}/clock/state", timeout=5)
        response.raise_for_status()
        return response.json()
    except Exception as exc:
        rt.log.warning("clock state capture failed for env '%s' (continuing): %s", env.env_id, exc)
        return None


def _method_endpoint(card: dict[str, Any], method: str) -> str | None:
    for ext in (card.get("capabilities") or {}).get("extensions") or []:
        if ext.get("uri") == TRIGGERS_URI:
            params = ext.get("params") or ext.get("config") or {}
            return ((params.get("methods") or {}).get(method) or {}).get("endpoint")
    return None


def _join(base: str, endpoint: str) -> str:
    return endpoint if endpoint.startswith(("http://", "https://")) else f"{base.rstrip('/')}{endpoint}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()
