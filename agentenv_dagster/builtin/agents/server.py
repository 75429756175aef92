"""The A2A server every embedded agent shares; only its ``Brain`` differs.

The server owns everything around the model loop: the agent card and the agentenv
extensions (MCP registration, agent config, skills, trajectories, triggers), one MCP connection per
registered env for the length of a task, the trajectory of each task, and turning the
brain's outcome into a completed or failed A2A task whose status message carries the reply
text and a data part (tool_call_count, usage, model, error_type/error_message).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

from a2a.helpers import new_data_part, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentExtension, AgentInterface, AgentSkill
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.builtin.agents.triggers import AgentTriggers, TriggerError
from agentenv_dagster.builtin.serving import serve
from agentenv_dagster.runtime.a2a_client import (
    AGENT_CONFIG_URI,
    CARD_PATHS,
    DEFAULT_ENDPOINTS,
    MCP_CONFIG_URI,
    SKILL_CONFIG_URI,
    TRAJECTORY_URI,
    TRIGGERS_DECIDE_ENDPOINT,
    TRIGGERS_URI,
    trajectory_metadata,
    whole_numbers,
)
from agentenv_dagster.runtime.sandbox import LocalSandbox

# agent-config fields a client may set, with the JSON types they accept (null unsets).
CONFIG_FIELDS: dict[str, type | tuple[type, ...]] = {
    "model": str, "system_prompt": str, "max_turns": int, "timeout_seconds": (int, float),
    "task_id": str, "model_params": dict, "name": str, "description": str, "role": str,
    "stop_early": dict,
}
PLACEHOLDER_URL = "http://127.0.0.1/"


class AgentFailure(Exception):
    """A brain gave up; ``error_type`` reaches the client in the reply's data part."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


class EarlyStop(Exception):
    """The stop_early watcher settled the run: the turn ends at this tool-call boundary."""


@dataclass(frozen=True)
class Reply:
    text: str


@dataclass(frozen=True)
class Tool:
    name: str  # mcp__<alias>__<tool>
    description: str
    input_schema: dict


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    is_error: bool


class Brain(Protocol):
    """What differs between agents: turn a prompt into a reply using the session's tools."""

    async def run(self, prompt: str, session: TaskSession) -> Reply: ...


