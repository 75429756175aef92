"""Plain HTTP/1.1 for httpx, lean: what a dataset's rows send to the agents and envs they talk to.

httpx's own transport (httpcore, over anyio and h11) spends ~1.1-1.4 ms of CPU on a small
JSON-RPC round trip to an agent on this machine; this one ~0.4 ms (``bench/http1.py``). It
writes a request in one write and reads the reply with asyncio's stream reader: on the
1,000-row fan-out that is ~0.3 s of each shard run's CPU, spent while its prompts wait.
httpx's client layer stays (its requests, responses, decoding, errors, proxies); what this
does not speak goes to httpx's transport, unchanged: https, and a request body of unknown
length. Connections are kept alive per origin and reused when a reply was read to its end.
That transport is built on its first request: a run that only speaks plain HTTP never imports
httpcore nor loads the CA bundle (~0.1 s of a process's CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from typing import AsyncIterator, Awaitable, Callable

import httpx

NO_BODY_STATUS = frozenset({204, 304})
CHUNK = 65536


class Http1Transport(httpx.AsyncBaseTransport):
    """``http://`` requests over kept-alive asyncio connections, at most ``max_connections`` at once
    (httpx's ``Limits``: ``pool`` is the timeout for a free one); anything else to the transport
    ``fallback()`` makes, when the first such request comes."""

    def __init__(self, fallback: Callable[[], httpx.AsyncBaseTransport], limits: httpx.Limits = httpx.Limits()) -> None:
        self._make_fallback = fallback
        self._fallback: httpx.AsyncBaseTransport | None = None
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._max_idle = limits.max_keepalive_connections if limits.max_keepalive_connections is not None else 2 ** 31
        self._slots = asyncio.Semaphore(limits.max_connections) if limits.max_connections else None
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http" or "transfer-encoding" in request.headers:
            if self._fallback is None:
                self._fallback = self._make_fallback()
            return await self._fallback.handle_async_request(request)
        if self._closed:
            raise RuntimeError("the transport is closed")
        timeouts = request.extensions.get("timeout") or {}
        head = _request_head(request)
        body = await request.aread()
        await self._take_slot(request, timeouts.get("pool"))
        try:
            connection = await self._connection(request, timeouts.get("connect"))
            return await connection.exchange(request, head + body, timeouts.get("read"), self._release)
        except BaseException:
            self._free_slot()
            raise

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()
        if self._fallback is not None:
            await self._fallback.aclose()

    async def _take_slot(self, request: httpx.Request, timeout: float | None) -> None:
        if self._slots is None:
            return
        if not self._slots.locked():
            await self._slots.acquire()  # free: taken at once (no timer for the pool timeout)
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpx.PoolTimeout("no connection free within the pool timeout", request=request) from None

    def _free_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    async def _connection(self, request: httpx.Request, timeout: float | None) -> _Connection:
        """An idle connection to the request's origin that is still open, else a new one."""
        origin = (request.url.host, request.url.port or 80)
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.reusable():
                return connection
            connection.close()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(*origin, limit=CHUNK)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"no connection to {origin[0]}:{origin[1]} within {timeout}s", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(_text(exc), request=request) from exc
        return _Connection(origin, reader, writer)

    def _release(self, connection: _Connection, keep: bool) -> None:
        """A reply is done with its connection: idle for the next request, or closed."""
        self._free_slot()
        idle = self._idle.setdefault(connection.origin, deque())
        if keep and not self._closed and len(idle) < self._max_idle:
            idle.append(connection)
        else:
            connection.close()


class _Connection:
    def __init__(self, origin: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.origin, self.reader, self.writer = origin, reader, writer

    def reusable(self) -> bool:
        """Still open: the server closes an idle kept-alive connection when it likes."""
        return not (self.reader.at_eof() or self.writer.is_closing() or self.reader.exception())

    def close(self) -> None:
        self.writer.close()

    async def exchange(self, request: httpx.Request, data: bytes, timeout: float | None, release) -> httpx.Response:
        """Send the request; read the reply's head. Its body is read as the caller reads it.
        Whatever stops the exchange (an error, a cancelled row) closes the connection."""
        try:
            try:
                self.writer.write(data)
                await self.writer.drain()
            except OSError as exc:
                raise httpx.WriteError(_text(exc), request=request) from exc
            async with self.reading(request, timeout):
                while True:
                    version, status, reason, headers = _parse_head(await self.reader.readuntil(b"\r\n\r\n"))
                    if not 100 <= status < 200 or status == 101:
                        break  # an interim reply (100 Continue …) precedes the real one
                framing, length = _framing(request, status, headers)
                # most replies are short and whole: read with the head, under the same timer
                content = await self.reader.readexactly(length) if framing == "length" and length <= CHUNK else None
        except BaseException:
            self.close()
            raise
        keep = status != 101 and framing != "eof" and version == b"HTTP/1.1" and not _closes(headers) and not _closes(request.headers.raw)
        done = lambda clean: release(self, keep and clean)  # noqa: E731
        if content is not None or framing == "none":
            done(True)
            stream: httpx.AsyncByteStream = httpx.ByteStream(content or b"")
        else:
            stream = _Body(self, request, framing, length, timeout, done)
        return httpx.Response(status, headers=headers, stream=stream,
                              extensions={"http_version": version, "reason_phrase": reason})

    @contextlib.asynccontextmanager
    async def reading(self, request: httpx.Request, timeout: float | None) -> AsyncIterator[None]:
        """Reads within the read timeout, their errors as httpx's (the caller closes the connection)."""
        try:
            async with asyncio.timeout(timeout):
                yield
        except TimeoutError:
            raise httpx.ReadTimeout(f"no reply within {timeout}s", request=request) from None
        except asyncio.IncompleteReadError as exc:
            message = ("Server disconnected without sending a response." if not exc.partial
                       else "peer closed connection without sending complete message body")
            raise httpx.RemoteProtocolError(message, request=request) from None
        except (asyncio.LimitOverrunError, ValueError) as exc:
            raise httpx.RemoteProtocolError(
                f"malformed reply from {self.origin[0]}:{self.origin[1]}: {exc}", request=request) from None
        except OSError as exc:
            raise httpx.ReadError(_text(exc), request=request) from exc


class _Body(httpx.AsyncByteStream):
    """A long reply's body, read as the caller reads it: framed by its length, by chunks, or by
    the end of the connection (a stream of events, a download)."""

    def __init__(self, connection: _Connection, request: httpx.Request, framing: str, length: int,
                 timeout: float | None, done: Callable[[bool], None]) -> None:
        self._connection, self._request, self._framing, self._length = connection, request, framing, length
        self._timeout, self._done = timeout, done

    def finish(self, clean: bool) -> None:
        """Once: the connection goes back (``clean``: the body was read to its end) or is closed."""
        done, self._done = self._done, None
        if done is not None:
            if not clean:
                self._connection.close()
            done(clean)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._done is None:
            return
        reader = self._connection.reader
        try:
            if self._framing == "length":
                left = self._length
                while left:
                    chunk = await self._read(reader.readexactly(min(left, CHUNK)))
                    left -= len(chunk)
                    yield chunk
            elif self._framing == "chunked":
                while size := int((await self._read(reader.readuntil(b"\r\n"))).split(b";", 1)[0].strip(), 16):
                    yield (await self._read(reader.readexactly(size + 2)))[:-2]
                while await self._read(reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
            else:
                while chunk := await self._read(reader.read(CHUNK)):
                    yield chunk
        except ValueError:
            self.finish(clean=False)
            raise httpx.RemoteProtocolError("a malformed chunk size", request=self._request) from None
        except BaseException:
            self.finish(clean=False)
            raise
        self.finish(clean=True)

    async def _read(self, reading: Awaitable[bytes]) -> bytes:
        async with self._connection.reading(self._request, self._timeout):
            return await reading

    async def aclose(self) -> None:
        self.finish(clean=False)  # closed before its end: the rest is not read, the connection not reused


def _request_head(request: httpx.Request) -> bytes:
    """The request line and headers; a CR or LF inside one would split the request, and is refused."""
    parts = [request.method.encode("ascii"), request.url.raw_path, *(b for pair in request.headers.raw for b in pair)]
    if any(b"\r" in part or b"\n" in part for part in parts):
        raise httpx.LocalProtocolError("a CR or LF in the request line or a header", request=request)
    lines = [b"%s %s HTTP/1.1" % (parts[0], parts[1]), *(name + b": " + value for name, value in request.headers.raw)]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(raw: bytes) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
    """Version, status, reason and headers; ValueError when malformed (a folded or padded
    header name too, as h11 refuses them)."""
    lines = raw[:-4].split(b"\r\n")
    version, status, *reason = lines[0].split(b" ", 2)
    if not version.startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP/1 status line: {lines[0][:40]!r}")
    headers = []
    for line in lines[1:]:
        name, value = line.split(b":", 1)
        if not name or name[0] in b" \t" or name[-1] in b" \t":
            raise ValueError(f"a malformed header: {line[:40]!r}")
        headers.append((name, value.strip(b" \t")))
    return version, int(status), reason[0] if reason else b"", headers


def _framing(request: httpx.Request, status: int, headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
    """How the body ends: ``none``, ``length`` (bytes), ``chunked``, or ``eof`` (the connection's end)."""
    if request.method == "HEAD" or status in NO_BODY_STATUS or 100 <= status < 200:
        return "none", 0
    lengths = set()
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"transfer-encoding" and value.lower().endswith(b"chunked"):
            return "chunked", 0
        if lowered == b"content-length":
            lengths.update(v.strip() for v in value.split(b","))
    if not lengths:
        return "eof", 0
    try:
        (length,) = {int(v) for v in lengths}
    except ValueError:
        raise httpx.RemoteProtocolError("a bad Content-Length", request=request) from None
    return ("length", length) if length else ("none", 0)


def _closes(headers: list[tuple[bytes, bytes]]) -> bool:
    """A ``Connection: close`` among the headers."""
    return any(name.lower() == b"connection" and b"close" in value.lower() for name, value in headers)


def _text(exc: OSError) -> str:
    """``[Errno 111] Connection refused``: the system's words (asyncio's own name the address)."""
    return f"[Errno {exc.errno}] {os.strerror(exc.errno)}" if exc.errno else str(exc) or type(exc).__name__
