"""deploy_env and deploy_agent: start an env instance, start an agent wired to it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from ..config import AgentEnvConfig
from ..context import DeployedEnv, TaskStepContext
from ..ids import ArtifactId
from ..runtime.base import StepRuntime
from ..runtime.dataplane import env_base_url
from ..runtime.shell import passed_through
from .agent_card import MCP_CONFIG, SKILL_CONFIG, AGENT_CONFIG, extension_request
from .base import AGENT, DEFAULT_AGENT_NAME, DEFAULT_TTL_SECONDS, ENV, SANDBOX, TaskStep
from .execution import user_override
from .registry import step
from .sandbox import deployed_sandbox, sandbox_passthrough


@step("deploy_env")
class DeployEnvStep(TaskStep):
    writes = {"env_id": ENV}

    # the env to deploy: an id of the env registry (`email`, `item-store`, or
    # `[envs.registry.<id>]`)
    env_id: str
    # the env version; unset: the latest
    env_version: str | int | None = None
    # an artifact the env starts with, when the env accepts one
    artifact_id: ArtifactId | None = None
    # that artifact's version; unset: the latest
    artifact_version: int | None = None
    # the env ends by itself after this many seconds (the last line of defence)
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    # the env's disk, for providers that size one
    disk_size_gb: int = 10
    # `consistent` serialises the env's tool calls
    gateway_mode: Literal["performance", "consistent"] = "performance"
    # CPUs, for providers that size the env
    cpu: float | None = None
    # memory, for providers that size the env
    memory_mb: int | None = None
    # the provider's sandbox kind, when it has several
    sandbox_type: str | None = None
    # the provider's env state kind
    env_state_type: str | None = None
    # a saved env state to start from
    env_state_instance_id: str | None = None
    # the provider's scheduling priority
    priority: int | None = None
    # free-form metadata recorded with the deployment
    metadata: dict[str, Any] = {}

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        if ctx.find_env(self.env_id):
            raise RuntimeError(f"Env '{self.env_id}' is already deployed")
        ttl = user_override(ctx, "ttl_seconds") or self.ttl_seconds
        env = await asyncio.to_thread(
            rt.provider.deploy_env, self.env_id, step_id=self.id, ttl_seconds=ttl
        )
        try:
            card = await rt.dataplane.card(env_base_url(env.mcp_url))
            env.mcp_server_name = card.get("name")
        except Exception as exc:  # an env without a card still serves MCP
            rt.log.warning("env '%s' serves no env card: %s", self.env_id, exc)
        ctx.deployed_envs.append(env)


@step("deploy_agent")
class DeployAgentStep(TaskStep):
    reads = {"env_ids": ENV, "sandbox_name": SANDBOX}
    writes = {"agent_name": AGENT}

    # the envs whose MCP servers the agent gets
    env_ids: list[str] = []
    # which deployment of an env, when it was deployed more than once
    env_step_id: str | None = None
    # the agent to deploy: an id of the agent registry; unset: `[agents] default_a2a_agent_id`
    a2a_agent_id: str | None = None
    # the agent version
    a2a_agent_version: int | None = None
    # the name later steps use for this agent (`prompt_agent`'s `agent_name`)
    agent_name: str = DEFAULT_AGENT_NAME
    # the agent card's description
    agent_description: str | None = None
    # variables set in the agent's environment
    env_vars: dict[str, str] = {}
    # skills installed into the agent
    skills: list[dict[str, Any]] = []
    # the agent's system prompt
    system_prompt: str | None = None
    # the agent's disk, for providers that size one
    disk_size_gb: int | None = None
    # a LiteLLM proxy the agent's model calls go through
    litellm_base_url: str | None = None
    # the provider's sandbox kind
    sandbox_type: str | None = None
    # the agent ends by itself after this many seconds
    ttl_seconds: int | None = None
    # CPUs, for providers that size the agent
    cpu: float | None = None
    # memory, for providers that size the agent
    memory_mb: int | None = None
    # the provider's scheduling priority
    priority: int | None = None
    # the provider's network policy for the agent
    network_policy: str | dict[str, Any] | None = None
    # the agent's role in a multi-agent task
    role: str | None = None
    # a deployed sandbox the agent works in
    sandbox_name: str | None = None
    # give the agent a Docker engine, where the provider can
    enable_docker: bool = False
    # free-form metadata recorded with the deployment
    metadata: dict[str, Any] = {}
    agent_config: dict[str, Any] = {}  # ours: inline settings over the registry entry (Coder Eval `agent:`)

    def _agent_id(self, config: AgentEnvConfig) -> str:
        return self.a2a_agent_id or config.agents.default_a2a_agent_id

    def _ttl(self) -> int:
        return self.ttl_seconds or DEFAULT_TTL_SECONDS

    async def warm_up(self, rt: StepRuntime) -> None:
        """The agent host, started as the op starts, unless a row's values could change which
        host it is (a ``<token>`` or ``${...}`` in the agent's settings)."""
        settings = (self.a2a_agent_id, self.env_vars, self.agent_config)
        if "${" in json.dumps(settings, default=str) or "<" in json.dumps(settings, default=str):
            return
        await rt.provider.warm_agent_host(self._agent_id(rt.config), ttl_seconds=self._ttl(),
                                          env_vars=self.env_vars, overrides=self.agent_config)

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        envs = [self._resolve_env(ctx, env_id) for env_id in self.env_ids]
        if ctx.find_agent(self.agent_name):
            raise RuntimeError(f"Agent with name '{self.agent_name}' is already deployed")
        agent_id = user_override(ctx, "a2a_agent_id") or self._agent_id(rt.config)
        ttl = user_override(ctx, "ttl_seconds") or self._ttl()
        workspace = deployed_sandbox(ctx, rt, self.sandbox_name).root if self.sandbox_name else None
        container = (ctx.find_sandbox(self.sandbox_name).model_extra or {}).get("container") if workspace else None
        # what the agent's tools see of the environment: the step's variables, and on this machine
        # (not in the sandbox's container) the variables the sandbox passes through
        passed = passed_through(sandbox_passthrough(ctx, self.sandbox_name)) if workspace and not container else {}
        tools_env = {**passed, **self.env_vars} if workspace else None
        agent = await rt.provider.deploy_agent_async(
            agent_id, agent_name=self.agent_name, ttl_seconds=ttl, env_vars=self.env_vars, workspace=workspace,
            container=container, overrides=self.agent_config, tools_env=tools_env,
        )
        try:
            card = agent.a2a_card or await rt.a2a.get_card(agent.a2a_url)
            await self._configure(rt, agent.a2a_url, card, envs)
        except BaseException:
            rt.provider.terminate(agent.instance_id)
            raise
        agent.a2a_card = card
        agent.role = self.role
        if not ctx.default_agent_model:
            ctx.default_agent_model = rt.config.model.for_role("agent")
        ctx.deployed_agents.append(agent)

    def _resolve_env(self, ctx: TaskStepContext, env_id: str) -> DeployedEnv:
        candidates = [e for e in ctx.deployed_envs if e.env_id == env_id]
        if self.env_step_id is not None:
            matching = [e for e in candidates if e.metadata.get("deploy_step_id") == self.env_step_id]
            if not matching:
                raise RuntimeError(
                    f"deploy_agent '{self.id}': env_step_id '{self.env_step_id}' names no deployment "
                    f"of env '{env_id}'"
                )
            candidates = matching
        if not candidates:
            raise RuntimeError(
                f"Env '{env_id}' is not in context.deployed_envs; add a DeployEnvTaskStep for it, "
                "or reference an env that exposes a live http(s) 'mcp_url'."
            )
        if len(candidates) > 1:
            raise RuntimeError(
                f"deploy_agent '{self.id}': {len(candidates)} deployments of env '{env_id}' in the "
                "context. Set env_step_id to the deploy_env step that should be used."
            )
        return candidates[0]

    async def _configure(self, rt: StepRuntime, url: str, card: dict, envs: list[DeployedEnv]) -> None:
        """MCP servers first (the agent gains its tools; an env of the run's own with the run's
        token to call it with), then skills, system prompt, identity."""
        mcp = extension_request(card, MCP_CONFIG, "add")
        for env in envs:
            body: dict[str, Any] = {"url": env.mcp_url}
            if mcp is not None and "name" in mcp.optional:
                body["name"] = env.mcp_server_name or env.env_id
            token = rt.provider.server_auth.headers_for(env.mcp_url)
            if token and mcp is not None and "headers" in mcp.optional:
                body["headers"] = token
            await rt.a2a.post_extension(url, card, MCP_CONFIG, body)
        if self.skills and extension_request(card, SKILL_CONFIG, "add") is not None:
            for skill in self.skills:
                await rt.a2a.post_extension(url, card, SKILL_CONFIG, _skill_body(skill))
        config = extension_request(card, AGENT_CONFIG, "set")
        wanted = {
            "system_prompt": self.system_prompt, "name": self.agent_name,
            "description": self.agent_description, "role": self.role,
        }
        body = {k: v for k, v in wanted.items() if v is not None and config and k in config.supported}
        if self.system_prompt and "system_prompt" not in body:
            rt.log.warning("agent does not accept system_prompt through agent-config; skipped")
        if any(card.get(k) != v for k, v in body.items()):  # an identity the card already shows is set
            await rt.a2a.post_extension(url, card, AGENT_CONFIG, body)


def _skill_body(skill: dict[str, Any]) -> dict[str, Any]:
    body = {"name": skill.get("name"), "description": skill.get("description")}
    content = skill.get("skill_md") or skill.get("content")
    if content:
        body["skill_md"] = content
    else:
        body["skill_s3_url"] = skill.get("skill_s3_url") or skill.get("s3_uri")
    return {k: v for k, v in body.items() if v is not None}
