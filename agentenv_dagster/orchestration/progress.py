"""What a person sees while ``agentenv-dagster run`` works, and the addresses it leaves: a live line per run on
a terminal, an occasional line elsewhere, none with ``--quiet``, Dagster's event lines with ``--verbose``; then
each run's status, UI page and assets, all read back from the run's event log (``run_tally.py``)."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from contextvars import ContextVar
from enum import StrEnum
from typing import IO, Any

import dagster as dg
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn

from .retries import TAG_RETRIED_BY
from .rows import REPLICATE_TAG, VARIANT_TAG
from .run_tally import UI_URL_ENV, RunTally, asset_url, clock, read_new_events, ui_url


class Mode(StrEnum):
    LIVE = "live"  # a terminal: the live display
    LINES = "lines"  # not a terminal: a line now and then
    QUIET = "quiet"  # the summary only
    VERBOSE = "verbose"  # Dagster's event lines, as Dagster prints them


def choose_mode(*, quiet: bool, verbose: bool, stream: IO[str]) -> Mode:
    """The mode the command's flags ask for; without one, live on a terminal, else lines."""
    return Mode.VERBOSE if verbose else Mode.QUIET if quiet else Mode.LIVE if stream.isatty() else Mode.LINES


POLL_SECONDS = 0.5
LINE_EVERY_SECONDS = 30.0  # not a terminal: at least this often while a run goes on
_COLOURS = {"passed": "green", "failed": "red", "errored": "yellow", "not graded": "blue"}


def run_label(job_name: str, tags: Mapping[str, str]) -> str:
    """A run's name on the display: its job, and the variant and replicate when they tell runs apart."""
    variant, replicate = tags.get(VARIANT_TAG), tags.get(REPLICATE_TAG)
    return job_name + (f" [{variant}]" if variant and variant != "default" else "") + (
        f" #{replicate}" if replicate and replicate != "0" else "")


class _View:
    """Where a run's progress shows: nowhere (quiet, verbose)."""

    def started(self, tally: RunTally) -> None: ...
    def update(self, tally: RunTally) -> None: ...
    def finished(self, tally: RunTally) -> None: ...
    def close(self) -> None: ...


