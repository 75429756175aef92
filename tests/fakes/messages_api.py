"""A local fake of the Anthropic Messages API, for tests of the live agent and judges.

It serves ``POST /v1/messages`` on 127.0.0.1 from a scripted queue (tool_use turns, text,
HTTP errors with the API's error bodies, delays) and records every request, so a test can
point a real ``anthropic`` client — in-process or in an agent subprocess — at ``base_url``.
A request with ``"stream": true`` (Claude Code's) gets the same reply as server-sent events.
``ThreadedServer`` (any ASGI app on port 0 in a background thread) is reused by tests that
need another small local server.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 429: "rate_limit_error", 500: "api_error", 529: "overloaded_error",
}


class ThreadedServer:
    """Serve an ASGI app on 127.0.0.1:0 in a daemon thread; ``url`` once started."""

    def __init__(self, app) -> None:
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadedServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


@dataclass(frozen=True)
class Scripted:
    status: int
    body: dict
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    raw: str | None = None  # sent as it is (hostile replies): no id or model added


def raw_reply(text: str) -> Scripted:
    """A 200 whose body is ``text`` exactly (a reply the SDK may not be able to read)."""
    return Scripted(200, {}, raw=text)


def text_reply(text: str, *, delay_seconds: float = 0.0,
               usage: tuple[int, int] = (10, 5)) -> Scripted:
    return _message([{"type": "text", "text": text}], "end_turn", delay_seconds, usage)


def tool_use_reply(name: str, arguments: dict, *, text: str = "", delay_seconds: float = 0.0,
                   usage: tuple[int, int] = (10, 5)) -> Scripted:
    block = {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:12]}", "name": name,
             "input": arguments}
    content = ([{"type": "text", "text": text}] if text else []) + [block]
    return _message(content, "tool_use", delay_seconds, usage)


def error_reply(status: int, message: str = "scripted error", *,
                retry_after_seconds: float | None = None, delay_seconds: float = 0.0) -> Scripted:
    """An API error with the real body shape; ``retry_after_seconds`` keeps SDK retries fast."""
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"),
                                       "message": message}}
    headers = {} if retry_after_seconds is None else {"retry-after": str(retry_after_seconds)}
    return Scripted(status, body, headers, delay_seconds)


def _message(content: list[dict], stop_reason: str, delay_seconds: float,
             usage: tuple[int, int]) -> Scripted:
    body = {"type": "message", "role": "assistant", "content": content,
            "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    return Scripted(200, body, {}, delay_seconds)


@dataclass(frozen=True)
class RecordedRequest:
    headers: dict[str, str]
    body: dict


class FakeMessagesAPI:
    """Pops one scripted reply per request; an empty queue answers 400 (never retried), so a
    test that under-scripts fails fast instead of hanging in retries."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._queue: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._server = ThreadedServer(Starlette(routes=[
            Route("/v1/messages", self._messages, methods=["POST"]),
        ]))

    @property
    def base_url(self) -> str:
        return self._server.url

    def enqueue(self, *replies: Scripted) -> None:
        with self._lock:
            self._queue.extend(replies)

    def __enter__(self) -> FakeMessagesAPI:
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.__exit__(*exc_info)

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests.append(RecordedRequest(dict(request.headers), body))
            scripted = self._queue.popleft() if self._queue else error_reply(
                400, "FakeMessagesAPI: no scripted reply left"
            )
        await asyncio.sleep(scripted.delay_seconds)
        if scripted.raw is not None:
            return Response(scripted.raw, media_type="application/json")
        payload = dict(scripted.body)
        if scripted.status == 200:
            payload.update(id=f"msg_{uuid.uuid4().hex[:12]}", model=body.get("model", ""))
            if body.get("stream"):
                return Response(_event_stream(payload), media_type="text/event-stream")
        return JSONResponse(payload, status_code=scripted.status, headers=scripted.headers)


def _event_stream(message: dict) -> str:
    """A message as the Messages API streams it: start, one start/delta/stop per content
    block, the stop reason and output tokens, stop."""
    usage = message["usage"]
    events = [("message_start", {"message": {**message, "content": [], "stop_reason": None,
                                             "usage": {**usage, "output_tokens": 0}}})]
    for index, block in enumerate(message["content"]):
        if block["type"] == "tool_use":
            start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        else:
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        events += [("content_block_start", {"index": index, "content_block": start}),
                   ("content_block_delta", {"index": index, "delta": delta}),
                   ("content_block_stop", {"index": index})]
    events += [("message_delta", {"delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                  "usage": {"output_tokens": usage["output_tokens"]}}),
               ("message_stop", {})]
    return "".join(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n" for name, data in events)
