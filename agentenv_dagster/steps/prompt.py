"""prompt_agent: send a prompt to a deployed agent over A2A and record its PromptResponse."""

from __future__ import annotations

import json
from typing import Any

from pydantic import model_validator

from ..context import PromptResponse, TaskStepContext
from ..runtime.base import StepRuntime
from .agent_card import AGENT_CONFIG, TRAJECTORY, extension_request
from .base import AGENT, DEFAULT_AGENT_NAME, PROMPT, TaskStep
from .execution import parse_structured_output, user_override
from .registry import step

RESERVED_MODEL_PARAMS = {
    "model", "messages", "api_key", "api_base", "user", "metadata", "timeout", "response_format",
}


@step("prompt_agent")
class PromptAgentStep(TaskStep):
    reads = {"agent_name": AGENT}
    writes = {"prompt_key": PROMPT}

    prompt: str | None = None
    parts: list[dict[str, Any]] | None = None
    prompt_id: str | None = None
    agent_name: str = DEFAULT_AGENT_NAME
    timeout_seconds: float = 600
    poll_interval_seconds: float = 2
    trajectory_output_prefix: str | None = None
    model: str | None = None
    model_params: dict[str, Any] | None = None
    system_prompt: str | None = None
    max_turns: int | None = None
    output_format: Any = None
    max_thinking_tokens: int | None = None
    effort: str | None = None
    harness: str | None = None
    agentenv_tools: list[Any] | None = None
    context_id: str | None = None
    max_conversation_turns: int = 1
    user_agent_name: str = "human_agent"
    user_a2a_url: str | None = None
    user_output_format: Any = None
    user_model: str | None = None
    user_agent_timeout_seconds: float = 600
    snapshot_config: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "PromptAgentStep":
        if self.prompt is None and self.parts is None:
            raise ValueError("PromptAgentTaskStep requires either `prompt` or `parts`")
        if self.prompt is not None and self.parts is not None:
            raise ValueError("PromptAgentTaskStep accepts `prompt` OR `parts`, not both")
        if self.parts is not None:
            for i, part in enumerate(self.parts):
                if not isinstance(part, dict):
                    raise ValueError(f"parts[{i}] must be a dict, got {type(part).__name__}")
        if self.max_conversation_turns < 1:
            raise ValueError("max_conversation_turns must be >= 1")
        reserved = sorted(RESERVED_MODEL_PARAMS & set(self.model_params or {}))
        if reserved:
            raise ValueError(f"model_params may not set reserved keys: {reserved}")
        return self

    @property
    def prompt_key(self) -> str:
        """The prompt_id verifiers join on; the step id when the author set none."""
        return self.prompt_id or self.id

    def prompt_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(p.get("text", "") for p in self.parts or [] if "text" in p)

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
        if self.max_conversation_turns > 1:
            raise RuntimeError("multi-turn conversations (max_conversation_turns > 1) are not supported yet")
        url = agent.a2a_url or agent.api_url
        card = agent.a2a_card or await rt.a2a.get_card(url)
        model = ctx.agent_model or self.model or ctx.default_agent_model
        await self._configure(rt, ctx, url, card, model)

        reply = await rt.a2a.send_and_wait(
            url, self.prompt_text(), timeout_seconds=self.timeout_seconds,
            poll_interval=min(self.poll_interval_seconds, 0.25), context_id=self.context_id,
        )
        trajectory_url = await self._store_trajectory(rt, url, card, reply.task_id)
        data = reply.data or {}
        usage = data.get("usage") or {}
        response = PromptResponse(
            prompt_id=self.prompt_key,
            response=reply.text or "",
            prompt_text=self.prompt,
            agent_trajectory_object_url=trajectory_url,
            tool_call_count=data.get("tool_call_count", usage.get("tool_call_count")),
            model=data.get("model") or model,
            error_type=data.get("error_type") or (None if reply.state == "completed" else reply.state),
            error_code=data.get("error_code"),
            error_message=data.get("error_message"),
            agent_session_id=reply.task_id or "",
            a2a_context_id=reply.context_id,
            agent_name=self.agent_name,
            step_id=self.id,
            structured_output=data.get("structured_output") or parse_structured_output(reply.text),
            usage=usage or None,
        )
        ctx.prompt_responses.append(response)
        ctx.metadata_map("a2a_conversations")[self.id] = reply.context_id
        if reply.state != "completed":
            details = ", ".join(
                f"{k}={v}" for k, v in (
                    ("error_type", response.error_type), ("error_code", response.error_code),
                    ("task_id", reply.task_id), ("agent_sandbox", agent.sandbox_id),
                ) if v
            )
            raise RuntimeError(f"A2A task failed ({details}): {response.error_message or reply.text}")

    async def _configure(self, rt, ctx, url, card, model) -> None:
        request = extension_request(card, AGENT_CONFIG, "set")
        if request is None:
            return
        wanted = {
            "model": model,
            "system_prompt": self.system_prompt,
            "max_turns": user_override(ctx, "agent_max_turns") or self.max_turns,
            "timeout_seconds": self.timeout_seconds,
            "task_id": ctx.metadata.get("task_id"),
            "model_params": {**rt.config.model.params, **(self.model_params or {})} or None,
            "effort": user_override(ctx, "agent_effort") or self.effort,
            "harness": ctx.agent_harness or self.harness,
            "output_format": self.output_format,
        }
        body = {k: v for k, v in wanted.items() if v is not None and k in request.supported}
        if body:
            await rt.a2a.post_extension(url, card, AGENT_CONFIG, body)

    async def _store_trajectory(self, rt, url, card, task_id) -> str | None:
        """Fetch the agent's trajectory (if it offers one) into the object store."""
        if not task_id or not _has(card, TRAJECTORY):
            return None
        try:
            trajectory = await rt.a2a.get_trajectory(url, card, task_id)
        except Exception as exc:  # tolerated, as upstream: recorded as None
            rt.log.warning("trajectory of task %s not fetched: %s", task_id, exc)
            return None
        key = f"prompt_agent_trajectories/prompt_id={self.prompt_key}/trajectory-{task_id}.json"
        return rt.objects.put(key, json.dumps(trajectory, indent=1).encode())


def _has(card: dict, uri: str) -> bool:
    return any(e.get("uri") == uri for e in (card.get("capabilities") or {}).get("extensions") or [])