class TaskSession:
    """One task as a brain sees it: config, skills, sandbox, MCP tools, and the trajectory
    (every tool call goes through here, so it is recorded and counted)."""

    def __init__(self, config: dict, skills: list[dict], sandbox: LocalSandbox,
                 workspace: dict | None = None) -> None:
        self.config = dict(config)
        self.skills = list(skills)
        self.sandbox = sandbox
        self.tools: list[Tool] = []
        self._workspace = workspace
        if workspace is not None:
            from agentenv_dagster.builtin.agents.workspace import WORKSPACE_TOOLS

            self.tools += WORKSPACE_TOOLS
        self.events: list[dict] = []
        self.context_id: str | None = None  # the A2A context: a brain keeps a conversation per context
        self.tool_call_count = 0
        self.model = ""
        self.usage = {"input_tokens": 0, "output_tokens": 0}
        self._routes: dict[str, tuple[Any, str]] = {}
        self.mcp_servers: list[dict] = []  # name, url, headers: what an external CLI agent connects to itself
        self.watcher: Any = None  # an EarlyStopWatcher when the task arms stop_early

    def turn_started(self) -> None:
        """A brain begins a model turn (an assistant message); the watcher counts them."""
        if self.watcher is not None:
            self.watcher.turn_started()

    async def connect(self, stack: AsyncExitStack, servers: list[dict]) -> None:
        """Open every registered MCP server for the task's lifetime and list its tools."""
        self.mcp_servers = list(servers)
        if not servers:
            return
        # Imported on first use, so agents start fast; httpx2 is the HTTP client mcp uses.
        import httpx2
        import mcp
        from mcp.client.streamable_http import streamable_http_client

        for server in servers:
            target: Any = server["url"]
            try:
                if server.get("headers"):  # mcp's documented way to send headers
                    http = await stack.enter_async_context(httpx2.AsyncClient(
                        headers=server["headers"], timeout=httpx2.Timeout(30.0, read=300.0)))
                    target = streamable_http_client(server["url"], http_client=http)
                client = await stack.enter_async_context(mcp.Client(target))
                tools, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools += page.tools
                    if not (cursor := page.next_cursor):
                        break
            except Exception as exc:
                raise AgentFailure(
                    "MCPConnectionError",
                    f"MCP server '{server['name']}' at {server['url']}: {_root(exc)!r}",
                ) from exc
            for tool in tools:
                name = f"mcp__{server['name']}__{tool.name}"
                self._routes[name] = (client, tool.name)
                self.tools.append(Tool(name, tool.description or "", dict(tool.input_schema)))

    async def call_tool(self, name: str, arguments: dict) -> ToolOutcome:
        """Call a tool by its full name or, when unambiguous, its bare MCP name; an unknown
        name is an error result (what a model should see), not an exception."""
        full = name if name in self._routes else None
        if full is None:
            matches = [n for n in self._routes if n.endswith(f"__{name}")]
            full = matches[0] if len(matches) == 1 else None
        started, clock = datetime.now(timezone.utc), time.monotonic()
        call_id = f"call-{self.tool_call_count + 1}"
        if self.tool_started(call_id, full or name, arguments):
            # settled before it ran: recorded as dispatched but never resolved, then the turn ends
            self.tool_call_count += 1
            self.record({"type": "tool_call", "name": full or name, "arguments": arguments,
                         "started_at": started.isoformat(), "duration_seconds": 0.0, "is_error": False,
                         "status": "unknown", "result": "not run: the stop_early watcher ended the turn"})
            raise EarlyStop()
        if self._workspace is not None and full is None and name in _workspace_tool_names():
            from agentenv_dagster.builtin.agents.workspace import call_workspace_tool

            full = name
            outcome = await call_workspace_tool(self.sandbox, self.skills, name, arguments, self._workspace)
        elif full is None:
            outcome = ToolOutcome(f"Unknown tool '{name}'; available: {sorted(self._routes)}", True)
        else:
            client, bare = self._routes[full]
            result = await client.call_tool(bare, arguments)
            text = "\n".join(getattr(block, "text", "") for block in result.content)
            outcome = ToolOutcome(text, bool(result.is_error))
        self.tool_call_count += 1
        self.record({
            "type": "tool_call", "name": full or name, "arguments": arguments,
            "started_at": started.isoformat(), "duration_seconds": time.monotonic() - clock,
            "is_error": outcome.is_error, "result": outcome.text,
        })
        if self.tool_ended(call_id, full or name, arguments, outcome.is_error):
            raise EarlyStop()
        return outcome

    def tool_started(self, call_id: str, name: str, arguments: dict) -> bool:
        """A call is dispatched (here, or by a coding CLI that runs its own tools): whether
        the stop_early watcher ends the turn before it resolves."""
        return self.watcher is not None and self.watcher.tool_started(call_id, _call(name, arguments, None))

    def tool_ended(self, call_id: str, name: str, arguments: dict, is_error: bool) -> bool:
        """A call resolved: whether the stop_early watcher ends the turn now."""
        status = "error" if is_error else "success"
        return self.watcher is not None and self.watcher.tool_ended(call_id, _call(name, arguments, status))

    def record(self, event: dict) -> None:
        self.events.append(event)

    def record_message(self, role: str, text: str) -> None:
        self.record({"type": "message", "role": role, "text": text})


