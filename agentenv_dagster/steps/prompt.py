"""prompt_agent: send a prompt to a deployed agent over A2A and record its PromptResponse.

With ``max_conversation_turns > 1`` (or a user agent that opens) it holds a conversation: each
reply goes to a user agent (see ``conversation.py``) whose answer is the next prompt, in one
A2A context, with every turn recorded on the one PromptResponse.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Iterator

from pydantic import model_validator

from ..context import PromptResponse, TaskStepContext
from ..runtime.a2a_client import reply_trajectory
from ..runtime.base import StepRuntime
from .agent_card import AGENT_CONFIG, TRAJECTORY, extension_request
from .base import AGENT, DEFAULT_AGENT_NAME, PROMPT, SANDBOX, ContextName, TaskStep
from .conversation import (
    BUDGET,
    CRITERIA_PASSED,
    ERROR,
    MAX_TURNS,
    OPENER_REQUEST,
    STOP_TOKEN,
    UserEndpoint,
    add_usage,
    ask_user,
    configure_user,
    total_tokens,
    user_endpoint,
)
from .execution import parse_structured_output, user_override
from .registry import step
from .triggers import AgentTriggerSession, capture_env_trigger_state
from .turn_criteria import grade_turn

RESERVED_MODEL_PARAMS = {
    "model", "messages", "api_key", "api_base", "user", "metadata", "timeout", "response_format",
}


@step("prompt_agent")
class PromptAgentStep(TaskStep):
    reads = {"agent_name": AGENT, "user_agent_name": AGENT, "turn_criteria_sandbox": SANDBOX}
    writes = {"prompt_key": PROMPT}

    # the prompt text (`<token>`s filled from the seed)
    prompt: str | None = None
    # the prompt as A2A message parts, instead of `prompt`
    parts: list[dict[str, Any]] | None = None
    # the name of the response, for verifiers (`prompt_id` of a verifier)
    prompt_id: str | None = None
    # the deployed agent to prompt
    agent_name: str = DEFAULT_AGENT_NAME
    # seconds the agent may take to answer
    timeout_seconds: float = 600
    # how often a long-running answer is polled
    poll_interval_seconds: float = 2
    # where the turn's trajectory is written in the object store
    trajectory_output_prefix: str | None = None
    # the model the agent uses for this prompt (agent-config)
    model: str | None = None
    # model parameters for this prompt (agent-config)
    model_params: dict[str, Any] | None = None
    # the system prompt for this prompt (agent-config)
    system_prompt: str | None = None
    # the agent's turns for this prompt at most
    max_turns: int | None = None
    # a structured answer's format, passed to the agent
    output_format: Any = None
    # the agent's thinking budget (agent-config)
    max_thinking_tokens: int | None = None
    # the agent's effort setting (agent-config)
    effort: str | None = None
    # the agent harness to use, for agents that offer several
    harness: str | None = None
    # tools offered to the agent beside its envs'
    agentenv_tools: list[Any] | None = None
    # an A2A context to continue
    context_id: str | None = None
    # turns of a conversation with a user; 1 = a single prompt
    max_conversation_turns: int = 1
    # the deployed agent that plays the user in a conversation
    user_agent_name: str = "human_agent"
    user_a2a_url: str | None = None
    # the user agent's answer format
    user_output_format: Any = None
    # the model the user agent runs on
    user_model: str | None = None
    # seconds the user agent may take to answer
    user_agent_timeout_seconds: float = 600
    # snapshot the env after the prompt (agent-env's snapshot settings)
    snapshot_config: dict[str, Any] | None = None
    # ours: the user agent writes the opener (no prompt); a stop token in a user message makes
    # it the last one; agent + user tokens at or over max_total_tokens end the dialog; criteria
    # graded after every turn ({sandbox_name, criteria, stop_on_pass}) may end it when they pass.
    user_opens_conversation: bool = False
    user_stop_token: str | None = None
    max_total_tokens: int | None = None
    turn_criteria: dict[str, Any] | None = None
    # ours: the armed criteria ({criteria, gate_threshold}) the agent's stop_early watcher
    # observes; the reply then carries ``early_stop`` when the watcher ended the turn.
    stop_early: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "PromptAgentStep":
        if self.user_opens_conversation:
            if self.prompt is not None or self.parts is not None:
                raise ValueError("`user_opens_conversation` has the user agent write the opener: "
                                 "set neither `prompt` nor `parts`")
        elif self.prompt is None and self.parts is None:
            raise ValueError("PromptAgentTaskStep requires either `prompt` or `parts`")
        if self.prompt is not None and self.parts is not None:
            raise ValueError("PromptAgentTaskStep accepts `prompt` OR `parts`, not both")
        if self.parts is not None:
            for i, part in enumerate(self.parts):
                if not isinstance(part, dict):
                    raise ValueError(f"parts[{i}] must be a dict, got {type(part).__name__}")
        if self.max_conversation_turns < 1:
            raise ValueError("max_conversation_turns must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError("max_total_tokens must be >= 1")
        if self.turn_criteria is not None and not (
                isinstance(self.turn_criteria.get("sandbox_name"), str)
                and isinstance(self.turn_criteria.get("criteria"), list)):
            raise ValueError("turn_criteria needs a `sandbox_name` and a list of `criteria`")
        reserved = sorted(RESERVED_MODEL_PARAMS & set(self.model_params or {}))
        if reserved:
            raise ValueError(f"model_params may not set reserved keys: {reserved}")
        return self

    @property
    def prompt_key(self) -> str:
        """The prompt_id verifiers join on; the step id when the author set none."""
        return self.prompt_id or self.id

    @property
    def is_conversation(self) -> bool:
        """More than one turn, or any dialog setting (a one-turn dialog still records its turn
        and why it ended)."""
        return self.max_conversation_turns > 1 or self.user_opens_conversation or any(
            v is not None for v in (self.user_stop_token, self.max_total_tokens, self.turn_criteria))

    def names_read(self) -> Iterator[ContextName]:
        """The user agent is read only by a conversation without ``user_a2a_url`` that names
        one (left at its default, the configured human answers when no agent is deployed)."""
        reads_user = self.is_conversation and not self.user_a2a_url and "user_agent_name" in self.model_fields_set
        return (n for n in super().names_read() if n.field != "user_agent_name" or reads_user)

    @property
    def turn_criteria_sandbox(self) -> str | None:
        return (self.turn_criteria or {}).get("sandbox_name") if self.is_conversation else None

    def prompt_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(p.get("text", "") for p in self.parts or [] if "text" in p)

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
        user = user_endpoint(ctx, self.user_a2a_url, self.user_agent_name,
                             rt.config.conversations.human_a2a_url()) if self.is_conversation else None
        url = agent.a2a_url or agent.api_url
        card = agent.a2a_card or await rt.a2a.get_card(url)
        model = ctx.agent_model or self.model or ctx.default_agent_model
        config = await self._configure(rt, ctx, url, card, model)
        if user is None:
            await self._single_turn(ctx, rt, agent, url, card, model, config)
        else:
            await configure_user(rt, user, model=self.user_model, output_format=self.user_output_format,
                                 timeout_seconds=self.user_agent_timeout_seconds)
            await self._conversation(ctx, rt, agent, url, card, model, user, config)
        await capture_env_trigger_state(ctx, rt, self.id)

    async def _send(self, rt, url, card, message: str, context_id: str | None, config: dict | None):
        """One turn: ``config`` rides on the message when the agent takes it there; the
        trajectory is asked for on the reply when the agent offers one."""
        return await rt.a2a.send_and_wait(
            url, message, timeout_seconds=self.timeout_seconds,
            poll_interval=min(self.poll_interval_seconds, 0.25), context_id=context_id,
            extensions=config, requested_extensions=(TRAJECTORY,) if _has(card, TRAJECTORY) else (), card=card,
        )

    async def _single_turn(self, ctx, rt, agent, url, card, model, config) -> None:
        reply = await self._send(rt, url, card, self.prompt_text(), self.context_id, config)
        trajectory_url, _ = await self._store_trajectory(rt, url, card, reply)
        data = reply.data or {}
        usage = data.get("usage") or {}
        response = self._response(reply, model, trajectory_url, usage)
        if data.get("early_stop"):
            response.early_stop = data["early_stop"]
        ctx.prompt_responses.append(response)
        ctx.metadata_map("a2a_conversations")[self.id] = reply.context_id
        self._raise_if_failed(response, reply, agent)

    async def _conversation(self, ctx, rt, agent, url, card, model, user: UserEndpoint, config) -> None:
        """Agent turn, then the user's answer, until the user is done (or stops, or fails),
        the turns run out, the token budget is spent or the criteria pass. Every turn is
        recorded; the agent keeps one A2A context throughout (and gets ``config`` with its
        first message)."""
        context_id = self.context_id or uuid.uuid4().hex
        turns: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        user_usage: dict[str, int] = {}
        outputs = ctx.metadata_map("usersim_turn_outputs")
        triggers = AgentTriggerSession.of(ctx, self.id, user, self.user_agent_timeout_seconds)
        stop_reason, stop_detail, closing, reply = None, None, None, None
        said = None
        if self.user_opens_conversation:
            said = await ask_user(rt, user, OPENER_REQUEST, timeout_seconds=self.user_agent_timeout_seconds,
                                  stop_token=self.user_stop_token)
            add_usage(user_usage, said.record.get("usage"))
            message = said.message
            if said.stop_reason is not None:  # the user never opened: no agent turn at all
                stop_reason, stop_detail, closing = said.stop_reason, said.record.get("error"), said.record
        else:
            message = self.prompt_text()
        for index in range(1, self.max_conversation_turns + 1):
            if stop_reason is not None:
                break
            if said is not None and said.extra:
                outputs.setdefault(self.id, []).append({"turn": index, **said.extra})
            started = datetime.now(timezone.utc)
            try:
                reply = await self._send(rt, url, card, message, context_id, None if turns else config)
            except Exception as exc:  # the turns so far stay on record
                if turns:
                    self._record_conversation(ctx, rt, turns, events, usage, user_usage, ERROR, str(exc), None,
                                              model, context_id, user)
                raise
            trajectory_url, turn_events = await self._store_trajectory(rt, url, card, reply)
            events += turn_events
            data = reply.data or {}
            add_usage(usage, data.get("usage"))
            turn: dict[str, Any] = {
                "turn": index, "user_message": message, "response": reply.text or "", "state": reply.state,
                "agent_session_id": reply.task_id, "a2a_context_id": reply.context_id,
                "usage": data.get("usage"), "tool_call_count": _tool_calls(data), "model": data.get("model") or model,
                "trajectory_url": trajectory_url, "started_at_utc": started.isoformat(),
                "duration_seconds": round((datetime.now(timezone.utc) - started).total_seconds(), 3),
            }
            if said is not None:
                turn["user"] = said.record
            if reply.state != "completed":
                turn.update(error_type=data.get("error_type") or reply.state, error_message=data.get("error_message"))
            turns.append({k: v for k, v in turn.items() if v is not None})
            if reply.state != "completed":
                stop_reason, stop_detail = ERROR, f"agent task {reply.state}"
            elif said is not None and said.last:
                stop_reason = STOP_TOKEN
            elif (stop_reason := await self._criteria_stop(ctx, rt, turns, events)) is not None:
                pass
            elif index >= self.max_conversation_turns:
                stop_reason = MAX_TURNS
            elif self.max_total_tokens is not None and (
                    total_tokens(usage) + total_tokens(user_usage) >= self.max_total_tokens):
                stop_reason = BUDGET
            else:  # a stakeholder's triggers answer first; the user agent when none fired
                said = await triggers.decide(ctx, rt, index, reply.text or "", context_id) if triggers else None
                said = said or await ask_user(rt, user, reply.text or "", stop_token=self.user_stop_token,
                                              timeout_seconds=self.user_agent_timeout_seconds)
                add_usage(user_usage, said.record.get("usage"))
                message = said.message
                if said.stop_reason is not None:
                    stop_reason, stop_detail = said.stop_reason, said.record.get("error")
                    closing = {**said.record, "message": said.message} if said.message is not None else said.record
                    if said.extra:
                        outputs.setdefault(self.id, []).append({"turn": index + 1, **said.extra})
        if triggers:
            await triggers.record_state(ctx, rt)
        response = self._record_conversation(ctx, rt, turns, events, usage, user_usage, stop_reason, stop_detail,
                                             closing, model, context_id, user, reply)
        if reply is not None:
            self._raise_if_failed(response, reply, agent)

    async def _criteria_stop(self, ctx, rt, turns, events) -> str | None:
        """Grade ``turn_criteria`` after a turn (recorded on it); ``criteria_passed`` when
        they pass and the step stops on a pass."""
        if not self.turn_criteria:
            return None
        dialog = [{"user": t["user_message"], "agent": t["response"]} for t in turns]
        verdict = await grade_turn(ctx, rt, self.turn_criteria["sandbox_name"], self.turn_criteria["criteria"],
                                   events, dialog, time_limit=self.timeout_seconds)
        turns[-1]["criteria"] = verdict
        return CRITERIA_PASSED if verdict["passed"] and self.turn_criteria.get("stop_on_pass") else None

    def _record_conversation(self, ctx, rt, turns, events, usage, user_usage, stop_reason, stop_detail, closing,
                             model, context_id, user: UserEndpoint, reply=None) -> PromptResponse:
        """One PromptResponse for the whole dialog: the final reply, the summed usage, every
        turn, why it ended; the whole dialog's trajectory (so graders see every turn's tool
        calls) beside the per-turn ones."""
        last = turns[-1] if turns else {}
        trajectory_url = None
        if any(t.get("trajectory_url") for t in turns):
            key = f"prompt_agent_trajectories/prompt_id={self.prompt_key}/conversation-{context_id}.json"
            trajectory_url = rt.objects.put(key, json.dumps(events, indent=1).encode())
        data = (reply.data or {}) if reply is not None else {}
        response = PromptResponse(
            prompt_id=self.prompt_key,
            response=last.get("response", ""),
            prompt_text=self.prompt,
            agent_trajectory_object_url=trajectory_url,
            tool_call_count=sum(t.get("tool_call_count") or 0 for t in turns),
            model=last.get("model") or model,
            error_type=last.get("error_type") if last.get("state") not in (None, "completed") else None,
            error_code=data.get("error_code"),
            error_message=last.get("error_message"),
            agent_session_id=last.get("agent_session_id", ""),
            a2a_context_id=last.get("a2a_context_id") or context_id,
            agent_name=self.agent_name,
            step_id=self.id,
            structured_output=(data.get("structured_output") or parse_structured_output(last.get("response")))
            if turns else None,
            usage=usage or None,
            target_agent_per_turn_trajectory_object_urls=[t.get("trajectory_url") for t in turns],
            source_agent_per_turn_prompt_parts=[
                None if i == 0 and self.prompt is not None else [{"text": t["user_message"]}]
                for i, t in enumerate(turns)
            ],
            turns=turns,
            stop_reason=stop_reason,
            user_agent_name=user.agent_name,
            user_a2a_url=self.user_a2a_url,
            user_a2a_context_id=user.context_id,
            user_usage=user_usage or None,
        )
        extras = {"stop_detail": stop_detail, "closing_user_message": closing}
        for key, value in extras.items():
            if value is not None:
                setattr(response, key, value)
        ctx.prompt_responses.append(response)
        ctx.metadata_map("a2a_conversations")[self.id] = response.a2a_context_id
        return response

    def _response(self, reply, model, trajectory_url, usage) -> PromptResponse:
        data = reply.data or {}
        return PromptResponse(
            prompt_id=self.prompt_key,
            response=reply.text or "",
            prompt_text=self.prompt,
            agent_trajectory_object_url=trajectory_url,
            tool_call_count=_tool_calls(data),
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

    @staticmethod
    def _raise_if_failed(response: PromptResponse, reply, agent) -> None:
        if reply.state == "completed":
            return
        details = ", ".join(
            f"{k}={v}" for k, v in (
                ("error_type", response.error_type), ("error_code", response.error_code),
                ("task_id", reply.task_id), ("agent_sandbox", agent.sandbox_id),
            ) if v
        )
        raise RuntimeError(f"A2A task failed ({details}): {response.error_message or reply.text}")

    async def _configure(self, rt, ctx, url, card, model) -> dict[str, dict] | None:
        """POST the agent-config, or, when the agent takes it on a prompt, return it as the
        first message's extension payload (one request fewer a prompt)."""
        request = extension_request(card, AGENT_CONFIG, "set")
        if request is None:
            return None
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
            "stop_early": self.stop_early,
        }
        if self.stop_early is not None and "stop_early" not in request.supported:
            rt.log.warning("agent at %s cannot stop early (no stop_early agent-config): the run goes in full", url)
        body = {k: v for k, v in wanted.items() if v is not None and k in request.supported}
        if not body:
            return None
        if request.in_message:
            return {AGENT_CONFIG: body}
        await rt.a2a.post_extension(url, card, AGENT_CONFIG, body)
        return None

    async def _store_trajectory(self, rt, url, card, reply) -> tuple[str | None, list[dict[str, Any]]]:
        """The agent's trajectory of one turn (if it offers one: on the reply, else fetched)
        into the object store; its URL and its events."""
        task_id = reply.task_id
        if not task_id or not _has(card, TRAJECTORY):
            return None, []
        try:
            trajectory = reply_trajectory(reply)
            if trajectory is None:
                trajectory = await rt.a2a.get_trajectory(url, card, task_id)
        except Exception as exc:  # tolerated, as upstream: recorded as None
            rt.log.warning("trajectory of task %s not fetched: %s", task_id, exc)
            return None, []
        key = f"prompt_agent_trajectories/prompt_id={self.prompt_key}/trajectory-{task_id}.json"
        events = trajectory if isinstance(trajectory, list) else []
        return rt.objects.put(key, json.dumps(trajectory, indent=1).encode()), events


def _tool_calls(data: dict[str, Any]) -> int | None:
    return data.get("tool_call_count", (data.get("usage") or {}).get("tool_call_count"))


def _has(card: dict, uri: str) -> bool:
    return any(e.get("uri") == uri for e in (card.get("capabilities") or {}).get("extensions") or [])
