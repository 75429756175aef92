"""The user side of a multi-turn ``prompt_agent``: who plays the user, and what it said.

agent-env's user is an A2A endpoint (``user_a2a_url``) or a deployed user-simulator agent
(``user_agent_name``). Each agent reply is sent to it; it answers ``{"message", "done"}`` as
JSON (or a structured output), and anything that is not such an object is taken as the next
message verbatim. A Coder Eval simulator ends the dialog with a stop token instead of
``done``: the token is stripped and the rest still reaches the agent as the last turn.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..context import TaskStepContext
from ..runtime.a2a_client import A2AError
from .agent_card import AGENT_CONFIG, extension_request

# Why a conversation ended (``PromptResponse.stop_reason``). The first five are Coder Eval's
# DialogStopReason values; ``done`` is agent-env's user answering ``done: true``.
CRITERIA_PASSED, STOP_TOKEN, MAX_TURNS, BUDGET, ERROR, DONE = (
    "criteria_passed", "stop_token", "max_turns", "budget", "error", "done",
)

# agent-env's default output_format for a deployed user-simulator.
USER_OUTPUT_FORMAT = {
    "type": "json_schema",
    "schema": {
        "type": "object",
        "properties": {"message": {"type": "string"}, "done": {"type": "boolean"}},
        "required": ["message", "done"],
    },
}
# Sent to the user agent when it writes the opener itself.
OPENER_REQUEST = ("Start the conversation: write your first message to the assistant, "
                  "as the user you are playing.")
# What the agent reads when a user's last message was nothing but the stop token.
STOPPED_PLACEHOLDER = "(the user indicated the task is complete)"


@dataclass
class UserEndpoint:
    """Where user messages come from; one A2A context for the whole conversation."""

    url: str
    agent_name: str | None  # None for ``user_a2a_url``
    card: dict | None = None
    context_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class UserTurn:
    """One answer of the user: the next message, or why the conversation ends here.
    ``last`` = the message is still sent, but the agent's reply to it ends the dialog."""

    message: str | None
    record: dict[str, Any]
    stop_reason: str | None = None
    last: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def user_endpoint(ctx: TaskStepContext, user_a2a_url: str | None, user_agent_name: str,
                  default_human_url: str | None = None) -> UserEndpoint:
    """Who answers the agent: ``user_a2a_url``, else the deployed user agent, else the
    configured human (``[conversations] default_human_a2a_url``, ``AGENT_ENV_HUMAN_A2A_URL``)."""
    if user_a2a_url:
        return UserEndpoint(user_a2a_url, None)
    agent = ctx.find_agent(user_agent_name)
    if agent is not None:
        return UserEndpoint(agent.a2a_url or agent.api_url, agent.agent_name, agent.a2a_card)
    if default_human_url:
        return UserEndpoint(default_human_url, None)
    raise RuntimeError(
        f"No human-A2A URL configured: set user_a2a_url, deploy the user agent '{user_agent_name}' "
        f"(Agent with name '{user_agent_name}' not found in context.deployed_agents), or set "
        "[conversations] default_human_a2a_url / AGENT_ENV_HUMAN_A2A_URL"
    )


async def configure_user(rt, endpoint: UserEndpoint, *, model: str | None, output_format: Any,
                         timeout_seconds: float) -> None:
    """A deployed user-simulator gets the ``{message, done}`` output format by default (and
    ``user_model``), limited to what its card says it accepts; an external user gets nothing."""
    if endpoint.agent_name is None:
        return
    endpoint.card = endpoint.card or await rt.a2a.get_card(endpoint.url)
    request = extension_request(endpoint.card, AGENT_CONFIG, "set")
    if request is None:
        return
    wanted = {"model": model, "output_format": output_format or USER_OUTPUT_FORMAT,
              "timeout_seconds": timeout_seconds}
    body = {k: v for k, v in wanted.items() if v is not None and k in request.supported}
    if body:
        await rt.a2a.post_extension(endpoint.url, endpoint.card, AGENT_CONFIG, body)


async def ask_user(rt, endpoint: UserEndpoint, text: str, *, timeout_seconds: float,
                   stop_token: str | None) -> UserTurn:
    """Send ``text`` to the user; a timeout, a failed task or an empty reply ends the
    conversation (``error``) rather than failing the step, as upstream."""
    try:
        reply = await rt.a2a.send_and_wait(endpoint.url, text, timeout_seconds=timeout_seconds,
                                           poll_interval=0.25, context_id=endpoint.context_id, card=endpoint.card)
    except (TimeoutError, A2AError, httpx.HTTPError) as exc:
        error = str(exc) or type(exc).__name__
        return UserTurn(None, {"error": f"user agent: {error}"}, stop_reason=ERROR)
    data = reply.data or {}
    record = {
        "task_id": reply.task_id, "context_id": reply.context_id, "state": reply.state,
        "text": reply.text, "usage": data.get("usage"), "model": data.get("model") or None,
    }
    record = {k: v for k, v in record.items() if v is not None}
    if reply.state != "completed":
        kind = f" ({data['error_type']})" if data.get("error_type") else ""
        record["error"] = f"user agent task {reply.state}{kind}: {data.get('error_message') or reply.text}"
        return UserTurn(None, record, stop_reason=ERROR)
    if not reply.text.strip() and not isinstance(data.get("structured_output"), dict):
        record["error"] = "user agent sent an empty reply"
        return UserTurn(None, record, stop_reason=ERROR)
    message, done, extra = parse_user_reply(reply.text, data.get("structured_output"))
    if done:
        return UserTurn(message, record, stop_reason=DONE, extra=extra)
    if stop_token and stop_token in message:
        cleaned = message.replace(stop_token, "").strip() or STOPPED_PLACEHOLDER
        return UserTurn(cleaned, record, last=True, extra=extra)
    return UserTurn(message, record, extra=extra)


def parse_user_reply(text: str, structured: Any = None) -> tuple[str, bool, dict[str, Any]]:
    """``(message, done, extra fields)`` from ``{"message": ..., "done": ...}`` (a structured
    output, the whole text, or a ```json fence); any other text is the message itself."""
    value = structured if isinstance(structured, dict) else _json_object(text)
    if not isinstance(value, dict) or not ({"message", "done"} & value.keys()):
        return text.strip(), False, {}
    message = value.get("message")
    extra = {k: v for k, v in value.items() if k not in ("message", "done")}
    return ("" if message is None else str(message)), value.get("done") is True, extra


def _json_object(text: str) -> Any:
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.strip("`").removeprefix("json").strip()
    try:
        return json.loads(stripped)
    except ValueError:
        return None


def total_tokens(usage: dict[str, Any] | None) -> int:
    usage = usage or {}
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


def add_usage(total: dict[str, int], usage: dict[str, Any] | None) -> None:
    for key in ("input_tokens", "output_tokens"):
        total[key] = total.get(key, 0) + int((usage or {}).get(key) or 0)