class EmbeddedAgent(AgentExecutor):
    """Runs tasks with a brain and serves the agentenv extensions around it."""

    def __init__(self, brain: Brain, sandbox: LocalSandbox, workspace: dict | None = None) -> None:
        self.brain = brain
        self.sandbox = sandbox
        self.workspace = workspace
        self.mcp_servers: list[dict] = []
        self.config: dict[str, Any] = {}
        self.skills: list[dict] = []
        self.trajectories: dict[str, list[dict]] = {}
        self.task_contexts: dict[str, str] = {}
        self.watcher: Any = None  # built from agent-config stop_early; kept across a task's retries
        self.agent_triggers = AgentTriggers()
        self._running: set[asyncio.Task] = set()

    def cancel_running(self) -> int:
        """Cancel every task in progress (the agent is being ended); how many there were."""
        running = [t for t in self._running if not t.done()]
        for task in running:
            task.cancel()
        return len(running)

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        current = asyncio.current_task()
        if current is not None:
            self._running.add(current)
            current.add_done_callback(self._running.discard)
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        refused = self.set_config(carried) if (carried := _carried_config(context)) is not None else None
        if refused is not None:  # as a POSTed agent-config would have been: before any work
            parts = [new_text_part(f"AgentConfigError: {refused}"),
                     new_data_part({"error_type": "AgentConfigError", "error_message": refused})]
            await updater.failed(updater.new_agent_message(parts))
            return
        session = TaskSession(self.config, self.skills, self.sandbox, self.workspace)
        session.context_id = task.context_id
        session.watcher = self.watcher
        self.trajectories[task.id] = session.events
        self.task_contexts[task.id] = task.context_id
        prompt = context.get_user_input()
        session.record_message("user", prompt)
        timeout_seconds = session.config.get("timeout_seconds")
        try:
            async with AsyncExitStack() as stack, asyncio.timeout(timeout_seconds):
                await session.connect(stack, self.mcp_servers)
                try:
                    reply = await self.brain.run(prompt, session)
                except EarlyStop:  # the stop is the outcome: no final reply, the trajectory so far
                    reply = Reply("")
        except Exception as exc:  # any failure becomes a FAILED task the client can read
            error_type, message = _describe(exc, timeout_seconds)
            session.record({"type": "error", "error_type": error_type, "error_message": message})
            data = {**_reply_data(session), "error_type": error_type, "error_message": message}
            parts = [new_text_part(f"{error_type}: {message}"), new_data_part(data)]
            await updater.failed(updater.new_agent_message(parts, _reply_metadata(context, session)))
            return
        finally:
            if self.watcher is not None:
                self.watcher.attempt_ended()
        session.record_message("assistant", reply.text)
        parts = [new_text_part(reply.text), new_data_part(_reply_data(session))]
        await updater.complete(updater.new_agent_message(parts, _reply_metadata(context, session)))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """Nothing to do: the SDK cancels ``execute`` (closing its MCP connections) and
        records the CANCELED state itself."""

    async def mcp_config(self, request: Request) -> JSONResponse:
        if request.method == "GET":
            listed = [{"name": s["name"], "url": s["url"]} for s in self.mcp_servers]
            return JSONResponse({"mcp_servers": listed})
        body = await _json_object(request)
        url, name, headers = body.get("url"), body.get("name"), body.get("headers") or {}
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return _bad_request("'url' must be an http(s) URL")
        if not isinstance(name, str | None) or not isinstance(headers, dict):
            return _bad_request("'name' must be a string and 'headers' an object")
        alias = re.sub(r"[^A-Za-z0-9_-]", "_", name or f"env{len(self.mcp_servers) + 1}")
        entry = {"name": alias, "url": url, "headers": headers}
        self.mcp_servers = [s for s in self.mcp_servers if s["name"] != alias] + [entry]
        return JSONResponse({"name": alias, "url": entry["url"]})

    async def agent_config(self, request: Request) -> JSONResponse:
        if request.method == "POST" and (refused := self.set_config(await _json_object(request))):
            return _bad_request(refused)
        return JSONResponse({"config": self.config})

    def set_config(self, body: Any) -> str | None:
        """Apply an agent-config ``set`` (POSTed, or carried by a prompt); why it is refused,
        or None when applied."""
        if not isinstance(body, dict):
            return f"an agent-config set is a JSON object, got {type(body).__name__}"
        unknown = sorted(set(body) - set(CONFIG_FIELDS))
        mistyped = sorted(k for k, v in body.items() if k in CONFIG_FIELDS
                          and v is not None and not isinstance(v, CONFIG_FIELDS[k]))
        if unknown or mistyped:
            return (f"unsupported agent-config fields: {unknown}" if unknown
                    else f"agent-config fields of the wrong type: {mistyped}")
        if "stop_early" in body and body["stop_early"] != self.config.get("stop_early"):
            try:
                self.watcher = _build_watcher(body["stop_early"], body.get("max_turns", self.config.get("max_turns")))
            except ValueError as exc:
                return f"stop_early: {exc}"
        self.config = {k: v for k, v in {**self.config, **body}.items() if v is not None}
        return None

    async def skill_config(self, request: Request) -> JSONResponse:
        if request.method == "POST":
            body = await _json_object(request)
            skill_md = body.get("skill_md") or body.get("content")
            if not isinstance(body.get("name"), str) or not isinstance(skill_md, str):
                return _bad_request("a skill needs 'name' and inline 'skill_md'")
            skill = {"name": body["name"], "description": body.get("description") or "",
                     "skill_md": skill_md}
            self.skills = [s for s in self.skills if s["name"] != skill["name"]] + [skill]
        return JSONResponse({"skills": self.skills})

    async def trajectory(self, request: Request) -> JSONResponse:
        """Events of one task, or of every task in a context (``{"context_id": ...}``)."""
        body = await _json_object(request)
        if body.get("task_id") in self.trajectories:
            return JSONResponse({"trajectory": self.trajectories[body["task_id"]]})
        tasks = [t for t, c in self.task_contexts.items() if c == body.get("context_id")]
        if not tasks:
            return JSONResponse({"error": f"no trajectory for {body}"}, status_code=404)
        return JSONResponse({"trajectory": [e for t in tasks for e in self.trajectories[t]]})

    async def triggers(self, request: Request) -> JSONResponse:
        """Register triggers (POST) or read them and the firing log (GET)."""
        if request.method == "GET":
            return JSONResponse(self.agent_triggers.state())
        return _triggers_answer(self.agent_triggers.register, await _json_object(request))

    async def triggers_decide(self, request: Request) -> JSONResponse:
        return _triggers_answer(self.agent_triggers.decide, await _json_object(request))


