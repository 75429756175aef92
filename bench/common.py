"""What the benchmarks share: the machine's busy CPU, the row-major ideal, timing a command, a
project like this checkout and a Dagster webserver on it."""

from __future__ import annotations

import heapq
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


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


# -- a project like this checkout, and a Dagster webserver on it ------------------------------

ROOT = Path(__file__).resolve().parents[1]
LOCATION = """{ workspaceOrError { ... on Workspace { locationEntries { loadStatus locationOrLoadError {
  __typename ... on RepositoryLocation { name repositories { name jobs { name } } }
  ... on PythonError { message } } } } } }"""


def copy_project(root: Path, tasks: list[Path] | None = None) -> Path:
    """A project at ``root`` as this checkout is: its config (not its state), agents,
    artifacts, ``definitions.py`` and ``workspace.yaml``, and in ``tasks/`` the files
    ``tasks`` (default: the checkout's tasks/ folder). Its tasks folder."""
    root.mkdir(parents=True, exist_ok=True)
    for folder in ("agents", "artifacts"):
        if (ROOT / folder).exists():
            shutil.copytree(ROOT / folder, root / folder)
    if (ROOT / ".agentenv").exists():
        shutil.copytree(ROOT / ".agentenv", root / ".agentenv", ignore=shutil.ignore_patterns("state"))
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(ROOT / name, root)
    tasks_dir = root / "tasks"
    if tasks is None:
        shutil.copytree(ROOT / "tasks", tasks_dir)
    else:
        tasks_dir.mkdir()
        for task in tasks:
            shutil.copy(task, tasks_dir)
    return tasks_dir


def _processes() -> dict[int, tuple[str, int, float]]:
    """Every process: (state, parent, CPU seconds of it and of the children it has waited
    for), from Linux's /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended meanwhile
            continue
        found[int(stat.parent.name)] = (fields[0], int(fields[1]), sum(int(f) for f in fields[11:15]) / tick)
    return found


def descendants(pid: int) -> set[int]:
    """The processes descended from ``pid`` that are running, or ended and not yet waited for
    by a parent other than ``pid`` (whose CPU that parent has yet to be credited with)."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for child, (state, parent, _cpu) in processes.items():
        if state != "Z" or parent != pid:
            children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def cpu_seconds(pids: set[int]) -> float:
    """CPU seconds of ``pids`` and of the children each has waited for."""
    processes = _processes()
    return sum(processes[pid][2] for pid in pids if pid in processes)


def steady_descendants(still: float = 3, timeout: float = 60) -> set[int]:
    """This process's descendants once the set has not changed for ``still`` seconds (what
    stays: a webserver, its code servers and their helpers)."""
    deadline = time.monotonic() + timeout
    seen, since = descendants(os.getpid()), time.monotonic()
    while time.monotonic() - since < still and time.monotonic() < deadline:
        time.sleep(0.2)
        now = descendants(os.getpid())
        if now != seen:
            seen, since = now, time.monotonic()
    return seen


def settle(baseline: set[int], timeout: float = 60) -> None:
    """Wait until this process has no descendants but ``baseline``: what one measured run
    started (servers, a run worker) has ended, so it does not slow the next one down."""
    deadline = time.monotonic() + timeout
    while descendants(os.getpid()) - baseline and time.monotonic() < deadline:
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_group(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``command`` in a process group of its own (a webserver and the code server it starts),
    its output in ``log``."""
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd, env={**os.environ, **env}, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """End ``proc``'s process group: a Dagster webserver's code server outlives its parent
    for a while, and one still loading can miss the first SIGTERM, so the group is asked
    again every few seconds until none of it is left, then killed."""
    deadline = time.monotonic() + timeout
    asked = 0.0
    try:
        while time.monotonic() < deadline:
            if time.monotonic() - asked > 5:
                os.killpg(proc.pid, signal.SIGTERM)
                asked = time.monotonic()
            time.sleep(0.2)
            proc.poll()
            os.killpg(proc.pid, 0)  # raises once no process of the group is left
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def graphql(client: httpx.Client, query: str, **variables) -> dict:
    reply = client.post("/graphql", json={"query": query, "variables": variables}).json()
    if reply.get("errors"):
        raise RuntimeError(reply["errors"])
    return reply["data"]


def wait_loaded(client: httpx.Client, proc: subprocess.Popen, timeout: float, poll: float = 0.5) -> list[dict]:
    """The webserver's code locations once every one is LOADED (name, repositories, jobs)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(map(str, proc.args[:3]))} exited with {proc.returncode}")
        try:
            entries = graphql(client, LOCATION)["workspaceOrError"]["locationEntries"]
        except httpx.TransportError:
            entries = []  # the webserver is not up yet
        if entries and all(entry["loadStatus"] == "LOADED" for entry in entries):
            locations = [entry["locationOrLoadError"] for entry in entries]
            for location in locations:
                if location["__typename"] == "PythonError":
                    raise RuntimeError(location["message"][:2000])
            return locations
        time.sleep(poll)
    raise TimeoutError(f"the code locations did not load in {timeout:.0f} s")
