"""The project instance's compute logs: a run's stdout and stderr in Dagster's files (what the
UI shows) and on the terminal, mirrored by a GNU ``tail --pid`` with no watcher interpreter;
Dagster's own mirror where ``tail`` is not GNU's. Runs in real subprocesses (the capture
redirects the process's file descriptors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from agentenv_dagster.orchestration.compute_logs import tail_ends_with_its_process
from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.runtime.processes import is_running

RUN = textwrap.dedent("""\
    import json, subprocess, sys
    from pathlib import Path
    import dagster as dg
    from agentenv_dagster.orchestration import compute_logs

    started = []
    class Recording(subprocess.Popen):
        def __init__(self, args, *a, **k):
            if "--version" not in args:  # (the look at which tail it is)
                started.append([str(arg) for arg in args])
            super().__init__(args, *a, **k)
    subprocess.Popen = Recording
    if sys.argv[2] == "not-gnu":
        compute_logs.tail_ends_with_its_process = lambda: False

    @dg.op
    def speak():
        print("hello from the op", flush=True)
        print("and to stderr", file=sys.stderr, flush=True)

    @dg.job
    def talk():
        speak()

    with dg.DagsterInstance.from_config(sys.argv[1]) as instance:
        assert type(instance.compute_log_manager) is compute_logs.LocalComputeLogs
        assert talk.execute_in_process(instance=instance).success
    print(json.dumps(started), file=sys.stderr)
    """)


@pytest.mark.parametrize("tail", ["gnu", "not-gnu"])
def test_a_run_s_output_is_in_the_files_the_ui_reads_and_on_the_terminal(tmp_path, tail):
    if tail == "gnu" and not tail_ends_with_its_process():
        pytest.skip("this machine's tail is not GNU's")
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    done = subprocess.run([sys.executable, "-c", RUN, str(home), tail], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DAGSTER_COMPUTE_LOG_TAIL_WAIT_AFTER_FINISH": "0.5"})
    assert done.returncode == 0, done.stderr
    captured = {p.suffix: p.read_text() for p in (home / "storage").rglob("*") if p.suffix in (".out", ".err")}
    assert "hello from the op" in captured[".out"] and "and to stderr" in captured[".err"]
    assert "hello from the op" in done.stdout and "and to stderr" in done.stderr  # mirrored to the terminal
    started = json.loads(done.stderr.strip().splitlines()[-1])
    tails = [args for args in started if args[0] == "tail"]
    watchers = [args for args in started if args[0] == sys.executable]
    assert len(tails) == 2
    if tail == "gnu":  # each tail ends with the run's process: no watcher
        assert all(any(a.startswith("--pid=") for a in args) for args in tails) and watchers == []
    else:  # Dagster's: a watcher interpreter beside each tail
        assert len(watchers) == 2 and not any(a.startswith("--pid=") for args in tails for a in args)


RECORDS_TAILS = textwrap.dedent("""\
    import subprocess
    started = []  # the pids of the tails a capture starts (installed after the imports)
    class Recording(subprocess.Popen):
        def __init__(self, args, *a, **k):
            super().__init__(args, *a, **k)
            if "--version" not in args:  # (the look at which tail it is)
                started.append(self.pid)
    subprocess.Popen = Recording
    """)

DIES = textwrap.dedent("""\
    import os, sys
    from agentenv_dagster.orchestration.compute_logs import LocalComputeLogs
    """) + RECORDS_TAILS + textwrap.dedent("""\
    logs = LocalComputeLogs(base_dir=sys.argv[1])
    capturing = logs.capture_logs(["run", "compute_logs", "x"])
    capturing.__enter__()
    os.write(int(sys.argv[2]), " ".join(map(str, started)).encode())
    os._exit(0)  # killed, say: nothing ends the tails but their --pid
    """)


def test_a_tail_ends_by_itself_when_the_run_s_process_dies(tmp_path):
    if not tail_ends_with_its_process():
        pytest.skip("this machine's tail is not GNU's")
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", DIES, str(tmp_path), str(write)], pass_fds=(write,),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as said:
        tails = [int(pid) for pid in said.read().split()]
    child.wait(30)
    assert len(tails) == 2
    assert _all_end(tails)  # (tail looks for its process every second)


def _all_end(pids: list[int], seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while any(is_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(is_running(pid) for pid in pids)


SLOW_TAIL = """#!/bin/sh
if [ "$1" = --version ]; then echo "tail (GNU coreutils) 9.1"; exit 0; fi
trap '' TERM
sleep 3
"""

ENDS = textwrap.dedent("""\
    import json, sys, time
    from pathlib import Path
    from agentenv_dagster.orchestration.compute_logs import LocalComputeLogs
    """) + RECORDS_TAILS + textwrap.dedent("""\
    def state(pid):  # "Z": ended, not reaped yet; None: reaped
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return None

    logs = LocalComputeLogs(base_dir=sys.argv[1])
    began = time.monotonic()
    with logs.capture_logs(["run", "compute_logs", "a"]):
        pass
    took = time.monotonic() - began
    first = list(started)
    while any(state(pid) not in ("Z", None) for pid in first) and time.monotonic() < began + 20:
        time.sleep(0.05)
    ended = [state(pid) for pid in first]
    with logs.capture_logs(["run", "compute_logs", "b"]):
        reaped = [state(pid) for pid in first]
    print(json.dumps({"took": took, "ended": ended, "reaped": reaped, "tails": started}))
    """)


def test_a_run_s_end_tells_its_tails_to_end_and_the_next_capture_reaps_them(tmp_path):
    """The end of a capture does not wait out its tails' exit (each tail here ignores SIGTERM
    for 3 s); they end, and the next capture reaps them: none is left running or a zombie."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tail").write_text(SLOW_TAIL)
    (bin_dir / "tail").chmod(0o755)
    done = subprocess.run([sys.executable, "-c", ENDS, str(tmp_path / "logs")], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["took"] < 2.0  # not the 3 s the tails take to end
    assert said["ended"] == ["Z", "Z"] and said["reaped"] == [None, None]
    assert _all_end(said["tails"])  # the second capture's tails end by themselves