def _call(name: str, arguments: dict, status: str | None):
    from agentenv_dagster.criteria import ToolCall

    return ToolCall(name, arguments, status, skill=arguments.get("skill") if name == "Skill" else None)


def _build_watcher(config: dict | None, max_turns: int | None):
    """The watcher a task's armed criteria need (None unsets it)."""
    if config is None:
        return None
    from agentenv_dagster.criteria.early_stop import EarlyStopWatcher

    return EarlyStopWatcher.from_config(config, max_turns=max_turns)


def _workspace_tool_names() -> frozenset[str]:
    from agentenv_dagster.builtin.agents.workspace import NAMES

    return NAMES


def _root(exc: BaseException) -> BaseException:
    """The first real cause inside (nested) exception groups, which say nothing themselves."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _describe(exc: Exception, timeout_seconds: float | None) -> tuple[str, str]:
    """The ``error_type`` and ``error_message`` a client reads from a failed task."""
    exc = _root(exc)
    if isinstance(exc, AgentFailure):
        return exc.error_type, str(exc)
    if isinstance(exc, TimeoutError) and timeout_seconds:
        return "AgentTimeout", f"no reply within timeout_seconds={timeout_seconds:g}"
    return type(exc).__name__, str(exc) or repr(exc)


def _carried_config(context: RequestContext) -> Any:
    """The agent-config ``set`` a prompt carries in its metadata, or None. Numbers come back
    as the client sent them: a Struct turns 3 into 3.0, which an int field would refuse."""
    message = context.message
    if message is None or AGENT_CONFIG_URI not in message.extensions or AGENT_CONFIG_URI not in message.metadata:
        return None
    return whole_numbers(json_format.MessageToDict(message.metadata)[AGENT_CONFIG_URI])


def _reply_metadata(context: RequestContext, session: TaskSession) -> dict | None:
    """The task's trajectory on its reply, when the client asked for it (``A2A-Extensions``)."""
    return trajectory_metadata(session.events) if TRAJECTORY_URI in context.requested_extensions else None


def _reply_data(session: TaskSession) -> dict:
    data = {"tool_call_count": session.tool_call_count, "usage": session.usage, "model": session.model}
    if session.watcher is not None and session.watcher.info is not None:
        data["early_stop"] = session.watcher.info
    return data


async def _json_object(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {}


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=400)


def _triggers_answer(operation, body: dict) -> JSONResponse:
    try:
        return JSONResponse(operation(body))
    except TriggerError as exc:
        return _bad_request(str(exc))


def _extension(uri: str, description: str, methods: dict) -> AgentExtension:
    extension = AgentExtension(uri=uri, description=description)
    extension.params.update({"endpoint": DEFAULT_ENDPOINTS[uri], "methods": methods})
    return extension


