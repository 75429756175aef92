"""Deployments into an agent host go in batches, and every batch over one kept connection."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.runtime.local import HostBatch
from fakes.messages_api import ThreadedServer


def test_each_turn_of_the_loop_is_one_request_and_every_request_one_connection():
    """A thousand rows' agents cost a few hundred requests: a client and a connection each
    would cost more than the requests themselves."""
    seen: list[tuple[int, list[str]]] = []  # (the client's port, the agents asked for) a request

    async def agents(request: Request) -> JSONResponse:
        asked = [agent["id"] for agent in (await request.json())["agents"]]
        seen.append((request.client.port, asked))
        return JSONResponse({"agents": [{"url": f"http://agents/{agent}"} for agent in asked]})

    async def deploy(url: str) -> tuple[list[dict], dict]:
        batch = HostBatch(url)
        try:
            together = await asyncio.gather(batch.add({"id": "a"}), batch.add({"id": "b"}))  # one turn
            later = await batch.add({"id": "c"})  # a later turn
        finally:
            await batch.aclose()
        return together, later

    with ThreadedServer(Starlette(routes=[Route("/agents", agents, methods=["POST"])])) as server:
        together, later = asyncio.run(deploy(server.url))
    assert together == [{"url": "http://agents/a"}, {"url": "http://agents/b"}]
    assert later == {"url": "http://agents/c"}
    assert [asked for _, asked in seen] == [["a", "b"], ["c"]]
    assert len({port for port, _ in seen}) == 1  # both requests on one connection
