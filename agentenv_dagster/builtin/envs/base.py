"""Declare a local env once: its MCP tools, its data plane and its card on one Starlette app.

An env is a name, a state object and a few MCP tools over that state. This module adds the rest
of the upstream agent-env wire contract, so each env file holds only what is particular to it:

- ``POST /agentenv``: the JSON-RPC 2.0 data plane (``data/reset``, ``data/add``, ``data/get``)
  with upstream's error envelopes, always answered with HTTP 200;
- ``GET /.well-known/agent-env.json``: the env card;
- ``/mcp``: the MCP tools over streamable HTTP (stateless, JSON responses).
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path
from typing import Any, Callable, Protocol
from urllib.parse import unquote, urlparse

from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

CARD_PATH = "/.well-known/agent-env.json"
RPC_PATH = "/agentenv"
MCP_PATH = "/mcp"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_ERROR = -32000


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


class EnvApp:
    """One env: register its tools with ``@env.tool``, then serve ``env.starlette_app()``."""

    def __init__(self, name: str, state: EnvState):
        self.name = name
        self.state = state
        # Tool failures the env raised on purpose are logged at INFO; keep server.log for surprises.
        self.mcp = MCPServer(name, log_level="WARNING")
        self._operations: dict[str, Callable[[Any], dict[str, Any]]] = {
            "data/reset": self._reset,
            "data/add": self._add,
            "data/get": self._get,
        }
        self.mcp.custom_route(RPC_PATH, methods=["POST"])(self._data_plane)
        self.mcp.custom_route(CARD_PATH, methods=["GET"])(self._card)

    def tool(self, fn: Callable) -> Callable:
        """Register ``fn`` as an MCP tool; its signature and docstring become the tool schema."""
        self.mcp.tool()(fn)
        return fn

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
            "capabilities": {"tools": tools, "operations": list(self._operations), "extensions": []},
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
        self.state.add([decode_part(part, f"parts[{i}]") for i, part in enumerate(parts)])
        return {}

    def _get(self, params: Any) -> dict[str, Any]:
        return {"parts": [{"kind": "data", "data": self.state.get()}]}


def decode_part(part: Any, where: str = "part") -> dict[str, Any]:
    """The JSON object a Part carries: a DataPart's ``data``, or a FilePart's content as JSON.

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
    content = _file_content(file, name)
    try:
        document = json.loads(content)
    except ValueError as exc:
        raise ValueError(f"{name}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ValueError(f"{name}: expected a JSON object, got {type(document).__name__}")
    return document


def _file_content(file: dict[str, Any], name: str) -> bytes:
    if isinstance(file.get("bytes"), str):
        try:
            return base64.b64decode(file["bytes"], validate=True)
        except binascii.Error as exc:
            raise ValueError(f"{name}: bytes are not base64 ({exc})") from None
    uri = urlparse(file["uri"])
    if uri.scheme != "file":
        raise ValueError(f"{name}: only file:// URIs can be read by a local env")
    return Path(unquote(uri.path)).read_bytes()


def _rpc_error(rid: Any, code: int, message: str, data: Any = None) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": error})
