"""A local fake of the OpenAI Responses API (``POST /v1/responses``, streamed), for running
the real Codex CLI offline: each request pops one scripted reply — a function call (Codex's
``exec_command`` runs a shell command) or an assistant message — and is recorded."""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fakes.messages_api import ThreadedServer

USAGE = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 20,
         "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 120}


def function_call(name: str, arguments: dict) -> dict:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:8]}", "call_id": f"call_{uuid.uuid4().hex[:8]}",
            "name": name, "arguments": json.dumps(arguments)}


def message(text: str) -> dict:
    return {"type": "message", "role": "assistant", "id": f"msg_{uuid.uuid4().hex[:8]}",
            "content": [{"type": "output_text", "text": text}]}


class FakeResponsesAPI:
    """Pops one scripted output item per request; an empty queue answers 400, which Codex
    does not retry, so an under-scripted test fails fast."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self._queue: deque[dict] = deque()
        self._lock = threading.Lock()
        self._server = ThreadedServer(Starlette(routes=[Route("/v1/responses", self._responses, methods=["POST"])]))

    @property
    def base_url(self) -> str:
        return f"{self._server.url}/v1"

    def enqueue(self, *items: dict) -> None:
        with self._lock:
            self._queue.extend(items)

    def __enter__(self) -> FakeResponsesAPI:
        self._server.__enter__()
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.__exit__(*exc_info)

    async def _responses(self, request: Request) -> Response:
        body = await request.json()
        with self._lock:
            self.requests.append(body)
            item = self._queue.popleft() if self._queue else None
        if item is None:
            return JSONResponse({"error": {"message": "FakeResponsesAPI: no scripted reply left"}}, status_code=400)
        response_id = f"resp_{uuid.uuid4().hex[:8]}"
        events = [{"type": "response.created", "response": {"id": response_id}},
                  {"type": "response.output_item.done", "item": item},
                  {"type": "response.completed", "response": {"id": response_id, "usage": USAGE}}]
        stream = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        return Response(stream, media_type="text/event-stream")
