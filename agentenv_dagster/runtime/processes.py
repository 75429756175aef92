"""Local server processes: spawn one, wait until it is ready, end it.

Deployed envs and agents must outlive the op that deployed them (under the multiprocess
executor every op is its own process), so each runs in its own session and is found again
by pid, never by a Python object.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


class ServerStartError(RuntimeError):
    """A local server exited or stayed silent before it said it was ready."""


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    url: str


def spawn_server(
    module: str,
    args: list[str],
    *,
    workdir: Path,
    ttl_seconds: float,
    ready_timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start ``python -m module args`` and return once it has written its URL.

    The server writes ``{"url": ...}`` to ``--ready-file`` after it is listening; its output
    goes to ``<workdir>/server.log`` so a failed start can say why.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    ready_file = workdir / "ready.json"
    ready_file.unlink(missing_ok=True)
    log_path = workdir / "server.log"
    command = [
        sys.executable, "-m", module, *args,
        "--ready-file", str(ready_file), "--ttl-seconds", str(ttl_seconds),
    ]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            cwd=workdir,
        )
    deadline = time.monotonic() + ready_timeout
    delay = 0.02
    while time.monotonic() < deadline:
        if ready_file.exists():
            try:
                url = json.loads(ready_file.read_text())["url"]
            except (ValueError, KeyError):
                url = None  # half-written; the server renames atomically, but be safe
            if url:
                return ServerProcess(pid=proc.pid, url=url)
        if proc.poll() is not None:
            raise ServerStartError(
                f"{module} exited with code {proc.returncode} before it was ready: "
                f"{_tail(log_path)}"
            )
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)
    terminate(proc.pid)
    raise ServerStartError(f"{module} was not ready within {ready_timeout:.0f}s: {_tail(log_path)}")


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def terminate(pid: int, grace_seconds: float = 5.0) -> bool:
    """End the server's whole process group: SIGTERM, then SIGKILL after the grace period.

    Returns True when something was running.
    """
    if not is_running(pid):
        return False
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if not is_running(pid):
            return True
        time.sleep(0.02)
    _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace_seconds
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:].strip() or "(no output)"
    except OSError:
        return "(no log)"
