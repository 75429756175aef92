"""The embedded agent host on its own: how long it takes to start, and a prompt's round trip.

Starts ``python -m agentenv_dagster.builtin.agents host`` (as a run does), deploys one replay
agent in it and sends it messages one after another; prints the median start time (spawn to
listening, wall and CPU), the median round trip of a message and the host's CPU time per message.

    python bench/agent_host.py [--starts 5] [--messages 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from agentenv_dagster.runtime.a2a_client import A2AClient
from agentenv_dagster.runtime.processes import spawn_server, terminate

MODULE = "agentenv_dagster.builtin.agents"
REPLAY = {"kind": "replay", "episodes": [{"match": ".", "reply": "ok"}]}


def cpu_seconds(pid: int) -> float:
    """The user and system CPU time process ``pid`` has used so far (Linux's /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_seconds(workdir: Path) -> tuple[float, float]:
    """Wall seconds from spawn to listening, and the host's CPU seconds by then."""
    started = time.perf_counter()
    server = spawn_server(MODULE, ["host"], workdir=workdir, ttl_seconds=120)
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(server.pid)
    terminate(server.pid)
    return elapsed, cpu


async def round_trips(workdir: Path, messages: int) -> tuple[list[float], float]:
    """Each message's round trip, and the host's CPU seconds a message."""
    server = spawn_server(MODULE, ["host"], workdir=workdir / "host", ttl_seconds=600)
    try:
        async with httpx.AsyncClient(timeout=30, headers=server.auth_headers) as http:
            url = (await http.post(f"{server.url}/agents", json={
                "id": "a", "sandbox": str(workdir / "a"), "config": REPLAY})).json()["url"]
            a2a = A2AClient(http)
            await a2a.send_and_wait(url, "warm up", timeout_seconds=30)
            cpu = cpu_seconds(server.pid)
            times = []
            for i in range(messages):
                started = time.perf_counter()
                reply = await a2a.send_and_wait(url, f"message {i}", timeout_seconds=30)
                times.append(time.perf_counter() - started)
                assert reply.text == "ok", reply
            return times, (cpu_seconds(server.pid) - cpu) / messages
    finally:
        terminate(server.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--messages", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        starts = [start_seconds(Path(tmp) / f"start{i}") for i in range(args.starts)]
        times, cpu = asyncio.run(round_trips(Path(tmp), args.messages))
    print(f"host start (spawn to listening), median of {args.starts}: "
          f"{statistics.median(wall for wall, _ in starts) * 1000:.0f} ms wall, "
          f"{statistics.median(cpu for _, cpu in starts) * 1000:.0f} ms CPU")
    print(f"message round trip, median of {args.messages}: {statistics.median(times) * 1000:.2f} ms")
    print(f"host CPU a message: {cpu * 1000:.2f} ms")


if __name__ == "__main__":
    main()
