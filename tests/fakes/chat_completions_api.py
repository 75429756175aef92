"""A local fake of the OpenAI Chat Completions API (what OpenAI, a LiteLLM proxy, vLLM and Ollama
serve), for tests of judges and the live agent on the ``openai`` protocol.

It serves ``POST /v1/chat/completions`` on 127.0.0.1 from a scripted queue (tool calls, text,
JSON content for a schema-constrained response, HTTP errors with the API's error bodies, raw
bodies) and records every request, so a test can point a real ``openai`` client at
``base_url`` (``.../v1``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes.messages_api import RecordedRequest, ThreadedServer

ERROR_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
               429: "rate_limit_exceeded", 500: "server_error", 503: "server_error"}


@dataclass(frozen=True)
class ScriptedChat:
    status: int
    body: dict | None = None
    raw: str | None = None  # sent as it is (hostile replies): no id or model added
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0


def _completion(message: dict, finish_reason: str, usage: tuple[int, int, int]) -> ScriptedChat:
    prompt, completion, cached = usage
    return ScriptedChat(200, {
        "object": "chat.completion", "created": 0,
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    })


def chat_text_reply(text: str, *, usage: tuple[int, int, int] = (12, 6, 0)) -> ScriptedChat:
    """An assistant message; also what a schema-constrained response looks like (its JSON as text)."""
    return _completion({"content": text}, "stop", usage)


def chat_tool_call(name: str, arguments: dict | str, *, text: str | None = None,
                   usage: tuple[int, int, int] = (12, 6, 0)) -> ScriptedChat:
    """One function call; ``arguments`` as given when a string (hostile or broken JSON)."""
    call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
            "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}}
    return _completion({"content": text, "tool_calls": [call]}, "tool_calls", usage)


def chat_error(status: int, message: str = "scripted error", *, retry_after_seconds: float | None = None) -> ScriptedChat:
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": None, "code": None}}
    headers = {} if retry_after_seconds is None else {"retry-after": str(retry_after_seconds)}
    return ScriptedChat(status, body, headers=headers)


def chat_raw(text: str) -> ScriptedChat:
    return ScriptedChat(200, raw=text)


class FakeChatCompletionsAPI:
    """Pops one scripted reply per request; an empty queue answers 400 (never retried)."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queue: deque[ScriptedChat] = deque()
        self._lock = threading.Lock()
        self._server = ThreadedServer(Starlette(routes=[
            Route("/v1/chat/completions", self._completions, methods=["POST"]),
        ]))

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def enqueue(self, *replies: ScriptedChat) -> None:
        with self._lock:
            self._queue.extend(replies)

    def __enter__(self) -> FakeChatCompletionsAPI:
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.__exit__(*exc_info)

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests.append(RecordedRequest(dict(request.headers), body))
            scripted = self._queue.popleft() if self._queue else chat_error(
                400, "FakeChatCompletionsAPI: no scripted reply left")
        await asyncio.sleep(scripted.delay_seconds)
        if scripted.raw is not None:
            return Response(scripted.raw, media_type="application/json")
        payload = dict(scripted.body or {})
        if scripted.status == 200:
            payload.update(id=f"chatcmpl-{uuid.uuid4().hex[:12]}", model=body.get("model", ""))
        return JSONResponse(payload, status_code=scripted.status, headers=scripted.headers)
