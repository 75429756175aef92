"""The project instance's compute logs: Dagster's local ones, mirrored without a Python watcher.

Dagster's ``LocalComputeLogManager`` captures a run's stdout and stderr into files (what the UI
shows) and mirrors each file back to the terminal with ``tail -F``; beside each tail it starts
a Python interpreter whose only work is to end that tail should the run's process die. That is
two interpreters a run (~40 ms of CPU each here, at the run's start, where a dataset's first
runs compete with their agent hosts' start). GNU ``tail --pid`` ends by itself once the
process it watches is gone, so here the tail watches the run's process and no watcher starts.
Where ``tail`` is not GNU's (macOS, BusyBox) Dagster's own mirror runs. The files, and so what
the UI shows, are Dagster's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

import yaml
from dagster._core.execution.compute_logs import _fileno, redirect_to_file
from dagster._core.instance.ref import compute_logs_directory
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster._utils import ensure_file, touch_file


class LocalComputeLogs(LocalComputeLogManager):
    """``LocalComputeLogManager`` whose mirror is a ``tail --pid`` alone, where GNU tail is."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        tail_ends_with_its_process()  # asked once, as the instance opens: the runs forked from it know

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> LocalComputeLogs:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        if not tail_ends_with_its_process():
            with super().capture_logs(log_key) as captured:
                yield captured
            return
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with _mirrored(sys.stdout, out), _mirrored(sys.stderr, err):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # as Dagster's: the capture is complete


def compute_logs_yaml(home: Path) -> str:
    """The ``compute_logs:`` block of an instance in ``home``: its files where Dagster's go."""
    return yaml.safe_dump({"compute_logs": {
        "module": __name__, "class": LocalComputeLogs.__name__,
        "config": {"base_dir": compute_logs_directory(str(home.resolve()))}}})


@contextmanager
def _mirrored(stream: IO[str], path: str) -> Iterator[None]:
    """``stream`` into the file at ``path``, the file shown on ``stream`` as it grows (as
    Dagster's ``mirror_stream_to_file``), by a tail that ends if this process dies."""
    ensure_file(path)
    _reap_ended()
    tail = subprocess.Popen(["tail", "-F", "-c", "+0", f"--pid={os.getpid()}", path],
                            stdout=stream if _fileno(stream) else None)
    try:
        with redirect_to_file(stream, path):
            yield
    finally:
        # Dagster's setting: a pause for the tail to show the last lines before it ends
        time.sleep(float(os.getenv("DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH", "0")))
        _end(tail)


# Tails told to end, not yet reaped. A tail's exit takes ~15 ms here (the kernel's teardown of
# its file watch), and Dagster's wait for it polls with a growing sleep: 15-30 ms a stream, two
# streams a run, at the end of every run. Nothing the run does waits on it.
_ENDED: list[subprocess.Popen] = []


def _end(tail: subprocess.Popen) -> None:
    """Tell the tail to end and go on: the next capture in this process reaps it (or, once this
    process has ended, the system does)."""
    with suppress(OSError):
        tail.terminate()
    _ENDED.append(tail)


def _reap_ended() -> None:
    _ENDED[:] = [tail for tail in _ENDED if tail.poll() is None]


@lru_cache(maxsize=1)
def tail_ends_with_its_process() -> bool:
    """Whether ``tail`` is GNU's, which has ``--pid``."""
    tail = shutil.which("tail")
    if tail is None:
        return False
    try:
        found = subprocess.run([tail, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return found.returncode == 0 and "GNU coreutils" in found.stdout
