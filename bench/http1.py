"""The client's CPU a request: httpx's own transport against ``runtime.http1``'s, in one invocation.

A JSON-RPC endpoint (Starlette on uvicorn, in a process of its own on 127.0.0.1) answers small
JSON replies; the client sends ``--requests`` of them, ``--in-flight`` at once, as a dataset op
does: each row in flight on its own lane (an ``httpx.AsyncClient`` of 4 connections, as
``StepRuntime.lanes`` makes them), on uvloop. It alternates the two transports ``--rounds``
times and prints the CPU the client process spent a request with each (the server's is the
same either way), and their ratio.

    python bench/http1.py [--requests 3000] [--in-flight 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import sys
import time
from statistics import median

import httpx

from agentenv_dagster.runtime.base import LANE_CONNECTIONS, http_client
from agentenv_dagster.runtime.loop import run

PAYLOAD = {"jsonrpc": "2.0", "id": "1", "method": "SendMessage",
           "params": {"message": {"role": "ROLE_USER", "parts": [{"text": "Classify: item 7 was great"}]}}}


def serve(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def rpc(request):
        body = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"task": {
            "id": "t", "status": {"state": "TASK_STATE_COMPLETED"}, "artifacts": [{"parts": [{"text": "positive"}]}]}}})

    uvicorn.run(Starlette(routes=[Route("/", rpc, methods=["POST"])]), host="127.0.0.1", port=port, log_level="error")


def client(transport: str) -> httpx.AsyncClient:
    """A lane's client as a step runtime makes it, or the same over httpx's own transport."""
    if transport == "http1":
        return http_client(max_connections=LANE_CONNECTIONS)
    limits = httpx.Limits(max_connections=LANE_CONNECTIONS, max_keepalive_connections=LANE_CONNECTIONS)
    return httpx.AsyncClient(limits=limits)


async def cpu_a_request(url: str, transport: str, requests: int, in_flight: int) -> float:
    """Milliseconds of this process's CPU a request, after a warm-up."""
    lanes: asyncio.Queue[httpx.AsyncClient] = asyncio.Queue()
    for _ in range(in_flight):
        lanes.put_nowait(client(transport))

    async def one() -> None:
        lane = await lanes.get()
        try:
            (await lane.post(url, json=PAYLOAD, timeout=30)).raise_for_status()
        finally:
            lanes.put_nowait(lane)

    await asyncio.gather(*(one() for _ in range(in_flight * 4)))
    started = time.process_time()
    await asyncio.gather(*(one() for _ in range(requests)))
    spent = time.process_time() - started
    while not lanes.empty():
        await lanes.get_nowait().aclose()
    return spent / requests * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--in-flight", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(port,), daemon=True)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.post(url, json=PAYLOAD)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        spent: dict[str, list[float]] = {"httpx": [], "http1": []}
        for round_ in range(args.rounds):
            for transport in (("httpx", "http1") if round_ % 2 == 0 else ("http1", "httpx")):
                spent[transport].append(run(cpu_a_request(url, transport, args.requests, args.in_flight)))
                print(f"round {round_ + 1} {transport:<6} {spent[transport][-1]:.3f} ms of CPU a request", flush=True)
    finally:
        server.terminate()
        server.join()
    base, ours = median(spent["httpx"]), median(spent["http1"])
    print(f"median: httpx's transport {base:.3f} ms, http1 {ours:.3f} ms a request; http1 / httpx = {ours / base:.2f}")


if __name__ == "__main__":
    sys.exit(main())
