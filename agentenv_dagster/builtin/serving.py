"""Run a Starlette app on 127.0.0.1 for a bounded time, for its run only, and announce its URL.

Shared by every embedded server (envs and agents): read the bootstrap (the run's bearer
token, and any secret the server needs) from standard input, bind port 0, write the URL to
the ready file once listening, answer 401 to every request without the token, and exit at
SIGTERM (at once: it is a run's teardown), as soon as the run's owner process has gone
(``--owner-pid``), or when the TTL runs out (the last line of defence against leaks).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hmac
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, NoReturn

import uvicorn

from agentenv_dagster.runtime.loop import run as run_loop

OWNER_POLL_SECONDS = 1.0  # where the system has no pidfd to wait on


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ready-file", required=True, type=Path)
    parser.add_argument("--ttl-seconds", type=float, default=7200.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--owner-pid", type=int, help="end when this process ends (the run's owner)")
    parser.add_argument("--owner-started", type=int, help="the owner's start time, as /proc/<pid>/stat has it")


def read_bootstrap() -> dict[str, Any]:
    """What the starting process wrote on standard input: ``{"token": ..., ...}``. A server
    started any other way has no token to require, so it does not start."""
    try:
        bootstrap = json.loads(sys.stdin.read() if not sys.stdin.isatty() else "")
    except ValueError:
        bootstrap = None
    if not isinstance(bootstrap, dict) or not isinstance(bootstrap.get("token"), str) or len(bootstrap["token"]) < 16:
        raise SystemExit("an embedded server reads its bearer token from standard input, as "
                         "agentenv_dagster.runtime.processes.spawn_server gives it: {\"token\": \"...\"}")
    return bootstrap


def serve(app, args: argparse.Namespace, bootstrap: dict[str, Any], on_ready=None,
          open_paths: Callable[[str], bool] = lambda path: False) -> None:
    """Serve ``app`` behind the bootstrap's token until SIGTERM, the owner's end or the TTL;
    ``on_ready(url)`` runs once listening. ``open_paths(path)`` names the paths that check
    a credential of their own instead (the model proxy's)."""
    run_loop(_serve(RequireToken(app, bootstrap["token"], open_paths), args, on_ready))


class RequireToken:
    """ASGI middleware: an HTTP request without the run's token is answered 401 before it
    reaches the app. The token comes as ``Authorization: Bearer <token>``, or as the password
    of HTTP Basic auth (a URL ``http://agentenv:<token>@host/...``, for code that takes only
    a URL); compared in constant time."""

    def __init__(self, app, token: str, open_paths: Callable[[str], bool]) -> None:
        self.app = app
        self.token = token.encode()
        self.open_paths = open_paths

    def _authorized(self, header: bytes) -> bool:
        scheme, _, credential = header.partition(b" ")
        if scheme.lower() == b"basic":
            try:
                credential = base64.b64decode(credential, validate=True).partition(b":")[2]
            except ValueError:
                return False
        elif scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(credential, self.token)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and not self.open_paths(scope.get("path", "")):
            given = next((v for k, v in scope.get("headers") or [] if k == b"authorization"), b"")
            if not self._authorized(given):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                body = b'{"error": "unauthorized: this server of an agentenv run needs the run\'s bearer token"}'
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def _serve(app, args: argparse.Namespace, on_ready) -> None:
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # raises the start-up error
            return
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://{args.host}:{port}"
    if on_ready is not None:
        on_ready(url)
    # SIGTERM is a run's teardown, which waits for the server to end: end now (``_end``), not
    # after uvicorn's graceful shutdown, which polls in steps (a delay on every run's teardown,
    # for every server) and lets requests the torn-down run no longer waits on finish.
    loop = asyncio.get_running_loop()
    spared = {asyncio.current_task(), serving}
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(_end(spared)))
    if args.owner_pid is not None:
        _watch_owner(loop, args.owner_pid, args.owner_started, lambda: loop.create_task(_end(spared)))
    _announce(args.ready_file, url)
    try:
        await asyncio.wait_for(asyncio.shield(serving), timeout=args.ttl_seconds)
    except asyncio.TimeoutError:
        server.should_exit = True
        await serving


def _watch_owner(loop: asyncio.AbstractEventLoop, pid: int, started: int | None, gone: Callable[[], Any]) -> None:
    """Call ``gone`` once the owner process has ended: at once when it already has (or its
    pid is a stranger's now), else when its pidfd turns readable (Linux), else by polling."""
    from agentenv_dagster.runtime.processes import _start_ticks, is_running

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        loop.call_soon(gone)
        return
    except (AttributeError, OSError):  # no pidfd here: look every second

        async def poll() -> None:
            while is_running(pid) and (started is None or _start_ticks(pid) == started):
                await asyncio.sleep(OWNER_POLL_SECONDS)
            gone()

        loop.create_task(poll())
        return
    if started is not None and _start_ticks(pid) != started:  # opened after a reuse of its pid
        os.close(pidfd)
        loop.call_soon(gone)
        return

    def ended() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        gone()

    loop.add_reader(pidfd, ended)


END_GRACE_SECONDS = 3.0  # under the teardown's 5 s before it kills the process group


async def _end(spared: set[asyncio.Task]) -> NoReturn:
    """The process's end at SIGTERM: what still runs (a request, an agent's task) is
    cancelled, so its own clean-up runs (a coding agent stops its CLI's process group, which
    is not the server's) for up to ``END_GRACE_SECONDS``; then the process exits. The server
    itself (``spared``) is not wound down: nothing of it outlives the process."""
    running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task() and task not in spared]
    for task in running:
        task.cancel()
    if running:
        await asyncio.wait(running, timeout=END_GRACE_SECONDS)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _announce(ready_file: Path, url: str) -> None:
    """Where it listens, and which process it is (pid and start time, ``ProcessIdentity``)."""
    from agentenv_dagster.runtime.processes import _start_ticks

    _write_atomically(ready_file, {"url": url, "pid": os.getpid(), "started": _start_ticks(os.getpid())})


def _write_atomically(path: Path, content: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)
