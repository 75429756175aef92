"""The cyclic garbage collector's full sweeps, made rare while a run executes.

A full sweep walks every object the process holds: Dagster's definitions, every import, and a
dataset run's thousands of contexts. Python starts one whenever its old generation has grown
by a quarter, and a run's rows keep growing it: on the 1,000-row fan-out benchmark one run
process made 13 full sweeps, 3.1 s of its ~20 s, which found next to nothing to free (the
rows are alive). While any run executes in this process, a full sweep waits for
``FULL_SWEEP_EVERY`` middle-generation sweeps instead of Python's 10; the young generations
are collected as ever, and the process's own setting returns when the last run ends.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

FULL_SWEEP_EVERY = 1000  # middle-generation sweeps between full ones (Python's default: 10)

_lock = threading.Lock()
_running = 0
_saved: tuple[int, int, int] = gc.get_threshold()


def sweep_rarely() -> None:
    """For good, in a process that exists to serve a code location (``definitions.py`` calls
    it: the code server, run workers, step processes): building and snapshotting a thousand
    tasks' jobs grows the heap as a run's rows do (at 1,000 tasks, 3.0 s of an 18 s load went
    to full sweeps)."""
    gc.set_threshold(*_rarer(gc.get_threshold()))


@contextmanager
def fewer_full_sweeps() -> Iterator[None]:
    """Full sweeps held back for the duration (nests, and is safe across threads)."""
    global _running, _saved
    with _lock:
        if _running == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(*_rarer(_saved))
        _running += 1
    try:
        yield
    finally:
        with _lock:
            _running -= 1
            if _running == 0:
                gc.set_threshold(*_saved)


def _rarer(threshold: tuple[int, int, int]) -> tuple[int, int, int]:
    """The same setting with full sweeps at most every ``FULL_SWEEP_EVERY`` (never more often
    than the process already had them)."""
    young, middle, full = threshold
    return young, middle, max(full, FULL_SWEEP_EVERY)
