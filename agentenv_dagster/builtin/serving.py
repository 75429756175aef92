"""Run a Starlette app on 127.0.0.1 for a bounded time and announce its URL.

Shared by every embedded server (envs and agents): bind port 0, write the URL to the ready
file once listening, exit at SIGTERM (at once: it is a run's teardown) or when the TTL runs
out (the last line of defence against leaks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import uvicorn

from agentenv_dagster.runtime.loop import run as run_loop


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
    # after uvicorn's graceful shutdown, which polls in steps (a delay on every run's teardown,
    # for every server) and lets requests the torn-down run no longer waits on finish.
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


def _write_atomically(path: Path, content: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)
