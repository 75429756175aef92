"""Run a Starlette app on 127.0.0.1 for a bounded time and announce its URL.

Shared by every embedded server (envs and agents): bind port 0, write the URL to the ready
file once listening, exit at SIGTERM (at once: it is a run's teardown) or when the TTL runs
out (the last line of defence against leaks). ``fork_and_serve`` serves several from one
import (``fork_servers``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn

import uvicorn

from agentenv_dagster.runtime.loop import run as run_loop
from agentenv_dagster.runtime.processes import (
    FORKED_FILE, LOG_FILE, PROMPTED_FILE, READY_FILE, READY_POLL_SECONDS, is_running,
)

# an app to serve and what runs once it listens (given its URL)
AppFactory = Callable[[], tuple[Any, Callable[[str], None] | None]]


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ready-file", required=True, type=Path)
    parser.add_argument("--ttl-seconds", type=float, default=7200.0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)


def serve(app, args: argparse.Namespace, on_ready=None) -> None:
    """Serve ``app`` until SIGTERM or the TTL; ``on_ready(url)`` runs once listening."""
    run_loop(_serve(app, args, on_ready))


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
    _announce(args.ready_file, url)
    # SIGTERM is a run's teardown, which waits for the server to end: end now (``_end``), not
    # after uvicorn's graceful shutdown, which ticks in 0.1 s steps (~0.15-0.2 s a server, on
    # every run's teardown) and lets requests the torn-down run no longer waits on finish.
    loop = asyncio.get_running_loop()
    spared = {asyncio.current_task(), serving}
    loop.add_signal_handler(signal.SIGTERM, lambda: loop.create_task(_end(spared)))
    try:
        await asyncio.wait_for(asyncio.shield(serving), timeout=args.ttl_seconds)
    except asyncio.TimeoutError:
        server.should_exit = True
        await serving


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
    _write_atomically(ready_file, {"url": url, "pid": os.getpid()})


# the longest the later servers wait, once the first ones listen, for those to be prompted
LATER_WAIT_SECONDS = 2.0


def fork_and_serve(servers: list[dict[str, Any]], make_app: AppFactory) -> None:
    """For each of ``servers`` (from ``fork_servers``): fork a child that serves ``make_app()``
    as a server started on its own would, then say its pid in the server's folder. Those
    marked ``later`` are forked once the others have been prompted (an agent host marks its
    folder as its first agent task starts, ``PROMPTED_FILE``: its run is past its set-up) or
    have ended, or ``LATER_WAIT_SECONDS`` after those listen: those are needed first, and the
    later ones' start would slow their runs' set-up (forked once the first ones listened, the
    later hosts started while the first runs deployed their agents). Returns once all are
    forked; they go on in their own sessions. This process has run no event loop and no
    thread, so each child starts clean."""
    first = {_fork(server, make_app): server for server in servers if not server.get("later")}
    later = [server for server in servers if server.get("later")]
    if later:
        _until_written(first, READY_FILE, 60.0)
        _until_written(first, PROMPTED_FILE, LATER_WAIT_SECONDS)
        for server in later:
            _fork(server, make_app)


def _fork(server: dict[str, Any], make_app: AppFactory) -> int:
    workdir = Path(server["workdir"])
    pid = os.fork()
    if pid == 0:
        _serve_forked(workdir, server, make_app)
    _write_atomically(workdir / FORKED_FILE, {"pid": pid})
    return pid


def _until_written(servers: dict[int, dict[str, Any]], name: str, seconds: float) -> None:
    """Until each of these forked servers (by pid) has written ``name`` in its folder or
    ended, for at most ``seconds``."""
    deadline = time.monotonic() + seconds
    waiting = dict(servers)
    while waiting and time.monotonic() < deadline:
        waiting = {pid: server for pid, server in waiting.items()
                   if not (Path(server["workdir"]) / name).exists() and is_running(pid)}
        if waiting:
            time.sleep(READY_POLL_SECONDS)


def _serve_forked(workdir: Path, server: dict[str, Any], make_app: AppFactory) -> NoReturn:
    """The forked child: its own session, folder, log and environment, then ``serve``."""
    code = 1
    try:
        os.setsid()
        os.chdir(workdir)
        devnull = os.open(os.devnull, os.O_RDONLY)  # not the starter's input, the spec's pipe
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.update(server["env"])
        app, on_ready = make_app()
        parser = argparse.ArgumentParser()  # the arguments a spawned server gets
        add_serving_arguments(parser)
        args = parser.parse_args(["--ready-file", str(workdir / READY_FILE), "--ttl-seconds", str(server["ttl_seconds"])])
        serve(app, args, on_ready=on_ready)
        code = 0
    except BaseException:  # noqa: BLE001 - said in the log: the parent's waiter reads it
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _write_atomically(path: Path, content: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)
