"""Client of an env's data plane: JSON-RPC ``data/reset``, ``data/add``, ``data/get``.

Used by ``deploy_env`` / ``load_artifact`` to seed a deployed env and by snapshots to read it back. Errors keep
upstream's wording: ``"<method> failed: <message> (<data or code>)"``.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx

RPC_PATH = "/agentenv"
MCP_PATH = "/mcp"
CARD_PATH = "/.well-known/agent-env.json"


class DataPlaneError(RuntimeError):
    """A data-plane call failed: a JSON-RPC error, or no usable answer at all."""


class DataPlaneClient:
    """Talks to any env's data plane through one shared ``httpx.AsyncClient`` (its timeouts apply)."""

    def __init__(self, http: httpx.AsyncClient):
        self.http = http

    async def card(self, base_url: str) -> dict[str, Any]:
        """The env card (name, tools, operations) the env serves."""
        response = await self.http.get(f"{base_url.rstrip('/')}{CARD_PATH}")
        response.raise_for_status()
        return response.json()

    async def reset(self, base_url: str) -> None:
        """Clear all of the env's state."""
        await self._call(base_url, "data/reset", {})

    async def add(self, base_url: str, parts: list[dict[str, Any]]) -> None:
        """Load ``parts`` (A2A Part dicts) into the env, on top of what it already holds."""
        await self._call(base_url, "data/add", {"parts": parts})

    async def get(self, base_url: str) -> list[dict[str, Any]]:
        """The env's state, as the Parts it answers with."""
        result = await self._call(base_url, "data/get", {})
        parts = result.get("parts") if isinstance(result, dict) else None
        if not isinstance(parts, list):
            raise DataPlaneError(f"data/get failed: the answer has no parts ({result!r})")
        return parts

    async def _call(self, base_url: str, method: str, params: dict[str, Any]) -> Any:
        url = f"{base_url.rstrip('/')}{RPC_PATH}"
        try:
            response = await self.http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
            response.raise_for_status()
            body = response.json()
        except httpx.HTTPStatusError as exc:
            raise DataPlaneError(f"{method} failed: HTTP {exc.response.status_code} from {url}") from exc
        except httpx.HTTPError as exc:
            raise DataPlaneError(f"{method} failed: {type(exc).__name__} calling {url}: {exc}") from exc
        except ValueError as exc:
            raise DataPlaneError(f"{method} failed: {url} did not answer JSON") from exc
        if not isinstance(body, dict):
            raise DataPlaneError(f"{method} failed: {url} did not answer a JSON-RPC object")
        if "error" in body:
            error = body["error"] if isinstance(body["error"], dict) else {"message": body["error"]}
            raise DataPlaneError(f"{method} failed: {error.get('message')} ({error.get('data') or error.get('code')})")
        return body.get("result")


def file_part_from_bytes(name: str, data: bytes, mime: str = "application/json") -> dict[str, Any]:
    """A FilePart carrying ``data`` inline, for envs that cannot read the caller's files."""
    return {"kind": "file", "file": {"bytes": base64.b64encode(data).decode("ascii"), "name": name, "mimeType": mime}}


def env_base_url(mcp_url: str) -> str:
    """The env's base URL from its MCP URL (``http://h:p/x/mcp`` -> ``http://h:p/x``); one without ``/mcp`` is it."""
    return mcp_url.rstrip("/").removesuffix(MCP_PATH)
