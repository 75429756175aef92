"""Local server processes: spawn one, wait until it is ready, end it.

Deployed envs and agents must outlive the op that deployed them (under the multiprocess
executor every op is its own process), so each runs in its own session and is found again
by pid, never by a Python object.
"""

from __future__ import annotations

import gc
import io
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


READY_FILE = "ready.json"  # {"url": ..., "pid": ...}, written by the server once it listens
LOG_FILE = "server.log"
STARTER_LOG_FILE = "starter.log"  # fork_servers' starter's, beside the folders of the servers it forks
FORKED_FILE = "forked.json"  # {"pid": ...}, written by fork_servers' starter as it forks the server
PROMPTED_FILE = "prompted"  # made by an agent host in its folder (its working directory) as its first agent task starts


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


def fork_servers(module: str, args: list[str], servers: dict[str, dict], *, folder: Path,
                 first: int | None = None) -> int:
    """Start a starter, ``python -m module args`` (or that module run in a process forked from
    this one, where that is safe: ``_forked_starter``), which reads ``servers`` (name:
    ``{"env", "ttl_seconds"}``) on its standard input, imports the server once and forks one
    server for each, in its own session and in the folder ``folder/<name>``, with that
    environment on top of this one's (the first ``first`` of them, when given, first: the
    others once those are prompted, ``serving.fork_and_serve``); then it exits.
    :func:`adopt_server` finds each. The pid of that starter. (The environments, which may
    hold keys, go through a pipe or memory: nothing of them is written to disk.)

    What this saves is the import: an agent host's is ~0.35 s of CPU in a new interpreter
    (~0.2 s forked from this process), paid once for the hosts of all the shard runs of a
    dataset, not once a host."""
    spec = []
    for index, (name, server) in enumerate(servers.items()):
        (folder / name).mkdir(parents=True, exist_ok=True)
        spec.append({**server, "workdir": str(folder / name), "later": first is not None and index >= first})
    if forks_safely():
        return _forked_starter(module, args, spec, folder)
    with open(folder / STARTER_LOG_FILE, "ab") as log:
        starter = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder,
        )
    try:
        with starter.stdin:
            starter.stdin.write(json.dumps(spec).encode())
    except BrokenPipeError:  # it ended first: adopting its servers says why (its log)
        pass
    return starter.pid


def forks_safely() -> bool:
    """A fork carries only the thread that calls it: safe while this process runs no other."""
    return sys.platform == "linux" and threading.active_count() == 1


def _forked_starter(module: str, args: list[str], spec: list[dict], folder: Path) -> int:
    """The starter of :func:`fork_servers`, forked from this process rather than started anew:
    what the server imports that this process has imported already (pydantic, httpx, anyio,
    protobuf ...) is not imported again, ~0.15 s of CPU less while the runs start. It keeps
    nothing of this process's but its modules: its own session, folder, log and input; the
    other files this process has open (its runs' pipes) closed; the default signal handlers."""
    log = os.open(folder / STARTER_LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(log)
        return pid
    code = 1
    try:
        gc.freeze()  # this process's objects are never collected here: none finalized on a file closed below
        os.setsid()
        os.chdir(folder)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))
        sys.stdin = io.StringIO(json.dumps(spec))  # what ``python -m module`` would read from its pipe
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_DFL)
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - said in its log, which adopting its servers reads
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def adopt_server(workdir: Path, starter_pid: int, ready_timeout: float = 60.0) -> ServerProcess:
    """The server :func:`fork_servers` forked into ``workdir``, once it has written its URL.
    Raises ``ServerStartError`` when it (or its starter, before forking it) ended first."""
    what = f"the server forked into {workdir}"

    def exited() -> str | None:
        pid = forked_pid(workdir)
        if pid is None:
            if is_running(starter_pid) or forked_pid(workdir) is not None:  # (it may have forked it and ended just now)
                return None
            return f"{what} was never forked: {_tail(workdir.parent / STARTER_LOG_FILE)}"
        if is_running(pid):
            return None
        return f"{what} exited before it was ready: {_tail(workdir / LOG_FILE)}"

    ready = _wait_until_ready(workdir / READY_FILE, what, exited, ready_timeout)
    return ServerProcess(pid=ready["pid"], url=ready["url"])


def forked_pid(workdir: Path) -> int | None:
    """The pid of the server :func:`fork_servers` forked into ``workdir``; None before it is forked."""
    try:
        return json.loads((workdir / FORKED_FILE).read_text())["pid"]
    except FileNotFoundError:
        return None


READY_POLL_SECONDS = 0.02


def _wait_until_ready(ready_file: Path, what: str, exited: Callable[[], str | None], timeout: float) -> dict:
    """The ready file's content once written, polling until ``exited()`` says why it never
    will be, or ``timeout``. Every ``READY_POLL_SECONDS``: a poll costs ~0.1 ms of CPU, and
    what waits is a run's step (a backoff to 0.2 s had the first agents of a dataset's runs
    start ~0.1 s after their host was ready)."""
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
