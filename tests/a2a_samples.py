"""a2a-sdk's sample agent (``samples/hello_world_agent.py`` of a2a-python), served on 127.0.0.1
in a background thread for one protocol version and one transport, with agent-env's
agent-config and trajectory extensions beside it.

Each sample is a real a2a-sdk server: 1.0 through the SDK's own routes and gRPC servicer; 0.3
through the SDK's 0.3 adapters alone (its JSON-RPC methods, REST paths and gRPC service), with
the card in the 0.3 shape (``url``, ``preferredTransport``, ``protocolVersion``), so a client
that did not speak 0.3 would fail against it. ``calls`` records what each request asked for
(JSON-RPC method, REST path or gRPC method) and with which ``A2A-Version``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import grpc
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes  # isort: skip (first: the 0.3 adapters import it)
from a2a.compat.v0_3.conversions import to_compat_agent_card
from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter
from a2a.compat.v0_3.rest_adapter import REST03Adapter
from a2a.helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentExtension, AgentInterface, AgentSkill, Part
from fakes.messages_api import ThreadedServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.runtime.a2a_client import AGENT_CONFIG_URI, DEFAULT_ENDPOINTS, TRAJECTORY_URI, trajectory_metadata

VERSIONS = ("1.0", "0.3")
TRANSPORTS = ("JSONRPC", "HTTP+JSON", "GRPC")
PLACEHOLDER_URL = "http://127.0.0.1/"  # until the port is known


class SampleAgentExecutor(AgentExecutor):
    """The sample's executor: a working status, the reply as an artifact, then completed. A
    prompt starting with ``slow`` takes 3 s unless cancelled; one starting with ``early`` is
    ``input-required`` for a moment (the blocking send returns then) before it goes on. The agent-config system prompt,
    when set, prefixes the reply; every task's events are kept for the trajectory extension."""

    def __init__(self, state: SampleState) -> None:
        self.state = state
        self.running: set[str] = set()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.running.discard(context.task_id or "")
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)  # (the SDK wants the task before its updates)
        task_id = task.id
        self.running.add(task_id)
        updater = TaskUpdater(event_queue, task_id, task.context_id)
        await updater.start_work(updater.new_agent_message([Part(text="Processing your question...")]))
        query = context.get_user_input()
        if query.startswith("early"):  # answers the blocking send before it is done
            await updater.requires_input(updater.new_agent_message([Part(text="One moment...")]))
            await asyncio.sleep(0.3)
            await updater.start_work()
        if query.startswith("slow"):
            for _ in range(300):
                if task_id not in self.running:
                    return
                await asyncio.sleep(0.01)
        prefix = self.state.config.get("system_prompt")
        reply = f"{prefix + ' ' if prefix else ''}Hello World! You said: '{query}'."
        self.state.trajectories[task_id] = [{"type": "message", "role": "user", "text": query},
                                            {"type": "message", "role": "assistant", "text": reply}]
        await updater.add_artifact([Part(text=reply)], name="response", last_chunk=True)
        if TRAJECTORY_URI in context.requested_extensions:
            message = updater.new_agent_message([Part(text=reply)])
            message.metadata.update(trajectory_metadata(self.state.trajectories[task_id]))
            await updater.complete(message)
        else:
            await updater.complete()


@dataclass
class SampleState:
    config: dict[str, Any] = field(default_factory=dict)
    trajectories: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    calls: list[tuple[str, str | None]] = field(default_factory=list)  # (method or path, A2A-Version)


def sample_card(version: str, transport: str) -> AgentCard:
    """The sample's card with agent-env's extensions; the URL is filled in once serving."""
    extensions = []
    for uri in (AGENT_CONFIG_URI, TRAJECTORY_URI):
        extension = AgentExtension(uri=uri, description="agent-env extension")
        extension.params.update({"endpoint": DEFAULT_ENDPOINTS[uri]})
        extensions.append(extension)
    return AgentCard(
        name="Sample Agent", description="A sample agent to test the stream functionality.", version="1.0.0",
        capabilities=AgentCapabilities(streaming=False, extensions=extensions),
        default_input_modes=["text"], default_output_modes=["text", "task-status"],
        skills=[AgentSkill(id="sample_agent", name="Sample Agent", description="Say hi.", tags=["sample"])],
        supported_interfaces=[AgentInterface(protocol_binding=transport, protocol_version=version, url=PLACEHOLDER_URL)],
    )


