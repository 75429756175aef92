"""Local server processes: spawn one, wait until it is ready, end it.

Servers outlive the op that deployed them (each in its own session, found again by its :class:`ProcessIdentity`)
but not the run's owner (:func:`run_owner`). A server gets its secrets on its stdin, never in its arguments (a
process list shows them) or its environment (its children inherit it), an allowlist (:data:`SERVER_ENV_KEYS`).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Callable

from .shell import SANDBOX_ENV_KEYS, passed_through

READY_FILE = "ready.json"  # {"url": ..., "pid": ...}, written by the server once it listens
LOG_FILE = "server.log"
READY_TIMEOUT_SECONDS = 60.0

# What a server gets of this process's environment: a sandbox shell's, and what Python and its tools need
# (Docker, the coding CLIs' homes, proxies, CA bundles), none of our keys.
SERVER_ENV_KEYS = (
    *SANDBOX_ENV_KEYS, "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", "DOCKER_HOST",
    "DOCKER_CERT_PATH", "DOCKER_TLS_VERIFY", "DOCKER_CONFIG", "CODEX_HOME", "CLAUDE_CONFIG_DIR", "SSL_CERT_FILE",
    "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
    "no_proxy", "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED",
)
RUN_OWNER_VARIABLE = "AGENTENV_RUN_OWNER_PID"  # set by a process that owns runs other than itself


class ServerStartError(RuntimeError):
    """A local server exited or stayed silent before it said it was ready."""


@dataclass(frozen=True)
class ProcessIdentity:
    """One process, told apart from a later one given the same pid by its start time, boot and machine."""

    pid: int
    started: int | None = None
    boot: str | None = None
    host: str = ""

    @classmethod
    def of(cls, pid: int) -> "ProcessIdentity":
        return cls(pid, _start_ticks(pid), _boot_id(), socket.gethostname())

    @property
    def here(self) -> bool:
        """Whether it ran on this machine since its last boot (only then can it be judged)."""
        return self.host == socket.gethostname() and (self.boot is None or self.boot == _boot_id())

    def alive(self) -> bool:
        """Still running, and still the same process (not a stranger given its pid since)."""
        return self.here and still_running(self.pid, self.started)


def run_owner() -> ProcessIdentity:
    """The process a run's servers must not outlive: ``AGENTENV_RUN_OWNER_PID`` when set, else this
    process's ``multiprocessing`` parent (a step process of Dagster's executor ends with its step), else itself."""
    if (named := os.environ.get(RUN_OWNER_VARIABLE)) and named.isdigit():
        return ProcessIdentity.of(int(named))
    parent = multiprocessing.parent_process()
    return ProcessIdentity.of(parent.pid if parent is not None and parent.pid else os.getpid())


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@cache
def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


@dataclass(frozen=True)
class ServerProcess:
    pid: int
    url: str
    token: str = ""  # the bearer token every request to it needs
    started: int | None = None  # its start time (``ProcessIdentity``)

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def authed_url(self) -> str:
        """``url`` with the token as its password (servers take it as HTTP Basic auth)."""
        return self.url.replace("://", f"://agentenv:{self.token}@", 1)


def spawn_server(
    module: str, args: list[str], *, workdir: Path, ttl_seconds: float, env: dict[str, str] | None = None,
    token: str | None = None, owner: ProcessIdentity | None = None, secrets_for_server: dict[str, Any] | None = None,
    on_started: Callable[[ProcessIdentity], None] | None = None,
) -> ServerProcess:
    """Start ``python -m module args`` and return once it has written its URL to ``--ready-file``. It requires
    ``token`` (default: a new one) on every request, ends with ``owner`` (default :func:`run_owner`) or its TTL,
    reads ``secrets_for_server`` and the token on its stdin, and has :data:`SERVER_ENV_KEYS` plus ``env``.
    ``on_started`` is told the process as soon as it exists (so a ledger has it if this process dies waiting)."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready_file = workdir / READY_FILE
    ready_file.unlink(missing_ok=True)
    token = token or secrets.token_urlsafe(32)
    owner = owner or run_owner()
    command = [
        sys.executable, "-m", module, *args,
        "--ready-file", str(ready_file), "--ttl-seconds", str(ttl_seconds),
        "--owner-pid", str(owner.pid), *(["--owner-started", str(owner.started)] if owner.started is not None else []),
    ]
    with open(workdir / LOG_FILE, "ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
                                start_new_session=True, env={**passed_through(SERVER_ENV_KEYS), **(env or {})})
    started = ProcessIdentity.of(proc.pid)
    try:
        if on_started is not None:
            on_started(started)
        with contextlib.suppress(BrokenPipeError):  # it has exited already: waiting for it says why
            proc.stdin.write(json.dumps({"token": token, **(secrets_for_server or {})}).encode())
            proc.stdin.close()
        url = _wait_until_ready(ready_file, module, proc)
    except BaseException:
        terminate(proc.pid)
        raise
    return ServerProcess(pid=proc.pid, url=url, token=token, started=started.started)


def _wait_until_ready(ready_file: Path, module: str, proc: subprocess.Popen) -> str:
    """The URL in the ready file once written; :class:`ServerStartError` if the server exits or times out."""
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):  # not written yet (the server renames it in place)
            if url := json.loads(ready_file.read_text()).get("url"):
                return url
        if proc.poll() is not None:
            raise ServerStartError(f"{module} exited with code {proc.returncode} before it was ready: "
                                   f"{_tail(ready_file.parent / LOG_FILE)}")
        time.sleep(0.02)
    raise ServerStartError(f"{module} was not ready within {READY_TIMEOUT_SECONDS:.0f}s: "
                           f"{_tail(ready_file.parent / LOG_FILE)}")


def is_running(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped if it is our child
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


def still_running(pid: int, started: int | None = None) -> bool:
    """The process is running and, with ``started``, is still the one that started then."""
    return is_running(pid) and (started is None or _start_ticks(pid) == started)


def terminate(pid: int, grace_seconds: float = 5.0, *, started: int | None = None) -> bool:
    """End the server's whole process group: SIGTERM, then SIGKILL after the grace period; True
    when something was running. With ``started`` a process whose pid was reused is left alone."""
    if not still_running(pid, started):
        return False
    _signal_group(pid, signal.SIGTERM)
    if not _ended_within(pid, grace_seconds):
        _signal_group(pid, signal.SIGKILL)
        _ended_within(pid, grace_seconds)
    return True


def _ended_within(pid: int, seconds: float) -> bool:
    """Whether the process ends within ``seconds``: woken by a pidfd where Linux has one, else polling."""
    deadline = time.monotonic() + seconds
    try:
        ends = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, or it has ended
        ends = None
    try:
        while is_running(pid):
            if (left := deadline - time.monotonic()) <= 0:
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
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:].strip() or "(no output)"
    except OSError:
        return "(no log)"
