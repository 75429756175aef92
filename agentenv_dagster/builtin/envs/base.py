"""Declare a local env once: its MCP tools, its data plane and its card on one Starlette app.

An env is a name, a state object and a few MCP tools over that state. This module adds the rest
of the upstream agent-env wire contract, so each env file holds only what is particular to it:

- ``POST /agentenv``: the JSON-RPC 2.0 data plane (``data/reset``, ``data/add``, ``data/get``)
  with upstream's error envelopes, always answered with HTTP 200; a ``file://`` Part is read
  only under the folders the env was given (``file_roots``: the run's artifact folders);
- ``GET /.well-known/agent-env.json``: the env card;
- ``/mcp``: the MCP tools over streamable HTTP (stateless, JSON responses);
- the control surface of upstream's gateway, which an embedded env is for itself: the virtual
  clock (``/clock/set-time|time|state|clear``, ``urn:agentenv:clock/v1``, with ``sync_time`` at
  ``/agentenv/ext/sync_time``) and triggers (``/triggers/register|remove|clear|state``,
  ``urn:agentenv:triggers/v1``). Both are advertised on the card. While the clock is armed the
  env's tools and data read virtual time (``env.now()``) and a ``get_time`` tool is served.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol
from urllib.parse import unquote, urlparse

import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from .clock import ClockError, VirtualClock, iso
from .triggers import DEFAULT_ROLE, ROLE_HEADER, TriggerEngine, TriggerError

CARD_PATH = "/.well-known/agent-env.json"
RPC_PATH = "/agentenv"
MCP_PATH = "/mcp"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000

CLOCK_URI = "urn:agentenv:clock/v1"
TRIGGERS_URI = "urn:agentenv:triggers/v1"
SYNC_TIME_PATH = f"{RPC_PATH}/ext/sync_time"
GET_TIME_TOOL = "get_time"
GET_TIME_DESCRIPTION = (
    "Returns the current date and time in this environment. The clock of the machine you run on "
    "is not this environment's: derive every date, time and relative phrase (today, this week, "
    "overdue) from this tool's value, and read it again before each write."
)
EXTENSIONS = [
    {"uri": CLOCK_URI, "description": "Virtual clock: set, read and clear the time the env's tools see.",
     "required": False, "params": {"endpoint": "/clock", "methods": {
         "sync_time": {"method": "POST", "endpoint": SYNC_TIME_PATH,
                       "request": {"required": ["env_get_time_url"]}},
         "set_time": {"method": "PUT", "endpoint": "/clock/set-time",
                      "request": {"required": ["virtual_time"], "optional": ["virtual_seconds_per_real_second"]}},
         "time": {"method": "GET", "endpoint": "/clock/time"},
         "state": {"method": "GET", "endpoint": "/clock/state"},
         "clear": {"method": "POST", "endpoint": "/clock/clear"}}}},
    {"uri": TRIGGERS_URI, "description": "Triggers: conditions on the env's tool calls, state or clock that run "
                                         "actions (tool calls, or a prompt to an executor agent).",
     "required": False, "params": {"endpoint": "/triggers", "methods": {
         "register": {"method": "POST", "endpoint": "/triggers/register",
                      "request": {"required": ["triggers"], "optional": ["watch_roles", "executor"]}},
         "remove": {"method": "POST", "endpoint": "/triggers/remove", "request": {"required": ["ids"]}},
         "clear": {"method": "POST", "endpoint": "/triggers/clear"},
         "state": {"method": "GET", "endpoint": "/triggers/state"}}}},
]


class EnvState(Protocol):
    """The state behind an env's tools, driven by the data plane.

    ``add`` receives the JSON object each added Part carries (see ``decode_part``) and should
    check them all before it changes anything, so a rejected ``data/add`` leaves no half load.
    """

    def reset(self) -> None: ...

    def add(self, documents: list[dict[str, Any]]) -> None: ...

    def get(self) -> dict[str, Any]: ...


class InvalidParams(Exception):
    """The request itself is malformed (-32602), as opposed to data the env rejects (-32000)."""


class _WatchedMCPServer(MCPServer):
    """Tells the env of every client tool call (with the caller's role) once it has answered;
    the env's own calls (``context`` None: trigger checks and actions) are not reported."""

    on_tool_call: Callable[[str, str, dict, bool, Any], None] | None = None

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if context is None or self.on_tool_call is None:
            return await super().call_tool(name, arguments, context)
        role = (context.headers or {}).get(ROLE_HEADER) or DEFAULT_ROLE
        try:
            result = await super().call_tool(name, arguments, context)
        except Exception:
            self.on_tool_call(role, name, arguments, True, None)
            raise
        self.on_tool_call(role, name, arguments, bool(getattr(result, "is_error", False)), _result_data(result))
        return result


class EnvApp:
    """One env: register its tools with ``@env.tool``, then serve ``env.starlette_app()``."""

    def __init__(self, name: str, state: EnvState):
        self.name = name
        self.state = state
        self.file_roots: tuple[Path, ...] = ()  # where data/add may read file:// Parts (none: refused)
        # Tool failures the env raised on purpose are logged at INFO; keep server.log for surprises.
        self.mcp = _WatchedMCPServer(name, log_level="WARNING")
        self.clock = VirtualClock()
        self.triggers = TriggerEngine(self.clock, self._internal_call, lambda: set(self._tools))
        self.mcp.on_tool_call = self.triggers.on_tool_call
        self._tools: list[str] = []
        self._operations: dict[str, Callable[[Any], dict[str, Any]]] = {
            "data/reset": self._reset,
            "data/add": self._add,
            "data/get": self._get,
        }
        routes = [
            (RPC_PATH, "POST", self._data_plane), (CARD_PATH, "GET", self._card),
            ("/clock/set-time", "PUT", self._clock_set), ("/clock/time", "GET", self._clock_time),
            ("/clock/state", "GET", self._clock_state), ("/clock/clear", "POST", self._clock_clear),
            (SYNC_TIME_PATH, "POST", self._sync_time),
            ("/triggers/register", "POST", self._triggers_call(self.triggers.register)),
            ("/triggers/remove", "POST", self._triggers_call(self.triggers.remove)),
            ("/triggers/clear", "POST", self._triggers_call(lambda body: self.triggers.clear())),
            ("/triggers/state", "GET", self._triggers_state),
        ]
        for path, method, handler in routes:
            self.mcp.custom_route(path, methods=[method])(handler)

    def tool(self, fn: Callable) -> Callable:
        """Register ``fn`` as an MCP tool; its signature and docstring become the tool schema."""
        self.mcp.tool()(fn)
        self._tools.append(fn.__name__)
        return fn

    def now(self) -> datetime:
        """The time the env's tools and data see: virtual while the clock is armed, else wall."""
        return self.clock.now() or datetime.now(timezone.utc)

    def now_iso(self) -> str:
        return iso(self.now())

    def starlette_app(self) -> Starlette:
        # Stateless JSON: every call stands alone, so any client (or a restarted one) can call.
        return self.mcp.streamable_http_app(
            streamable_http_path=MCP_PATH, stateless_http=True, json_response=True
        )

    async def _card(self, request: Request) -> JSONResponse:
        tools = [tool.name for tool in await self.mcp.list_tools()]
        return JSONResponse({
            "name": self.name,
            "protocolVersion": "1.0",
            "url": RPC_PATH,
            "capabilities": {"tools": tools, "operations": list(self._operations), "extensions": EXTENSIONS},
            "children_environments": [],
            "additionalInterfaces": [{"transport": "mcp", "url": MCP_PATH}],
        })

    async def _data_plane(self, request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            message = json.loads(raw) if raw else None
        except ValueError:
            return _rpc_error(None, PARSE_ERROR, "parse error")
        rid = message.get("id") if isinstance(message, dict) else None
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return _rpc_error(rid, INVALID_REQUEST, "invalid request")
        method = message["method"]
        operation = self._operations.get(method)
        if operation is None:
            return _rpc_error(rid, METHOD_NOT_FOUND, f"method not found: {method}")
        try:
            result = operation(message.get("params") or {})
        except InvalidParams as exc:
            return _rpc_error(rid, INVALID_PARAMS, "invalid_request", {"detail": str(exc)})
        except Exception as exc:  # the env refused the data: upstream's -32000 with a failure code
            code = method.removeprefix("data/") + "_failed"
            return _rpc_error(rid, SERVER_ERROR, str(exc), {"code": code})
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result})

    def _reset(self, params: Any) -> dict[str, Any]:
        self.state.reset()
        return {}

    def _add(self, params: Any) -> dict[str, Any]:
        parts = params.get("parts") if isinstance(params, dict) else None
        if not isinstance(parts, list) or not parts:
            raise InvalidParams("params.parts must be a non-empty list of Parts")
        self.state.add([decode_part(part, f"parts[{i}]", self.file_roots) for i, part in enumerate(parts)])
        self.triggers.on_state_change({"source": "data/add"})  # new data may meet a state trigger
        return {}

    def _get(self, params: Any) -> dict[str, Any]:
        return {"parts": [{"kind": "data", "data": self.state.get()}]}


    # -- clock --------------------------------------------------------------------------------
    async def _clock_set(self, request: Request) -> JSONResponse:
        body = await _json_body(request)
        try:
            state = self.clock.set_time(body.get("virtual_time"), body.get("virtual_seconds_per_real_second", 1.0))
        except ClockError as exc:
            return _invalid(str(exc))
        if GET_TIME_TOOL not in self._tools:  # served only while armed, as upstream's gateway
            self.mcp.add_tool(self._get_time, name=GET_TIME_TOOL, description=GET_TIME_DESCRIPTION,
                              annotations=ToolAnnotations(readOnlyHint=True))
            self._tools.append(GET_TIME_TOOL)
        self.triggers.on_clock_tick()
        return JSONResponse({**state, "env_get_time_url": _time_url(request)})

    async def _clock_time(self, request: Request) -> JSONResponse:
        try:
            return JSONResponse(self.clock.read())
        except ClockError as exc:
            return JSONResponse({"ok": False, "error": {"code": "not_armed", "message": str(exc)}}, status_code=404)

    async def _clock_state(self, request: Request) -> JSONResponse:
        return JSONResponse({**self.clock.state(), "env_get_time_url": _time_url(request)})

    async def _clock_clear(self, request: Request) -> JSONResponse:
        if GET_TIME_TOOL in self._tools:
            self.mcp.remove_tool(GET_TIME_TOOL)
            self._tools.remove(GET_TIME_TOOL)
        return JSONResponse(self.clock.clear())

    async def _sync_time(self, request: Request) -> JSONResponse:
        """clock/v1 ``sync_time``: an embedded env is its own gateway, so syncing proves the
        handed clock URL answers and reports the virtual time read there."""
        url = (await _json_body(request)).get("env_get_time_url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            return _invalid("env_get_time_url must be an http(s) URL")
        # its own clock (as the gateway hands it) takes the caller's credential; no other URL does
        asked, this = urlparse(url), urlparse(str(request.base_url))
        own = (asked.scheme, asked.hostname, asked.port) == (this.scheme, this.hostname, this.port)
        headers = {"Authorization": request.headers["authorization"]} if own and "authorization" in request.headers else {}
        async with httpx.AsyncClient(timeout=10) as http:
            response = await http.get(url, headers=headers)
        if response.status_code >= 400:
            return _invalid(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
        return JSONResponse({"env_get_time_url": url, "virtual_time": response.json().get("virtual_time")})

    def _get_time(self) -> dict[str, str]:
        return {"current_time": self.now_iso()}

    # -- triggers -----------------------------------------------------------------------------
    def _triggers_call(self, operation: Callable[[Any], dict]) -> Callable:
        async def handler(request: Request) -> JSONResponse:
            try:
                return JSONResponse(operation(await _json_body(request)))
            except TriggerError as exc:
                return _invalid(str(exc))
        return handler

    async def _triggers_state(self, request: Request) -> JSONResponse:
        self.triggers.on_clock_tick()
        return JSONResponse(self.triggers.state())

    async def _internal_call(self, name: str, arguments: dict) -> tuple[bool, Any, str]:
        """One of the env's own tools, called by a trigger: (is_error, parsed result, text)."""
        try:
            result = await self.mcp.call_tool(name, arguments)
        except ToolError as exc:
            return True, None, str(exc)
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        return bool(result.is_error), _result_data(result), text


def _result_data(result: Any) -> Any:
    """A tool result as data: its structured content, else its text parsed as JSON, else the text."""
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return structured
    text = "\n".join(getattr(block, "text", "") for block in getattr(result, "content", None) or [])
    try:
        return json.loads(text)
    except ValueError:
        return text or None


def _time_url(request: Request) -> str:
    """The env's ``/clock/time`` as the caller reached the env (what ``sync_time`` is handed)."""
    return f"{str(request.base_url).rstrip('/')}/clock/time"


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {}


def _invalid(message: str) -> JSONResponse:
    """Upstream's answer to bad extension arguments: HTTP 400, ``invalid_params``."""
    return JSONResponse({"ok": False, "error": {"code": "invalid_params", "message": message}}, status_code=400)


def decode_part(part: Any, where: str = "part", file_roots: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The JSON object a Part carries: a DataPart's ``data``, or a FilePart's content as JSON
    (a ``file://`` one only under ``file_roots``).

    Every built-in env loads JSON documents, so the data plane decodes Parts here, once. A
    malformed Part raises ``InvalidParams``; content the env cannot read raises ``ValueError``
    or ``OSError``.
    """
    kind = part.get("kind") if isinstance(part, dict) else None
    if kind == "data":
        if not isinstance(part.get("data"), dict):
            raise InvalidParams(f"{where}: a data Part needs a 'data' object")
        return part["data"]
    if kind == "text":
        raise ValueError(f"{where}: text Parts carry no env data; send a data or file Part")
    if kind != "file":
        raise InvalidParams(f"{where}: not a Part (kind must be 'data', 'file' or 'text')")
    file = part.get("file")
    if not isinstance(file, dict) or not any(isinstance(file.get(k), str) for k in ("bytes", "uri")):
        raise InvalidParams(f"{where}: a file Part needs 'file' with 'bytes' or 'uri'")
    name = f"{where} ({file.get('name') or file.get('uri') or 'inline bytes'})"
    content = _file_content(file, name, file_roots)
    try:
        document = json.loads(content)
    except ValueError as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(document).__name__}")
    return document


def _file_content(file: dict[str, Any], name: str, file_roots: tuple[Path, ...]) -> bytes:
    if isinstance(file.get("bytes"), str):
        try:
            return base64.b64decode(file["bytes"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{name}: bytes are not base64 ({exc})") from None
    uri = urlparse(file["uri"])
    if uri.scheme != "file":
        raise ValueError(f"{name}: only file:// URIs can be read by a local env")
    # decided before anything is read, the same way whether the file exists or not
    path = os.path.realpath(unquote(uri.path))
    if not any(path.startswith(os.path.realpath(root).rstrip(os.sep) + os.sep) for root in file_roots):
        raise ValueError(f"{name}: a local env reads file:// URIs only under the run's artifact folders")
    return Path(path).read_bytes()


def _rpc_error(rid: Any, code: int, message: str, data: Any = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": error})