def build_card(name: str, description: str) -> AgentCard:
    """The card; ``run_agent`` replaces the placeholder URL once the port is known."""
    extensions = [
        _extension(MCP_CONFIG_URI, "Register MCP servers whose tools the agent may use", {
            "add": {"method": "POST",
                    "request": {"required": ["url"], "optional": ["headers", "name"]}},
            "list": {"method": "GET"}}),
        _extension(AGENT_CONFIG_URI, "Set the model, system prompt, limits and identity "
                   "(also carried by a prompt, in its metadata under this URI)", {
            "set": {"method": "POST", "in_message": True, "request": {"supported": list(CONFIG_FIELDS)}},
            "get": {"method": "GET"}}),
        _extension(SKILL_CONFIG_URI, "Add inline skills", {
            "add": {"method": "POST",
                    "request": {"required": ["name", "skill_md"], "optional": ["description"]}},
            "list": {"method": "GET"}}),
        _extension(TRAJECTORY_URI, "Read the events of a task (or ask for them on the reply: "
                   "A2A-Extensions header, reply metadata under this URI)", {
            "get": {"method": "POST", "request": {"optional": ["task_id", "context_id"]}}}),
        _extension(TRIGGERS_URI, "Scripted stakeholder reactions: register triggers, decide which fire on a turn", {
            "register": {"method": "POST", "request": {"required": ["triggers"]}},
            "decide": {"method": "POST", "endpoint": TRIGGERS_DECIDE_ENDPOINT,
                       "request": {"required": ["turn"], "optional": ["solver_message", "context_id", "env_triggers"]}},
            "state": {"method": "GET"}}),
    ]
    return AgentCard(
        name=name, description=description, version="1.0.0",
        supported_interfaces=[  # 0.3 too, so the card keeps the top-level ``url`` of 0.3
            AgentInterface(url=PLACEHOLDER_URL, protocol_binding="JSONRPC", protocol_version=v)
            for v in ("1.0", "0.3")
        ],
        capabilities=AgentCapabilities(streaming=False, extensions=extensions),
        default_input_modes=["text/plain"], default_output_modes=["text/plain", "application/json"],
        skills=[AgentSkill(id="task", name=name, description=description, tags=["agentenv"])],
    )


def build_app(agent: EmbeddedAgent, card: AgentCard, card_modifier=None) -> Starlette:
    """The agent's routes; ``card_modifier`` (async, card -> card) adjusts the card per request."""
    handler = DefaultRequestHandler(agent, task_store=InMemoryTaskStore(), agent_card=card)
    routes = [r for path in CARD_PATHS
              for r in create_agent_card_routes(card, card_modifier=card_modifier, card_url=path)]
    routes += create_jsonrpc_routes(handler, rpc_url="/", enable_v0_3_compat=True)
    routes += [
        Route(DEFAULT_ENDPOINTS[MCP_CONFIG_URI], agent.mcp_config, methods=["GET", "POST"]),
        Route(DEFAULT_ENDPOINTS[AGENT_CONFIG_URI], agent.agent_config, methods=["GET", "POST"]),
        Route(DEFAULT_ENDPOINTS[SKILL_CONFIG_URI], agent.skill_config, methods=["GET", "POST"]),
        Route(DEFAULT_ENDPOINTS[TRAJECTORY_URI], agent.trajectory, methods=["POST"]),
        Route(DEFAULT_ENDPOINTS[TRIGGERS_URI], agent.triggers, methods=["GET", "POST"]),
        Route(TRIGGERS_DECIDE_ENDPOINT, agent.triggers_decide, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def run_agent(brain: Brain, sandbox: LocalSandbox, name: str, description: str,
              args: argparse.Namespace, bootstrap: dict, workspace: dict | None = None) -> None:
    """Serve ``brain`` as an A2A agent until SIGTERM, its run's end or the TTL. With
    ``workspace`` settings (``container``, ``path_prepend``, ``env``) it is a coding agent:
    Bash/Write/Read/Skill in its sandbox."""
    from agentenv_dagster.builtin.agents.model_access import MODELS

    card = build_card(name, description)

    def on_ready(url: str) -> None:
        MODELS.host_url = url
        for interface in card.supported_interfaces:
            interface.url = url + "/"

    app = MODELS.in_front_of(build_app(EmbeddedAgent(brain, sandbox, workspace), card))
    serve(app, args, bootstrap, on_ready=on_ready, open_paths=MODELS.is_proxy_path)