@contextlib.contextmanager
def sample_agent(version: str, transport: str):
    """Serve the sample for ``version`` over ``transport``; yields (base URL, state)."""
    state = SampleState()
    card = sample_card(version, transport)
    handler = DefaultRequestHandler(SampleAgentExecutor(state), task_store=InMemoryTaskStore(), agent_card=card)
    routes = _extension_routes(state)
    if version == "1.0":
        routes += create_agent_card_routes(card)
        if transport == "JSONRPC":
            routes += create_jsonrpc_routes(handler, rpc_url="/a2a/jsonrpc")
        elif transport == "HTTP+JSON":
            routes += create_rest_routes(handler, path_prefix="/a2a/rest")
    else:
        async def card_v03(_: Request) -> JSONResponse:
            return JSONResponse(to_compat_agent_card(card).model_dump(by_alias=True, exclude_none=True, mode="json"))

        routes.append(Route("/.well-known/agent-card.json", card_v03))
        if transport == "JSONRPC":
            routes.append(Route("/a2a/jsonrpc", _v03_jsonrpc(handler), methods=["POST"]))
        elif transport == "HTTP+JSON":
            routes += [Route(f"/a2a/rest{path}", endpoint, methods=[method])
                       for (path, method), endpoint in REST03Adapter(handler).routes().items()]
    grpc_server: list[Any] = []

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if transport == "GRPC":
            grpc_server.append(await _start_grpc(version, handler, state))
        try:
            yield
        finally:
            for server in grpc_server:
                await server.stop(None)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_Recorder, state=state)
    with ThreadedServer(app) as server:
        paths = {"JSONRPC": "/a2a/jsonrpc", "HTTP+JSON": "/a2a/rest"}
        card.supported_interfaces[0].url = (f"{server.url}{paths[transport]}" if transport in paths
                                            else f"127.0.0.1:{grpc_server[0].port}")
        yield server.url, state


def _extension_routes(state: SampleState) -> list[Route]:
    async def agent_config(request: Request) -> JSONResponse:
        if request.method == "POST":
            state.config.update(await request.json())
        return JSONResponse({"config": state.config})

    async def trajectory(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"trajectory": state.trajectories.get(body.get("task_id"), [])})

    return [Route(DEFAULT_ENDPOINTS[AGENT_CONFIG_URI], agent_config, methods=["GET", "POST"]),
            Route(DEFAULT_ENDPOINTS[TRAJECTORY_URI], trajectory, methods=["POST"])]


def _v03_jsonrpc(handler: DefaultRequestHandler):
    """JSON-RPC with the 0.3 methods only (``message/send``, ``tasks/get`` ...), through the
    SDK's 0.3 adapter; a 1.0 method name is not found."""
    adapter = JSONRPC03Adapter(handler)

    async def endpoint(request: Request):
        body = await request.json()
        method = body.get("method")
        if not adapter.supports_method(method):
            return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"),
                                 "error": {"code": -32601, "message": f"Method not found: {method}"}})
        return await adapter.handle_request(body.get("id"), method, body, request)

    return endpoint


async def _start_grpc(version: str, handler: DefaultRequestHandler, state: SampleState):
    """The SDK's gRPC servicer for ``version`` on a free port of 127.0.0.1 (its ``port`` set)."""
    from a2a.compat.v0_3 import a2a_v0_3_pb2_grpc
    from a2a.compat.v0_3.grpc_handler import CompatGrpcHandler
    from a2a.server.request_handlers import GrpcHandler
    from a2a.types import a2a_pb2_grpc

    server = grpc.aio.server(interceptors=[_GrpcRecorder(state)])
    server.port = server.add_insecure_port("127.0.0.1:0")
    if version == "1.0":
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    else:
        a2a_v0_3_pb2_grpc.add_A2AServiceServicer_to_server(CompatGrpcHandler(handler), server)
    await server.start()
    return server


class _Recorder:
    """ASGI middleware: each A2A request's JSON-RPC method (or REST path) and A2A-Version."""

    def __init__(self, app, state: SampleState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(("/ext/", "/.well-known/")):
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        method = scope["path"]
        if scope["path"].endswith("/jsonrpc"):
            with contextlib.suppress(ValueError, AttributeError):
                method = json.loads(body).get("method")
        self.state.calls.append((method, headers.get("a2a-version")))
        delivered = False

        async def replay():
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


class _GrpcRecorder(grpc.aio.ServerInterceptor):
    """gRPC server interceptor: each call's method and ``a2a-version`` metadata."""

    def __init__(self, state: SampleState) -> None:
        self.state = state

    async def intercept_service(self, continuation, details):
        metadata = dict(details.invocation_metadata or ())
        self.state.calls.append((details.method, metadata.get("a2a-version")))
        return await continuation(details)
