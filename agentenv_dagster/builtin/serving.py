"""Run a Starlette app on 127.0.0.1 for a bounded time and announce its URL.

Shared by every embedded server (envs and agents): bind port 0, write the URL to the ready
file once listening, exit at SIGTERM or when the TTL runs out (the last line of defence
against leaks).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

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
    try:
        await asyncio.wait_for(asyncio.shield(serving), timeout=args.ttl_seconds)
    except asyncio.TimeoutError:
        server.should_exit = True
        await serving


def _announce(ready_file: Path, url: str) -> None:
    tmp = ready_file.with_suffix(".tmp")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    os.replace(tmp, ready_file)
