"""Full garbage-collector sweeps are held back while a run executes, and come back after."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

from agentenv_dagster.runtime.collector import FULL_SWEEP_EVERY, fewer_full_sweeps
from projects import REPO


def full_sweeps_while_growing() -> int:
    """Full sweeps Python makes while the heap doubles with live containers (as a dataset
    run's contexts grow it); Python sweeps it whole each time it has grown by a quarter."""
    rows = max(200_000, len(gc.get_objects()) // 2)  # two containers a row
    sweeps = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            sweeps.append(1)

    gc.callbacks.append(count)
    try:
        kept = [{"row": i, "values": [i]} for i in range(rows)]
    finally:
        gc.callbacks.remove(count)
    del kept
    return len(sweeps)


def test_a_growing_heap_is_not_swept_whole_while_a_run_executes():
    before = gc.get_threshold()
    assert full_sweeps_while_growing() > 0  # Python's own setting sweeps as the heap grows
    with fewer_full_sweeps():
        assert gc.get_threshold() == (before[0], before[1], FULL_SWEEP_EVERY)
        assert full_sweeps_while_growing() == 0
    assert gc.get_threshold() == before


def test_runs_in_threads_restore_the_setting_when_the_last_one_ends():
    before = gc.get_threshold()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first() -> None:
        with fewer_full_sweeps():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with fewer_full_sweeps():
            second_in.set()
            first_out.wait(10)
            seen["after the first ended"] = gc.get_threshold()[2]

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert seen == {"after the first ended": FULL_SWEEP_EVERY}
    assert gc.get_threshold() == before


def test_a_process_that_sweeps_less_often_already_keeps_its_setting():
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], 5000)
    try:
        with fewer_full_sweeps():
            assert gc.get_threshold()[2] == 5000
        assert gc.get_threshold()[2] == 5000
    finally:
        gc.set_threshold(*before)


def test_a_code_location_process_sweeps_rarely_for_good():
    """The root definitions.py sets it for the processes that import it (code server, run
    workers), and a run inside such a process leaves it so."""
    probe = ("import gc, runpy; runpy.run_path('definitions.py'); "
             "from agentenv_dagster.runtime.collector import fewer_full_sweeps\n"
             "with fewer_full_sweeps(): pass\n"
             "print(gc.get_threshold()[2])")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == FULL_SWEEP_EVERY
