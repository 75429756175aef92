"""Local server processes: spawn one, wait until it is ready, end it.

Deployed envs and agents must outlive the op that deployed them (under the multiprocess
executor every op is its own process), so each runs in its own session and is found again
by pid, never by a Python object.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


READY_FILE = "ready.json"  # {"url": ..., "pid": ...}, written by the server once it listens
LOG_FILE = "server.log"


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
    ready_file = workdir / READY_FILE
    ready_file.unlink(missing_ok=True)
    log_path = workdir / LOG_FILE
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

    def exited() -> str | None:
        if proc.poll() is None:
            return None
        return f"{module} exited with code {proc.returncode} before it was ready: {_tail(log_path)}"

    try:
        url = _wait_until_ready(ready_file, module, exited, ready_timeout)["url"]
    except ServerStartError:
        terminate(proc.pid)
        raise
    return ServerProcess(pid=proc.pid, url=url)


READY_POLL_SECONDS = 0.02


def _wait_until_ready(ready_file: Path, what: str, exited: Callable[[], str | None], timeout: float) -> dict:
    """The ready file's content once written, polling every ``READY_POLL_SECONDS`` until
    ``exited()`` says why it never will be, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready_file.exists():
            try:
                ready = json.loads(ready_file.read_text())
            except ValueError:
                ready = {}  # half-written; the server renames atomically, but be safe
            if ready.get("url"):
                return ready
        reason = exited()
        if reason is not None:
            raise ServerStartError(reason)
        time.sleep(READY_POLL_SECONDS)
    raise ServerStartError(f"{what} was not ready within {timeout:.0f}s: {_tail(ready_file.parent / LOG_FILE)}")


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
    if not _ended_within(pid, grace_seconds):
        _signal_group(pid, signal.SIGKILL)
        _ended_within(pid, grace_seconds)
    return True


def _ended_within(pid: int, seconds: float) -> bool:
    """Whether the process ends within ``seconds``: woken as it ends where Linux says so (a
    pidfd; a run's teardown waits on its servers' ends), else looking every 20 ms."""
    deadline = time.monotonic() + seconds
    try:
        ends = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, or it has ended
        ends = None
    try:
        while is_running(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if ends is None:
                time.sleep(min(left, 0.02))
            else:  # readable once it has ended (a child of this process: once it is a zombie)
                select.select([ends], [], [], left)
        return True
    finally:
        if ends is not None:
            os.close(ends)


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
