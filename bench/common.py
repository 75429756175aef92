"""What the benchmarks share: the machine's busy CPU, the row-major ideal, timing a command."""

from __future__ import annotations

import heapq
import os
import subprocess
import sys
import time
from pathlib import Path


def busy_cpu_seconds() -> float | None:
    """Seconds the machine's CPUs spent busy so far (Linux's /proc/stat), None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def list_schedule(durations: list[float], lanes: int) -> float:
    """The makespan of running ``durations`` in their order on ``lanes`` lanes, each row on the
    first lane free (what a row-major runner with that concurrency does at best)."""
    free = [0.0] * lanes
    end = 0.0
    for duration in durations:
        start = heapq.heappop(free)
        heapq.heappush(free, start + duration)
        end = max(end, start + duration)
    return end


def timed(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float | None, str]:
    """Run ``command`` to its end: its wall time, the machine's busy CPU seconds meanwhile, and
    its output (the last lines)."""
    busy = busy_cpu_seconds()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    busy = busy_cpu_seconds() - busy if busy is not None else None
    output = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode not in (0, 1):  # 1: some rows failed, which the benchmark reports
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n" + "\n".join(output[-30:]))
    return elapsed, busy, "\n".join(output[-12:])
