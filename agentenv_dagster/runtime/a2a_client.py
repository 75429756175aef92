"""Talk to a deployed A2A agent: read its card, call its extensions, send a prompt and wait.

Raw JSON-RPC over one shared ``httpx.AsyncClient`` (A2A spec 1.0 wire, as a2a-sdk 1.3 serves
it): a blocking ``SendMessage`` answers the moment the task ends (no polling delay, which
would cost a fast agent a whole poll interval); past the deadline the tasks of the prompt's
context are found with ``ListTasks`` and cancelled. A task that comes back unfinished
(``input-required``, an agent that answers early) is followed with ``GetTask`` polling. The agentenv extension URIs live here too, as the
one definition shared by this client and the embedded agents.

Extensions may also ride on the prompt itself, A2A's way: a payload in ``message.metadata[uri]``
(listed in ``message.extensions``), and extensions asked of the reply in the ``A2A-Extensions``
header, which an agent answers in its reply message's ``metadata[uri]``. Agents that do so save
a request each way per prompt.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

MCP_CONFIG_URI = "urn:agentenv:mcp-config/v1"
AGENT_CONFIG_URI = "urn:agentenv:agent-config/v1"
SKILL_CONFIG_URI = "urn:agentenv:skill-config/v1"
TRAJECTORY_URI = "urn:agentenv:trajectory/v1"
TRIGGERS_URI = "urn:agentenv:triggers/v1"

DEFAULT_ENDPOINTS = {
    MCP_CONFIG_URI: "/ext/mcp-config",
    AGENT_CONFIG_URI: "/ext/agent-config",
    SKILL_CONFIG_URI: "/ext/skill-config",
    TRAJECTORY_URI: "/ext/trajectory",
    TRIGGERS_URI: "/ext/triggers",
}
TRIGGERS_DECIDE_ENDPOINT = "/ext/triggers/decide"  # the triggers extension's second endpoint

CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
EXTENSIONS_HEADER = "A2A-Extensions"  # a2a-sdk's HTTP_EXTENSION_HEADER; importing it loads a2a's protobufs (~0.3 s)
TERMINAL_STATES = frozenset({"completed", "failed", "canceled", "rejected"})
MAX_POLL_FAILURES = 5
_HEADERS = {"A2A-Version": "1.0"}


class A2AError(RuntimeError):
    """An agent answered with an HTTP error or a JSON-RPC error."""


@dataclass(frozen=True)
class A2AReply:
    """The end of one prompt: state is the lower-case A2A state (``completed``, ``failed`` …)."""

    task_id: str
    context_id: str
    state: str
    text: str
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)  # the reply message's, by extension URI


class A2AClient:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def get_card(self, url: str) -> dict:
        """The agent card; agents that predate ``agent-card.json`` serve ``agent.json``."""
        for path in CARD_PATHS:
            response = await self._http.get(_join(url, path))
            if response.status_code != 404:
                break
        _raise_for_status("GET", response)
        return response.json()

    @staticmethod
    def extension_endpoint(card: dict, uri: str) -> str | None:
        """The endpoint the card declares for ``uri`` (``config`` is an accepted alias of
        ``params``); the standard default when it names none; None when not advertised."""
        for extension in card.get("capabilities", {}).get("extensions", []):
            if extension.get("uri") == uri:
                params = extension.get("params") or extension.get("config") or {}
                return params.get("endpoint") or DEFAULT_ENDPOINTS.get(uri)
        return None

    async def post_extension(self, url: str, card: dict, uri: str, body: dict) -> dict:
        return await self._extension_request("POST", url, card, uri, body)

    async def get_extension(self, url: str, card: dict, uri: str) -> dict:
        return await self._extension_request("GET", url, card, uri, None)

    async def get_trajectory(self, url: str, card: dict, task_id: str) -> Any:
        """The agent-defined trajectory of one task; None when the card has no trajectory
        extension (callers treat a missing trajectory as non-fatal)."""
        if self.extension_endpoint(card, TRAJECTORY_URI) is None:
            return None
        reply = await self.post_extension(url, card, TRAJECTORY_URI, {"task_id": task_id})
        return reply.get("trajectory")

    async def send_and_wait(
        self,
        url: str,
        text: str,
        timeout_seconds: float,
        poll_interval: float = 0.2,
        context_id: str | None = None,
        extensions: dict[str, Any] | None = None,
        requested_extensions: tuple[str, ...] = (),
    ) -> A2AReply:
        """Send one text prompt and wait until its task ends.

        ``url`` is the agent's JSON-RPC endpoint: the base URL of an embedded agent, the
        card's ``supportedInterfaces[].url`` in general. ``extensions`` are payloads the message
        carries, by extension URI; ``requested_extensions`` are asked of the reply. On the
        deadline the task is cancelled (best effort) and TimeoutError is raised.
        """
        deadline = time.monotonic() + timeout_seconds
        context_id = context_id or uuid.uuid4().hex  # ours, so a timed-out task can be found
        message: dict[str, Any] = {
            "messageId": uuid.uuid4().hex,
            "role": "ROLE_USER",
            "parts": [{"text": text}],
            "contextId": context_id,
        }
        if extensions:
            message.update(extensions=list(extensions), metadata=extensions)
        headers = {**_HEADERS, EXTENSIONS_HEADER: ",".join(requested_extensions)} if requested_extensions else _HEADERS
        try:
            result = await self._rpc(url, "SendMessage", {"message": message}, deadline, exact=True, headers=headers)
        except httpx.TimeoutException:
            task_ids = await self._cancel_context(url, context_id)
            raise TimeoutError(
                f"A2A task {task_ids[0] if task_ids else '(unknown)'} did not complete within {timeout_seconds:g}s"
            ) from None
        except A2AError as exc:
            raise A2AError(f"A2A message/send failed: {exc}") from None
        if "message" in result:  # the agent answered directly, without a task
            status = {"state": "TASK_STATE_COMPLETED", "message": result["message"]}
            return _reply({"status": status})
        task = result.get("task") or {}
        task_id = task.get("id")
        if not task_id:
            raise A2AError(f"A2A message/send succeeded but returned no task id: {result}")
        failures = 0
        while _state(task) not in TERMINAL_STATES:
            if time.monotonic() + poll_interval >= deadline:
                await self._cancel_quietly(url, task_id)
                raise TimeoutError(
                    f"A2A task {task_id} did not complete within {timeout_seconds:g}s"
                )
            await asyncio.sleep(poll_interval)
            try:
                task = await self._rpc(url, "GetTask", {"id": task_id}, deadline, headers=headers)
                failures = 0
            except httpx.TransportError:
                failures += 1  # a dropped poll is retried; an agent that is gone is not
                if failures >= MAX_POLL_FAILURES:
                    raise
        return _reply(task)

    async def _cancel_context(self, url: str, context_id: str) -> list[str]:
        """Cancel the unfinished tasks of ``context_id``; their ids (best effort)."""
        try:
            listed = await self._rpc(url, "ListTasks", {"contextId": context_id}, time.monotonic() + 5.0)
        except (A2AError, httpx.HTTPError):
            return []
        open_ids = [t["id"] for t in listed.get("tasks") or [] if _state(t) not in TERMINAL_STATES]
        for task_id in open_ids:
            await self._cancel_quietly(url, task_id)
        return open_ids

    async def _cancel_quietly(self, url: str, task_id: str) -> None:
        try:
            await self._rpc(url, "CancelTask", {"id": task_id}, time.monotonic() + 5.0)
        except (A2AError, httpx.HTTPError):
            pass

    async def _rpc(self, url: str, method: str, params: dict, deadline: float, exact: bool = False,
                   headers: dict[str, str] = _HEADERS) -> dict:
        """``exact``: time out at the deadline itself (a blocking send), else allow a second."""
        payload = {"jsonrpc": "2.0", "id": uuid.uuid4().hex, "method": method, "params": params}
        timeout = max(deadline - time.monotonic(), 0.001 if exact else 1.0)
        response = await self._http.post(url, json=payload, headers=headers, timeout=timeout)
        _raise_for_status("POST", response)
        body = response.json()
        if body.get("error"):
            raise A2AError(str(body["error"]))
        return body.get("result") or {}

    async def _extension_request(
        self, method: str, url: str, card: dict, uri: str, body: dict | None
    ) -> dict:
        endpoint = self.extension_endpoint(card, uri)
        if endpoint is None:
            raise A2AError(f"agent at {url} does not advertise the extension {uri}")
        target = endpoint if endpoint.startswith(("http://", "https://")) else _join(url, endpoint)
        response = await self._http.request(method, target, json=body)
        _raise_for_status(method, response)
        return response.json() if response.content else {}


def trajectory_metadata(events: list[dict[str, Any]]) -> dict[str, Any]:
    """A task's trajectory as its reply message carries it: JSON text, because a metadata value
    travels as a protobuf Struct, which would turn every number into a double (and cost more)."""
    return {TRAJECTORY_URI: {"trajectory_json": json.dumps(events)}}


def reply_trajectory(reply: A2AReply) -> Any | None:
    """The trajectory the agent attached to its reply, or None when it attached none."""
    carried = reply.metadata.get(TRAJECTORY_URI)
    if not isinstance(carried, dict) or not isinstance(carried.get("trajectory_json"), str):
        return None
    return json.loads(carried["trajectory_json"])


def _join(base: str, path: str) -> str:
    return base.rstrip("/") + "/" + path.lstrip("/")


def _raise_for_status(method: str, response: httpx.Response) -> None:
    if response.status_code >= 400:
        raise A2AError(f"{method} {response.request.url} -> HTTP {response.status_code}: "
                       f"{response.text[:2000]}")


def _state(task: dict) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` (1.0) or ``input-required`` (0.3) → ``input_required``."""
    state = task.get("status", {}).get("state", "")
    return state.removeprefix("TASK_STATE_").lower().replace("-", "_")


def _reply(task: dict) -> A2AReply:
    """Read a finished task: the last text part is the reply, data parts merge into ``data``.

    Text falls back to the artifacts for agents that answer there instead of in the status.
    """
    status_parts = (task.get("status", {}).get("message") or {}).get("parts", [])
    artifact_parts = [p for a in task.get("artifacts", []) for p in a.get("parts", [])]
    texts = [p["text"] for p in status_parts if "text" in p] or [
        p["text"] for p in artifact_parts if "text" in p
    ]
    data: dict[str, Any] = {}
    for part in status_parts:
        if isinstance(part.get("data"), dict):
            data.update(whole_numbers(part["data"]))
    message = task.get("status", {}).get("message") or {}
    return A2AReply(
        task_id=task.get("id", ""),
        context_id=task.get("contextId") or message.get("contextId", ""),
        state=_state(task),
        text=texts[-1] if texts else "",
        data=data,
        metadata=message.get("metadata") or {},
    )


def whole_numbers(value: Any) -> Any:
    """Data parts travel as protobuf Values, where every number is a double: 3 comes back
    as 3.0. Give counts back their integer type."""
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
