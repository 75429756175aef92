"""Ending a server process: SIGTERM to its group, SIGKILL after the grace period, whether
this process started it or not (forked hosts are the starter's, then init's)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from agentenv_dagster.runtime.processes import RUN_OWNER_VARIABLE, ProcessIdentity, is_running, run_owner, terminate

SERVES = 'import time; print("ready", flush=True); time.sleep(60)'
IGNORES_SIGTERM = ('import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print("ready", flush=True); '
                   'time.sleep(60)')


def _started(script: str) -> subprocess.Popen:
    """The script in a session of its own, once it has said it is ready (its signal handler in place)."""
    server = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline() == "ready\n"
    return server


def test_a_server_that_ends_at_sigterm_is_ended_and_one_that_ignores_it_is_killed_after_the_grace():
    ends, ignores = _started(SERVES), _started(IGNORES_SIGTERM)
    try:
        assert terminate(ends.pid, grace_seconds=30) is True
        assert not is_running(ends.pid)
        began = time.monotonic()
        assert terminate(ignores.pid, grace_seconds=0.5) is True
        assert time.monotonic() - began >= 0.5 and not is_running(ignores.pid)
        assert terminate(ends.pid) is False  # nothing left to end
    finally:
        for server in (ends, ignores):
            server.kill()
            server.wait()
            server.stdout.close()


def test_a_server_this_process_did_not_start_is_ended_too():
    """As an agent host forked by its starter: not a child of the process that ends it."""
    said = subprocess.run(["sh", "-c", f"setsid {sys.executable} -c '{SERVES}' >/dev/null 2>&1 & echo $!"],
                          capture_output=True, text=True, check=True)
    pid = int(said.stdout)
    time.sleep(0.3)
    try:
        assert is_running(pid)
        assert terminate(pid, grace_seconds=30) is True
        assert not is_running(pid)
    finally:
        if is_running(pid):
            terminate(pid, grace_seconds=1)


STEP_PROCESS = """
import multiprocessing, os, sys
from agentenv_dagster.runtime.processes import run_owner

if __name__ == "__main__":
    assert run_owner().pid == os.getpid()
    pool = multiprocessing.get_context(sys.argv[1]).Pool(1)
    print(pool.apply(run_owner).pid == os.getpid(), flush=True)
    pool.close()  # and joined: terminate() can wait forever on the queue lock an idle worker holds
    pool.join()
"""


@pytest.mark.parametrize("method", ["forkserver", "spawn", "fork"])
def test_the_run_owner_of_a_step_process_is_the_process_that_runs_the_steps(method, tmp_path):
    """Dagster's multiprocess executor runs each step in a ``multiprocessing`` child (forked
    from a forkserver, or spawned): the run's servers must outlive that step, so they are
    bound to the process the step runs for. (The pool runs in a fresh interpreter: a child
    forked from this xdist worker would share its threads' locks and its channel.)"""
    script = tmp_path / "steps.py"
    script.write_text(STEP_PROCESS)
    done = subprocess.run([sys.executable, str(script), method], check=False, capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr


def test_a_process_that_owns_runs_for_another_can_say_so(monkeypatch):
    monkeypatch.setenv(RUN_OWNER_VARIABLE, str(os.getppid()))
    assert run_owner() == ProcessIdentity.of(os.getppid())
