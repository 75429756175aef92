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


def test_a_batch_is_written_down_before_its_rows_see_their_agents_and_a_failed_write_fails_them():
    recorded: list[list[str]] = []

    async def agents(request: Request) -> JSONResponse:
        return JSONResponse({"agents": [{"url": f"http://agents/{a['id']}"} for a in (await request.json())["agents"]]})

    def record(answered):
        if any(body["id"] == "broken" for body, _ in answered):
            raise OSError("disk full")
        recorded.append([answer["url"] for _, answer in answered])

    async def deploy(url: str, ids: list[str]) -> list:
        batch = HostBatch(url, record)

        async def one(agent_id: str):
            answer = await batch.add({"id": agent_id})
            return answer, list(recorded)  # what had been written down when the row got its agent

        try:
            return await asyncio.gather(*(one(i) for i in ids), return_exceptions=True)
        finally:
            await batch.aclose()

    with ThreadedServer(Starlette(routes=[Route("/agents", agents, methods=["POST"])])) as server:
        written = asyncio.run(deploy(server.url, ["a", "b"]))
        failed = asyncio.run(deploy(server.url, ["c", "broken"]))
    both = ["http://agents/a", "http://agents/b"]
    assert written == [({"url": "http://agents/a"}, [both]), ({"url": "http://agents/b"}, [both])]
    assert [type(e).__name__ + ": " + str(e) for e in failed] == ["OSError: disk full"] * 2
    assert recorded == [both]


def test_a_host_that_is_gone_fails_every_row_of_its_batch_with_a_connect_error():
    """A refused connection is httpx's ``ConnectError`` (what a deploy turns into "the run's
    agent host ... failed"), with httpx's words for it."""
    import socket

    import httpx

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"

    async def deploy() -> list:
        batch = HostBatch(url)
        try:
            return await asyncio.gather(batch.add({"id": "a"}), batch.add({"id": "b"}), return_exceptions=True)
        finally:
            await batch.aclose()

    failed = asyncio.run(deploy())
    assert [type(e) for e in failed] == [httpx.ConnectError] * 2
    assert all(str(e) for e in failed)
