"""The lean HTTP/1.1 transport against real servers on 127.0.0.1, side by side with httpx's own
transport: each scenario runs on both, and they must agree (replies, kept-alive connections,
errors), except where ours hands a request to httpx's on purpose."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fakes.messages_api import ThreadedServer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentenv_dagster.runtime.http1 import Http1Transport

pytestmark = pytest.mark.anyio
BIG = bytes(range(256)) * 800  # 200 KiB: longer than one read


def lean(limits: httpx.Limits = httpx.Limits(), fallback: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(limits=limits, transport=Http1Transport(
        lambda: fallback or httpx.AsyncHTTPTransport(limits=limits), limits))


def stock(limits: httpx.Limits = httpx.Limits()) -> httpx.AsyncClient:
    return httpx.AsyncClient(limits=limits)


@pytest.fixture(params=["lean", "httpx"])
def make_client(request):
    return lean if request.param == "lean" else stock


def _app() -> Starlette:
    released = asyncio.Event()
    gone: dict[str, bool] = {}  # /slow?n=…: had the client closed the connection by the time of the reply

    async def rpc(request: Request):
        body = await request.json()
        return JSONResponse({"id": body["id"], "peer_port": request.client.port}, headers={"X-Seen": "yes"})

    async def big(request: Request):
        return Response(BIG, media_type="application/octet-stream")

    async def chunked(request: Request):
        async def parts():
            for i in range(5):
                yield f"part {i};".encode()
        return StreamingResponse(parts(), media_type="text/plain")

    async def held(request: Request):
        async def parts():
            yield b"first;"
            await asyncio.wait_for(released.wait(), 5)  # sent once the client has the first part
            yield b"second"
        released.clear()
        return StreamingResponse(parts(), media_type="text/plain")

    async def release(request: Request):
        released.set()
        return Response(status_code=204)

    async def slow(request: Request):
        await asyncio.sleep(float(request.query_params["seconds"]))
        gone[request.query_params["n"]] = await request.is_disconnected()
        return JSONResponse({"n": request.query_params["n"], "peer_port": request.client.port})

    async def was_gone(request: Request):
        return JSONResponse(gone.get(request.query_params["n"]))

    async def port(request: Request):
        return JSONResponse({"n": request.query_params.get("n"), "peer_port": request.client.port})

    async def echo(request: Request):
        return Response(await request.body(), media_type="application/octet-stream")

    async def compressed(request: Request):
        return JSONResponse({"words": ["compressible"] * 100})

    return Starlette(routes=[
        Route("/rpc", rpc, methods=["POST"]), Route("/big", big), Route("/chunked", chunked),
        Route("/held", held), Route("/release", release, methods=["POST"]), Route("/slow", slow), Route("/gone", was_gone),
        Route("/port", port, methods=["GET", "HEAD"]), Route("/echo", echo, methods=["POST"]),
        Route("/compressed", compressed),
    ], middleware=[Middleware(GZipMiddleware, minimum_size=100)])


@pytest.fixture(scope="module")
def server():
    with ThreadedServer(_app()) as running:
        yield running.url


async def test_json_round_trips_keep_one_connection_alive(make_client, server):
    async with make_client() as client:
        replies = [await client.post(f"{server}/rpc", json={"id": i}) for i in range(5)]
    assert [r.json()["id"] for r in replies] == list(range(5))
    assert {r.json()["peer_port"] for r in replies} == {replies[0].json()["peer_port"]}  # one connection
    assert replies[0].headers["x-seen"] == "yes" and replies[0].http_version == "HTTP/1.1"


async def test_every_framing_of_a_body_reads_whole_and_the_connection_is_reused(make_client, server):
    async with make_client() as client:
        first = (await client.get(f"{server}/port")).json()["peer_port"]
        assert (await client.get(f"{server}/big")).content == BIG  # a length longer than one read
        assert (await client.get(f"{server}/chunked")).text == "".join(f"part {i};" for i in range(5))
        assert (await client.post(f"{server}/release")).status_code == 204  # no body
        head = await client.head(f"{server}/port")
        assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
        after = (await client.get(f"{server}/port")).json()["peer_port"]
    assert after == first


async def test_a_streamed_reply_arrives_part_by_part(make_client, server):
    """The server sends its second part only once the client has read the first: a transport
    that waited for the whole body would never see it."""
    async with make_client() as client, client.stream("GET", f"{server}/held", timeout=10) as response:
        parts = response.aiter_bytes()
        assert await anext(parts) == b"first;"
        await client.post(f"{server}/release")
        assert b"".join([chunk async for chunk in parts]) == b"second"


async def test_a_stream_closed_early_does_not_leave_its_rest_for_the_next_request(make_client, server):
    async with make_client() as client:
        async with client.stream("GET", f"{server}/big") as response:
            assert len(await anext(response.aiter_raw())) > 0
        assert (await client.get(f"{server}/port", params={"n": "after"})).json()["n"] == "after"
        assert (await client.get(f"{server}/big")).content == BIG


async def test_gzip_is_decoded_by_httpx(make_client, server):
    async with make_client() as client:
        response = await client.get(f"{server}/compressed")
    assert response.headers["content-encoding"] == "gzip"
    assert response.json() == {"words": ["compressible"] * 100}


async def test_a_cancelled_request_closes_its_connection(make_client, server):
    """A cancelled row's connection is closed at once: not left open, and never handed its
    stale reply to the next request."""
    async with make_client() as client:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.get(f"{server}/slow", params={"n": "cancelled", "seconds": "0.3"}), 0.05)
        gone = None
        for _ in range(100):  # until the server has replied (to a connection no one reads)
            await asyncio.sleep(0.05)
            if (gone := (await client.get(f"{server}/gone", params={"n": "cancelled"})).json()) is not None:
                break
        assert gone is True
        second = (await client.get(f"{server}/slow", params={"n": "2", "seconds": "0"})).json()
    assert second["n"] == "2"


async def test_a_read_timeout_and_a_refused_connection_are_httpx_errors(make_client, server):
    async with make_client() as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"{server}/slow", params={"n": "1", "seconds": "1"}, timeout=0.1)
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{_closed_port()}/")
        assert (await client.get(f"{server}/port", params={"n": "ok"})).json()["n"] == "ok"


async def test_the_pool_limit_holds_and_times_out(make_client, server):
    async with make_client(httpx.Limits(max_connections=1)) as client:
        slow = asyncio.ensure_future(client.get(f"{server}/slow", params={"n": "1", "seconds": "1"}))
        await asyncio.sleep(0.1)
        with pytest.raises(httpx.PoolTimeout):
            await client.get(f"{server}/port", timeout=httpx.Timeout(5, pool=0.1))
        assert (await slow).json()["n"] == "1"
        assert (await client.get(f"{server}/port", params={"n": "2"})).json()["n"] == "2"  # the slot came back


async def test_a_header_that_would_split_the_request_is_refused(make_client, server):
    async with make_client() as client:
        with pytest.raises(httpx.LocalProtocolError):
            await client.get(f"{server}/port", headers={"X-Evil": "a\r\nX-Injected: 1"})


# Odd servers, raw: what a kept-alive connection meets in the wild.

class RawServer:
    """A TCP server on 127.0.0.1 answering each request with ``replies[i]`` (raw bytes), then
    closing the connection when ``close_after`` says so; counts connections."""

    def __init__(self, replies: list[bytes], close_after: bool = False) -> None:
        self.replies, self.close_after, self.connections, self.served = replies, close_after, 0, 0

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(self.replies[min(self.served, len(self.replies) - 1)])
                self.served += 1
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _reply(body: bytes, *headers: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    head = [f"{version} {status}", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def test_a_connection_the_server_closed_while_idle_is_not_reused(make_client):
    raw = RawServer([_reply(b"one"), _reply(b"two")], close_after=True)  # closes without saying so
    async with raw as url, make_client() as client:
        assert (await client.get(url)).text == "one"
        await asyncio.sleep(0.1)  # the close has reached the client
        assert (await client.get(url)).text == "two"
    assert raw.connections == 2


async def test_connection_close_and_http_1_0_are_honoured(make_client):
    raw = RawServer([_reply(b"a", "Connection: close"), _reply(b"b", version="HTTP/1.0"), _reply(b"c")])
    async with raw as url, make_client() as client:
        assert [(await client.get(url)).text for _ in range(4)] == ["a", "b", "c", "c"]
    assert raw.connections == 3  # the last two share one


async def test_a_body_ended_by_the_connection_and_chunks_with_extensions_and_trailers(make_client):
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
    eof = b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    raw = RawServer([chunked, chunked, eof], close_after=False)
    async with raw as url, make_client() as client:
        assert (await client.get(url)).text == "hello world"
        assert (await client.get(url)).text == "hello world"  # the same connection, after the trailer
        assert raw.connections == 1
    raw = RawServer([eof], close_after=True)
    async with raw as url, make_client() as client:
        assert (await client.get(url)).text == "until the end"


async def test_a_reply_cut_short_or_malformed_is_a_protocol_error(make_client):
    for reply in (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", b"HTTP/1.1 200 OK\r\nContent-Le",
                  b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"):
        async with RawServer([reply], close_after=True) as url, make_client() as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.get(url)


async def test_an_interim_100_continue_precedes_the_reply(make_client):
    async with RawServer([b"HTTP/1.1 100 Continue\r\n\r\n" + _reply(b"done")]) as url, make_client() as client:
        assert (await client.post(url, content=b"x")).text == "done"


# Where ours hands over to httpx's transport.

async def test_https_and_a_body_of_unknown_length_go_to_httpx(server):
    handed = []

    def record(request: httpx.Request) -> httpx.Response:
        handed.append((request.url.scheme, request.headers.get("transfer-encoding")))
        return httpx.Response(200, json={"handed": True})

    async def streamed():
        yield b"a"
        yield b"b"

    async with lean(fallback=httpx.MockTransport(record)) as client:
        assert (await client.get("https://example.invalid/")).json() == {"handed": True}
        assert (await client.post(f"{server}/echo", content=streamed())).json() == {"handed": True}
        assert (await client.post(f"{server}/echo", content=b"ab")).content == b"ab"  # ours
    assert handed == [("https", None), ("http", "chunked")]

    async with lean() as client:  # and httpx's transport sends it as it would
        assert (await client.post(f"{server}/echo", content=streamed())).content == b"ab"


async def test_httpx_transport_is_built_by_the_first_request_it_takes_and_closed_with_ours(server):
    """A run that only speaks plain HTTP never builds it (nor imports httpcore, nor loads the
    CA bundle); the first https request builds it, and later ones reuse it."""
    built, closed = [], []

    class Fallback(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json={"by": len(built)})

        async def aclose(self) -> None:
            closed.append(True)

    def make() -> httpx.AsyncBaseTransport:
        built.append(True)
        return Fallback()

    client = httpx.AsyncClient(transport=Http1Transport(make))
    async with client:
        assert (await client.post(f"{server}/echo", content=b"ab")).content == b"ab"
        assert built == []
        assert [(await client.get("https://example.invalid/")).json() for _ in range(2)] == [{"by": 1}] * 2
    assert (built, closed) == ([True], [True])

    async with httpx.AsyncClient(transport=Http1Transport(make)) as unused:
        await unused.post(f"{server}/echo", content=b"ab")
    assert (built, closed) == ([True], [True])  # nothing built, nothing to close


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

