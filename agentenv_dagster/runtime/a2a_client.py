"""Talk to a deployed A2A agent: read its card, call its extensions (whose URIs are defined here), prompt it.

a2a-sdk's ``ClientFactory`` picks the transport and protocol version (1.0 or 0.3) from the card; HTTP goes over
the step runtime's ``httpx.AsyncClient``, so the run's bearer token reaches our own agents. A prompt is one
blocking ``SendMessage``, polled while unfinished and cancelled past its deadline. Extension payloads ride in
``message.metadata[uri]``; those asked of the reply (``A2A-Extensions`` header) come back in the reply's.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import ipaddress
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx

if TYPE_CHECKING:
    from a2a.client import Client

MCP_CONFIG_URI = "urn:agentenv:mcp-config/v1"
AGENT_CONFIG_URI = "urn:agentenv:agent-config/v1"
SKILL_CONFIG_URI = "urn:agentenv:skill-config/v1"
TRAJECTORY_URI = "urn:agentenv:trajectory/v1"
TRIGGERS_URI = "urn:agentenv:triggers/v1"

# the endpoint an extension answers at when the card names none: urn:agentenv:<name>/v1 -> /ext/<name>
DEFAULT_ENDPOINTS = {uri: "/ext/" + uri.split(":")[-1].removesuffix("/v1")
                     for uri in (MCP_CONFIG_URI, AGENT_CONFIG_URI, SKILL_CONFIG_URI, TRAJECTORY_URI, TRIGGERS_URI)}
TRIGGERS_DECIDE_ENDPOINT = "/ext/triggers/decide"  # the triggers extension's second endpoint

CARD_PATHS = ("/.well-known/agent-card.json", "/.well-known/agent.json")
TERMINAL_STATES = frozenset({"completed", "failed", "canceled", "rejected"})
TRANSPORTS = ("JSONRPC", "HTTP+JSON", "GRPC")  # what this client speaks, in the SDK's names


class A2AError(RuntimeError):
    """An agent answered with an HTTP error or an A2A error, or cannot be spoken to."""


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
    """A step runtime's way to its agents, over its ``httpx.AsyncClient``; their SDK clients live until aclose."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http
        self._clients: dict[str, Client] = {}

    async def aclose(self) -> None:
        """Close the agents' clients (gRPC channels; the HTTP client is the runtime's to close)."""
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()

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
        """The endpoint the card gives ``uri`` (in ``params`` or ``config``), else the default; None if not offered."""
        for extension in card.get("capabilities", {}).get("extensions", []):
            if extension.get("uri") == uri:
                params = extension.get("params") or extension.get("config") or {}
                return params.get("endpoint") or DEFAULT_ENDPOINTS.get(uri)
        return None

    async def _extension_request(self, method: str, url: str, card: dict, uri: str, body: dict | None) -> dict:
        """The JSON answer of the endpoint the card declares for extension ``uri`` (``{}`` when it answers nothing)."""
        endpoint = self.extension_endpoint(card, uri)
        if endpoint is None:
            raise A2AError(f"agent at {url} does not advertise the extension {uri}")
        target = endpoint if endpoint.startswith(("http://", "https://")) else _join(url, endpoint)
        response = await self._http.request(method, target, json=body)
        _raise_for_status(method, response)
        return response.json() if response.content else {}

    post_extension = functools.partialmethod(_extension_request, "POST")  # (url, card, uri, body)
    get_extension = functools.partialmethod(_extension_request, "GET", body=None)  # (url, card, uri)

    async def get_trajectory(self, url: str, card: dict, task_id: str) -> Any:
        """The agent-defined trajectory of one task; None (not fatal) when the card has no trajectory extension."""
        if self.extension_endpoint(card, TRAJECTORY_URI) is None:
            return None
        return (await self.post_extension(url, card, TRAJECTORY_URI, {"task_id": task_id})).get("trajectory")

    async def send_and_wait(
        self, url: str, text: str, timeout_seconds: float, poll_interval: float = 0.2, context_id: str | None = None,
        extensions: dict[str, Any] | None = None, requested_extensions: tuple[str, ...] = (), card: dict | None = None,
    ) -> A2AReply:
        """Send one text prompt to the agent at base ``url`` and wait until its task ends: on the deadline
        the task is cancelled (best effort) and TimeoutError is raised. ``extensions`` are payloads the
        message carries by URI, ``requested_extensions`` are asked of the reply; ``card`` saves reading it."""
        from a2a.client import A2AClientTimeoutError, ClientCallContext
        from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions
        from a2a.types import CancelTaskRequest, GetTaskRequest, ListTasksRequest, Message, Part, SendMessageRequest
        from a2a.utils.errors import A2AError as SDKError
        from google.protobuf.json_format import MessageToDict

        deadline = time.monotonic() + timeout_seconds
        client = await self._client(url, card)
        context_id = context_id or uuid.uuid4().hex  # ours, so a timed-out task can be found
        message = Message(message_id=uuid.uuid4().hex, role="ROLE_USER", parts=[Part(text=text)], context_id=context_id)
        if extensions:
            message.extensions.extend(extensions)
            message.metadata.update(extensions)
        parameters = ServiceParametersFactory.create([with_a2a_extensions(list(requested_extensions))]) or None

        def call(least: float) -> ClientCallContext:  # a blocking send ends at the deadline, a poll may take a second
            return ClientCallContext(timeout=max(deadline - time.monotonic(), least), service_parameters=parameters)

        async def quietly(method, request):  # best effort: an agent that cannot cancel (or list: 0.3) is let be
            try:
                return await method(request, context=ClientCallContext(timeout=5.0))
            except (SDKError, NotImplementedError):
                return None

        async def cancel(task_ids: list[str] | None = None) -> list[str]:
            """Cancel ``task_ids``, by default the unfinished tasks of ``context_id``; returns their ids."""
            if task_ids is None:
                listed = await quietly(client.list_tasks, ListTasksRequest(context_id=context_id))
                tasks = (MessageToDict(listed).get("tasks") or []) if listed is not None else []
                task_ids = [t["id"] for t in tasks if _state(t) not in TERMINAL_STATES]
            for task_id in task_ids:
                await quietly(client.cancel_task, CancelTaskRequest(id=task_id))
            return task_ids

        try:
            async for response in client.send_message(SendMessageRequest(message=message), context=call(0.001)):
                pass  # not streaming: exactly one response (or an error), the task as it stands or the agent's message
        except A2AClientTimeoutError:
            task_ids = await cancel() or ["(unknown)"]
            raise TimeoutError(f"A2A task {task_ids[0]} did not complete within {timeout_seconds:g}s") from None
        except (SDKError, ValueError, NotImplementedError) as exc:
            raise _transport_error(exc) or A2AError(f"A2A message/send failed: {exc}") from None
        if response.HasField("message"):  # the agent answered directly, without a task
            return _reply({"status": {"state": "TASK_STATE_COMPLETED", "message": MessageToDict(response.message)}})
        task = MessageToDict(response.task)
        if not (task_id := task.get("id")):
            raise A2AError(f"A2A message/send succeeded but returned no task id: {str(task)[:2000]}")
        failures = 0
        while _state(task) not in TERMINAL_STATES:
            if time.monotonic() + poll_interval >= deadline:
                await cancel([task_id])
                raise TimeoutError(f"A2A task {task_id} did not complete within {timeout_seconds:g}s")
            await asyncio.sleep(poll_interval)
            try:
                task = MessageToDict(await client.get_task(GetTaskRequest(id=task_id), context=call(1.0)))
                failures = 0
            except SDKError as exc:
                dropped = _transport_error(exc)
                failures += 1  # a dropped poll is retried (5 times in a row); an agent that is gone, or says no, is not
                if dropped is None or failures >= 5:
                    raise dropped or A2AError(f"A2A GetTask failed: {exc}") from None
        return _reply(task)

    async def _client(self, url: str, card: dict | None) -> "Client":
        """The SDK client for the agent at ``url``, made from its card (0.3 cards too) on first use. A card naming
        no interface at all is taken for a JSON-RPC 1.0 agent at ``url``, where such agents have always answered."""
        from a2a.client import ClientConfig, ClientFactory
        from a2a.client.card_resolver import parse_agent_card
        from google.protobuf.json_format import ParseError

        if url in self._clients:
            return self._clients[url]
        card = card if card is not None else await self.get_card(url)
        try:
            parsed = parse_agent_card(copy.deepcopy(card))  # (it rewrites the legacy fields in place)
        except ParseError as exc:
            raise A2AError(f"the agent card at {url} is not valid: {exc}") from None
        if not parsed.supported_interfaces:
            parsed.supported_interfaces.add(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        if not any(i.protocol_binding in TRANSPORTS for i in parsed.supported_interfaces):
            offered = sorted({i.protocol_binding for i in parsed.supported_interfaces})
            raise A2AError(f"the agent at {url} offers only the transports {offered}; "
                           f"this client speaks {list(TRANSPORTS)}")
        factory = ClientFactory(ClientConfig(streaming=False, httpx_client=self._http,
                                             supported_protocol_bindings=list(TRANSPORTS),
                                             grpc_channel_factory=_grpc_channel))
        factory.register("GRPC", _grpc_transport)
        self._clients[url] = factory.create(parsed)
        return self._clients[url]


def _transport_error(exc: Exception) -> httpx.TransportError | None:
    """The connection failure under an SDK error: a lost connection stays httpx's, as for every request of a step."""
    cause = exc.__cause__
    return cause if isinstance(cause, httpx.TransportError) else None


def _grpc_transport(card, url: str, config):
    """The gRPC transport for the interface at ``url``, 0.3's or 1.0's (a2a-sdk 1.3's own producer loses the 0.3 one
    when ``a2a.client`` is imported before ``a2a.compat``: a circular import it swallows)."""
    from a2a.client.transports.grpc import GrpcTransport
    from a2a.compat.v0_3.grpc_transport import CompatGrpcTransport
    from a2a.compat.v0_3.versions import is_legacy_version

    versions = [i.protocol_version for i in card.supported_interfaces if i.protocol_binding == "GRPC" and i.url == url]
    legacy = bool(versions) and all(v and is_legacy_version(v) for v in versions)  # 1.0 wins where offered
    return (CompatGrpcTransport if legacy else GrpcTransport).create(card, url, config)


def _grpc_channel(target: str):
    """A gRPC channel to an agent's ``host:port``: plain on this machine, TLS elsewhere."""
    import grpc

    host = urlsplit(f"//{target}").hostname or ""
    with contextlib.suppress(ValueError):  # a host name, not an address
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return grpc.aio.insecure_channel(target)
    return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials())


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
        raise A2AError(f"{method} {response.request.url} -> HTTP {response.status_code}: {response.text[:2000]}")


def _state(task: dict) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` (1.0) or ``input-required`` (0.3) → ``input_required``."""
    state = task.get("status", {}).get("state", "")
    return state.removeprefix("TASK_STATE_").lower().replace("-", "_")


def _reply(task: dict) -> A2AReply:
    """Read a finished task: its last text part is the reply (else the artifacts' last); data parts merge."""
    message = task.get("status", {}).get("message") or {}
    parts = message.get("parts", [])
    texts = [p["text"] for p in parts if "text" in p] or [
        p["text"] for a in task.get("artifacts", []) for p in a.get("parts", []) if "text" in p]
    data = {k: v for p in parts if isinstance(p.get("data"), dict) for k, v in whole_numbers(p["data"]).items()}
    return A2AReply(task_id=task.get("id", ""), context_id=task.get("contextId") or message.get("contextId", ""),
                    state=_state(task), text=texts[-1] if texts else "", data=data,
                    metadata=message.get("metadata") or {})


def whole_numbers(value: Any) -> Any:
    """Data parts travel as protobuf Values, where every number is a double (3 comes back as 3.0): counts get ints."""
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
