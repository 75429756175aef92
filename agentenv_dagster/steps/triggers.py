"""register_env_triggers and register_agent_triggers (``urn:agentenv:triggers/v1``).

Env triggers live in the env: it watches its own tool calls, state and clock and runs the
actions, an ``nl`` action by prompting the *executor* agent over A2A, which then acts through
the env's MCP tools. Agent triggers live in an agent that advertises the extension (a
stakeholder or user simulator), and may wait on env triggers by ``env_id`` + ``trigger_id``.
"""

from __future__ import annotations

from typing import Any, Iterator

from pydantic import field_validator

from ..context import DeployedAgent, DeployedEnv, TaskStepContext
from ..runtime.base import StepRuntime
from .agent_card import MCP_CONFIG, extension_request
from .base import AGENT, ENV, TaskStep
from .clock import gateway_url
from .registry import step

TRIGGERS_URI = "urn:agentenv:triggers/v1"
DEFAULT_TRIGGERS_ENDPOINT = "/ext/triggers"
ROLE_HEADER = "AgentEnv-Role"


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
    body: dict[str, Any] = {"url": env.mcp_url, "headers": {ROLE_HEADER: agent.role}}
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
        endpoint = _triggers_endpoint(agent.a2a_card or {})
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
        base = (agent.a2a_url or agent.api_url).rstrip("/")
        url = endpoint if endpoint.startswith(("http://", "https://")) else f"{base}{endpoint}"
        response = await rt.http.post(url, json={"triggers": self.triggers}, timeout=30)
        if response.status_code >= 400:
            raise RuntimeError(f"agent trigger registration failed (HTTP {response.status_code}): {response.text}")
        result = response.json()
        rt.log.info("registered agent triggers on agent=%s: %s", self.agent_name, result)
        ctx.metadata_list("agent_trigger_registrations").append({
            "step_id": self.id, "agent_name": self.agent_name, "added": result.get("added", []),
        })


def _triggers_endpoint(card: dict[str, Any]) -> str | None:
    for ext in (card.get("capabilities") or {}).get("extensions") or []:
        if ext.get("uri") == TRIGGERS_URI:
            params = ext.get("params") or ext.get("config") or {}
            return params.get("endpoint") or DEFAULT_TRIGGERS_ENDPOINT
    return None


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