class _Lines(_View):
    """Not a terminal: a line when the run starts, each tenth, every ``LINE_EVERY_SECONDS``, at its end."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.shown: dict[str, tuple[int, float, str]] = {}  # by run: the tenth done, when, the line

    def started(self, tally: RunTally) -> None:
        unit = f"{tally.rows} rows" if tally.by_rows else "1 row"
        self._print(tally, 0, f"{tally.label}: run {tally.run_id} started, {unit}")

    def update(self, tally: RunTally) -> None:
        tenth, when, _ = self.shown[tally.run_id]
        done, total, _ = tally.amount()
        now = math.floor(10 * done / total) if total else 0
        if tally.status is None and (tenth < now < 10 or time.monotonic() - when >= LINE_EVERY_SECONDS):
            self._print(tally, max(tenth, now), tally.line())

    def finished(self, tally: RunTally) -> None:
        if (line := tally.line()) != self.shown[tally.run_id][2]:
            self._print(tally, 10, line)

    def _print(self, tally: RunTally, tenth: int, line: str) -> None:
        self.shown[tally.run_id] = (tenth, time.monotonic(), line)
        print(line, file=self.stream, flush=True)


class _Live(_View):
    """A terminal: a ``rich`` progress display, a line per run, left on screen; stdout and stderr left alone."""

    def __init__(self, stream: IO[str]) -> None:
        width = None  # read once: while a run's logs are captured rich cannot find it (None: rich guesses)
        with suppress(AttributeError, OSError, ValueError):
            width = os.get_terminal_size(stream.fileno()).columns or None
        self.progress = Progress(
            SpinnerColumn(finished_text=" "), TextColumn("{task.description}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[amount]}"), TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[running]}", style="dim"), TextColumn("{task.fields[clock]}"),
            console=Console(file=stream, force_terminal=True, width=width), refresh_per_second=4,
            redirect_stdout=False, redirect_stderr=False)
        self.tasks: dict[str, TaskID] = {}

    def started(self, tally: RunTally) -> None:
        if not self.tasks:
            self.progress.start()
        self.tasks[tally.run_id] = self.progress.add_task(escape(tally.label), total=None, **self._fields(tally))

    def update(self, tally: RunTally, finished: bool = False) -> None:
        done, total, _ = tally.amount()
        total = done if finished and total is None else total  # an ended run's bar is full
        self.progress.update(self.tasks[tally.run_id], completed=done, total=total, **self._fields(tally))

    def finished(self, tally: RunTally) -> None:
        self.update(tally, finished=True)
        self.progress.stop_task(self.tasks[tally.run_id])

    def close(self) -> None:
        if self.tasks:
            self.progress.stop()

    @staticmethod
    def _fields(tally: RunTally) -> dict[str, str]:
        done, total, unit = tally.amount()
        counts = (" ".join(f"[{_COLOURS[outcome]}]{n} {outcome}[/]" for outcome, n in tally.count().items())
                  if tally.by_rows else escape(next(iter(tally.outcomes.values()), "")))
        running = tally.running()
        eta = tally.eta()
        status = {"SUCCESS": "[green]SUCCESS[/]", "FAILURE": "[red]FAILURE[/]"}.get(tally.status, tally.status or "")
        return {"amount": f"{done}/{total if total is not None else '?'} {unit}", "counts": counts,
                "running": escape(f"running: {', '.join(running)}") if running else "",
                "clock": clock(tally.elapsed()) + (f" ETA {clock(eta)}" if eta is not None else "")
                + (f" {status}" if status else "")}


class Reporter:
    """One command's progress: every run it watches, shown as ``mode`` says, then summed up."""

    def __init__(self, mode: Mode, stream: IO[str]) -> None:
        self.mode = mode
        self.tallies: list[RunTally] = []
        self._stream = stream
        if mode in (Mode.LIVE, Mode.LINES):  # a duplicate descriptor: during a run Dagster points stdout and stderr
            with suppress(AttributeError, OSError, ValueError):  # at its logs (else no file behind it: a test's buffer)
                self._stream = open(os.dup(stream.fileno()), "w", buffering=1, errors="replace",
                                    encoding=getattr(stream, "encoding", None) or "utf-8")
        self._owned = self._stream is not stream
        self._view = (_Live(self._stream) if mode == Mode.LIVE else _Lines(self._stream) if mode == Mode.LINES
                      else _View())

    @contextmanager
    def watch(self, instance: dg.DagsterInstance, label: str, rows: int) -> Iterator[str]:
        """A new run id for the run about to execute, whose progress (and each retry's) a thread follows."""
        tally = self._start(label, rows, str(uuid.uuid4()))
        stop = threading.Event()
        follower = threading.Thread(target=self._follow, args=(instance, tally, stop), name="agentenv progress",
                                    daemon=True)
        follower.start()
        try:
            yield tally.run_id
        finally:
            stop.set()
            follower.join()
            with suppress(Exception):  # the display never fails the command
                self._catch_up(instance, self.tallies[-1])  # what the run recorded last
            self._view.finished(self.tallies[-1])

    def _start(self, label: str, rows: int, run_id: str) -> RunTally:
        tally = RunTally(run_id, label, rows)
        self.tallies.append(tally)
        self._view.started(tally)
        return tally

    def _follow(self, instance: dg.DagsterInstance, tally: RunTally, stop: threading.Event) -> None:
        while not stop.wait(POLL_SECONDS):
            try:
                tally = self._catch_up(instance, tally)
            except Exception:  # noqa: BLE001, S112 - a read that failed is tried again at the next poll
                continue
            self._view.update(tally)

    def _catch_up(self, instance: dg.DagsterInstance, tally: RunTally) -> RunTally:
        """Read what the run recorded; once it failed and a retry re-executes it, follow the retry's run."""
        read_new_events(instance, tally)
        while tally.status == "FAILURE" and (child := instance.get_run_by_id(tally.run_id).tags.get(TAG_RETRIED_BY)):
            self._view.finished(tally)
            tally = self._start(f"{tally.label} (retry)", tally.rows, child)
            read_new_events(instance, tally)
        return tally

    def close(self) -> None:
        self._view.close()
        if self._owned:
            self._stream.close()

    def summary_lines(self) -> list[str]:
        """Each run's status and counts with its page in the Dagster UI, then the assets the runs materialized."""
        if not self.tallies:
            return []
        assets = sorted({key for tally in self.tallies for key in tally.assets})  # the same order every run
        return [f"  dagster UI: {ui_url()}  (that of `dagster dev -w workspace.yaml`; {UI_URL_ENV} names another)",
                *(line for tally in self.tallies for line in tally.summary()),
                *(f"    {'assets:' if i == 0 else '':8}{asset_url(key)}" for i, key in enumerate(assets))]


_REPORTER: ContextVar[Reporter | None] = ContextVar("agentenv_progress", default=None)


@contextmanager
def reporting(mode: Mode, stream: IO[str]) -> Iterator[Reporter]:
    """Show the progress of the runs this command executes on ``stream`` (``execute_plan`` watches each)."""
    reporter = Reporter(mode, stream)
    token = _REPORTER.set(reporter)
    try:
        yield reporter
    finally:
        _REPORTER.reset(token)
        reporter.close()


def console_config(job_def: dg.JobDefinition | None = None) -> Mapping[str, Any]:
    """Run config quietening Dagster's console logger while the command reports progress (not ``--verbose``),
    unless the job has loggers of its own and no console; else nothing (Dagster's default). Its event lines
    stay in the event log (the UI shows them), off the terminal."""
    reporter = _REPORTER.get()
    if reporter is None or reporter.mode == Mode.VERBOSE or (
            job_def is not None and job_def.loggers and "console" not in job_def.loggers):
        return {}
    return {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


def watching(instance: dg.DagsterInstance, label: str, rows: int) -> AbstractContextManager[str]:
    """The id to give the run about to execute, its progress shown when the command reports progress."""
    reporter = _REPORTER.get()
    return reporter.watch(instance, label, rows) if reporter is not None else nullcontext(str(uuid.uuid4()))


def noted(instance: dg.DagsterInstance, run_id: str, label: str) -> None:
    """A run executed without a watch, listed in the summary when the command reports progress."""
    reporter = _REPORTER.get()
    if reporter is not None:
        tally = RunTally(run_id, label, rows=1)
        read_new_events(instance, tally)
        reporter.tallies.append(tally)
