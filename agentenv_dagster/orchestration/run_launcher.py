"""A run launcher that forks each run's worker from a warm process (a *zygote*, started by the launcher's owner on
its first launch) that has Dagster and agentenv_dagster imported, instead of a new Python per run (docs/concepts.md,
docs/performance.md). The child runs what ``dagster api execute_run`` runs, so code reloaded in the UI is what runs.
The project's instance (``.dagster_home/dagster.yaml``, as ``execute.py`` writes it) names it as its
``run_launcher``. A code location served by another Python goes through Dagster's default launcher. The UI's
*Terminate* marks the run ``CANCELING`` and its worker interrupts itself (``terminate`` returns False when the
worker is gone: the UI offers to mark the run failed). Forked runs outlive the zygote, as Dagster's outlive their
code server."""

from __future__ import annotations

import gc
import importlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from contextlib import suppress

import dagster as dg

from ..runtime.processes import is_running
from .dagster_internals import (
    RUN_WORKER_MODULES, ConfigurableClass, ConfigurableClassData, InstanceRef, LaunchRunContext, RunLauncher,
    execute_launched_run,
)

# What a run worker imports before its code location's file: loaded once, in the zygote.
PRELOADED = (*RUN_WORKER_MODULES, "agentenv_dagster.orchestration.location",
             "agentenv_dagster.orchestration.task_job", "agentenv_dagster.orchestration.coder_eval")
CANCEL_POLL_SECONDS = 1.0  # how often a run worker looks for its run being cancelled
WORKER_STARTED = re.compile(r"Started process for run \(pid: (\d+)\)")  # Dagster's run workers write it


class ForkingRunLauncher(RunLauncher, ConfigurableClass):
    """Launches each run in a process forked from a warm zygote (see the module's docstring)."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        self._inst_data = inst_data
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._default = dg.DefaultRunLauncher()
        super().__init__()

    @property
    def inst_data(self) -> ConfigurableClassData | None:
        return self._inst_data

    @classmethod
    def config_type(cls) -> dict:
        return {}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: dict) -> ForkingRunLauncher:
        return cls(inst_data=inst_data)

    def register_instance(self, instance: dg.DagsterInstance) -> None:
        super().register_instance(instance)
        self._default.register_instance(instance)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        if not _runs_on_this_python(run):
            return self._default.launch_run(context)
        with self._lock:
            if self._zygote is None or not self._zygote.alive():
                self._zygote = _Zygote(dg.serialize_value(self._instance.get_ref()))
            self._zygote.fork(run.run_id)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished:
            return False
        if not _runs_on_this_python(run):
            return self._default.terminate(run_id)
        if (worker := _worker_pid(self._instance, run_id)) is not None and not is_running(worker):
            return False  # nothing left to stop it: the caller may mark the run failed
        self._instance.report_run_canceling(run)  # the worker sees it and interrupts itself
        return True

    def dispose(self) -> None:
        with self._lock:
            if self._zygote is not None:
                self._zygote.close()
                self._zygote = None


def _worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid of the run's worker, from the event it writes as it starts (None before)."""
    for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        if found := WORKER_STARTED.match(record.message or ""):
            return int(found[1])
    return None


def _runs_on_this_python(run: dg.DagsterRun) -> bool:
    """Whether the run's code location is served by this interpreter, which the zygote is."""
    origin = run.job_code_origin
    with suppress(OSError):  # its interpreter is gone
        return origin is not None and os.path.samefile(origin.executable_path, sys.executable)
    return False


class _Zygote:
    """The warm process: a first line in (the launcher's instance, opened once and shared by every
    worker it forks), then per run a line in (its id) and a line out (its worker's pid)."""

    def __init__(self, instance_ref: str) -> None:
        requests_in, self._requests = os.pipe()
        self._replies, replies_out = os.pipe()
        self._process = subprocess.Popen([sys.executable, "-m", __name__, str(requests_in), str(replies_out)],
                                         pass_fds=(requests_in, replies_out), stdin=subprocess.DEVNULL)
        os.close(requests_in)
        os.close(replies_out)
        self._send = os.fdopen(self._requests, "w")
        self._receive = os.fdopen(self._replies, "r")
        self._send.write(instance_ref + "\n")

    def alive(self) -> bool:
        return self._process.poll() is None

    def fork(self, run_id: str) -> None:
        with suppress(BrokenPipeError):  # then the reply below is empty
            self._send.write(run_id + "\n")
            self._send.flush()
        if not self._receive.readline():
            raise dg.DagsterInvariantViolationError(
                f"the process that forks run workers exited (exit code {self._process.wait()}); see its output above")

    def close(self) -> None:
        """End the zygote (its end of the requests closes); workers it forked go on."""
        self._send.close()
        self._receive.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def serve(requests_fd: int, replies_fd: int) -> None:
    """The zygote's loop: import what a run worker needs, then fork a worker per request until
    the launcher's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is for the runs
    for module in PRELOADED:
        importlib.import_module(module)
    signal.signal(signal.SIGCHLD, _reap)
    with os.fdopen(requests_fd, "r") as requests, os.fdopen(replies_fd, "w") as replies, \
            dg.DagsterInstance.from_ref(dg.deserialize_value(requests.readline(), InstanceRef)) as instance:
        instance.get_run_by_id("")  # its storage imported, opened and checked once, here
        gc.freeze()  # what the workers inherit is left out of their collections: its pages stay shared
        for line in requests:
            pid = os.fork()
            if pid == 0:
                requests.close()
                replies.close()
                _work(line.strip(), instance)
            replies.write(f"{pid}\n")
            replies.flush()


def _reap(_signum: int, _frame: object) -> None:
    """Wait for the workers that ended: waited for (not ignored), their CPU time counts in the
    zygote's children's, which is how a launch's whole cost is measured (bench/overhead.py)."""
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _work(run_id: str, instance: dg.DagsterInstance) -> None:
    """A forked run worker: the run, then this process's end (never back into the zygote's loop)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the run waits for what it starts itself
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 1
    try:
        _watch_for_cancel(instance, run_id)
        code = execute_launched_run(run_id, instance)
    except BaseException:  # noqa: BLE001 - the worker reports and exits; it must not return to the loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _watch_for_cancel(instance: dg.DagsterInstance, run_id: str) -> None:
    """Interrupt this worker once the launcher's ``terminate`` marks its run cancelling."""

    def watch() -> None:
        while True:
            run = instance.get_run_by_id(run_id)
            if run is None or run.is_finished:
                return
            if run.status in (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(CANCEL_POLL_SECONDS)

    threading.Thread(target=watch, name="agentenv-cancel-watch", daemon=True).start()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
