"""The model APIs an agent host may call, and the proxy its coding CLIs reach them through.

A host is handed each model API's base URL and key on its standard input (``model_api`` in
the bootstrap, see ``serving.read_bootstrap``); they stay in this process's memory, bound
together: an agent deployed into the host cannot send the key anywhere else. The Anthropic
agent calls the API with them directly.

A coding CLI (claude-code, codex) runs its own tools, and its Bash inherits the CLI's
environment, so a CLI is never given a real key. Its base URL is this host's
``/model-proxy/<provider>`` and its key the host's run-scoped *proxy key*; the proxy checks
that key (in constant time) and swaps it for the real one on the way out. Whatever the CLI's
tools read, they find only a key that works through this host, while it runs.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any

import httpx

PROXY_PREFIX = "/model-proxy/"
# protocol -> (the header its key travels in, the default base URL of its provider of that name)
PROTOCOLS = {
    "anthropic": ("x-api-key", "https://api.anthropic.com"),
    "openai": ("authorization", "https://api.openai.com/v1"),
}
# not forwarded either way: the connection's own, and the caller's credentials
HOP_HEADERS = frozenset({
    "host", "connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-authorization",
    "proxy-connection", "content-length", "authorization", "x-api-key",
})


@dataclass(frozen=True)
class ModelAccess:
    base_url: str
    api_key: str | None
    protocol: str = "anthropic"


class ModelAccessBook:
    """This host's model APIs, its proxy key and its URL (known once it listens)."""

    def __init__(self) -> None:
        self.apis: dict[str, ModelAccess] = {}
        self.proxy_key = secrets.token_urlsafe(32)
        self.host_url = ""
        self._client: httpx.AsyncClient | None = None

    def install(self, bootstrap: dict[str, Any]) -> None:
        """The model APIs of the bootstrap (provider -> base URL, key, protocol); a provider
        with neither a key nor a URL of its own is left out."""
        for provider, given in (bootstrap.get("model_api") or {}).items():
            protocol = (given or {}).get("protocol") or provider
            if protocol not in PROTOCOLS or not isinstance(given, dict):
                continue
            base = given.get("base_url") or (PROTOCOLS[protocol][1] if provider == protocol else None)
            if base and (given.get("api_key") or given.get("base_url")):
                self.apis[provider] = ModelAccess(base.rstrip("/"), given.get("api_key"), protocol)

    def access(self, provider: str) -> ModelAccess | None:
        return self.apis.get(provider)

    def proxy_url(self, provider: str) -> str:
        return f"{self.host_url}{PROXY_PREFIX}{provider}"

    @staticmethod
    def is_proxy_path(path: str) -> bool:
        return path.startswith(PROXY_PREFIX)

    def in_front_of(self, app):
        """ASGI: the proxy's paths to the proxy, the rest to ``app``."""
        async def dispatch(scope, receive, send):
            if scope["type"] == "http" and self.is_proxy_path(scope.get("path", "")):
                return await self.proxy(scope, receive, send)
            return await app(scope, receive, send)

        return dispatch

    async def proxy(self, scope, receive, send) -> None:
        """ASGI: forward ``/model-proxy/<provider>/<path>`` to the provider's API with the real
        key, streaming the answer back; 401 without this host's proxy key."""
        provider, _, rest = scope["path"][len(PROXY_PREFIX):].partition("/")
        access = self.apis.get(provider)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if not self._authorized(headers):
            return await _answer(send, 401, b'{"error": "the model proxy needs the agent host\'s proxy key"}')
        if access is None:
            return await _answer(send, 404, b'{"error": "this agent host has no such model API"}')
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        header, _ = PROTOCOLS[access.protocol]
        forwarded = {k: v for k, v in headers.items() if k not in HOP_HEADERS}
        if access.api_key:
            forwarded[header] = access.api_key if header == "x-api-key" else f"Bearer {access.api_key}"
        query = scope.get("query_string") or b""
        url = f"{access.base_url}/{rest}" + (f"?{query.decode('latin-1')}" if query else "")
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=30.0))
        request = self._client.build_request(scope["method"], url, headers=forwarded, content=body)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            return await _answer(send, 502, f'{{"error": "model API unreachable: {type(exc).__name__}"}}'.encode())
        try:
            await send({"type": "http.response.start", "status": response.status_code, "headers": [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.multi_items()
                if k.lower() not in HOP_HEADERS]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    def _authorized(self, headers: dict[str, str]) -> bool:
        expected = self.proxy_key.encode()
        given = [headers.get("x-api-key", ""), headers.get("authorization", "").removeprefix("Bearer ")]
        return any(hmac.compare_digest(value.encode(), expected) for value in given if value)


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


MODELS = ModelAccessBook()  # this process's: one agent host (or embedded agent) per process
