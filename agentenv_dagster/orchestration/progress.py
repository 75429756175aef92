"""What a person sees while ``agentenv-dagster run`` works, and the addresses it leaves.

On a terminal, a live display with a line per run (per variant and replicate): rows done of
the rows the run carries (a task without a dataset: steps done), passed / failed / errored,
the steps running, elapsed time and ETA. Elsewhere (CI logs), a compact line when a run
starts, at every tenth of it, every ``LINE_EVERY_SECONDS`` and when it ends. ``--quiet``
shows none of it; ``--verbose`` shows Dagster's own event lines instead. At the end, each
run's status and counts, its page in the Dagster UI and the assets it materialized.

All of it is read back from what the run records in the Dagster instance: a thread polls the
run's event log while the run executes (each row's ``results`` materialization and its
``outcome``, steps starting and ending, assets materialized, the run's end). The display so
says no more than the UI would, and shows only counts, run ids, step ids and asset keys. The
modes change only Dagster's console logger; the events always go into the instance.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO, Any, Iterator, Mapping
from urllib.parse import quote

import dagster as dg
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn

from ..redaction import redact_text
from .io_manager import FINAL_STEP
from .retries import TAG_RETRIED_BY
from .rows import REPLICATE_TAG, VARIANT_TAG


class Mode(StrEnum):
    LIVE = "live"  # a terminal: the live display
    LINES = "lines"  # not a terminal: a line now and then
    QUIET = "quiet"  # the summary only
    VERBOSE = "verbose"  # Dagster's event lines, as Dagster prints them


def choose_mode(*, quiet: bool, verbose: bool, stream: IO[str]) -> Mode:
    if verbose:
        return Mode.VERBOSE
    if quiet:
        return Mode.QUIET
    return Mode.LIVE if stream.isatty() else Mode.LINES


UI_URL_ENV = "AGENTENV_UI_URL"
DEFAULT_UI_URL = "http://127.0.0.1:3000"  # `dagster dev`'s own host and port


def ui_url() -> str:
    """Where the Dagster UI of the project's instance is: ``AGENTENV_UI_URL``, else the address
    ``dagster dev -w workspace.yaml`` serves by default (this process cannot know another)."""
    return (os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")


def run_url(run_id: str) -> str:
    return f"{ui_url()}/runs/{run_id}"


def asset_url(key: str) -> str:
    """An asset's page in the UI, from its key as ``a/b/c``."""
    return f"{ui_url()}/assets/{'/'.join(quote(part, safe='') for part in key.split('/'))}"


POLL_SECONDS = 0.5
LINE_EVERY_SECONDS = 30.0  # not a terminal: at least this often while a run goes on
FAILURE_CHARS = 300  # of a failure's message in the summary
# Dagster's console logger on the console's default config, quietened: its event lines stay
# in the event log (the UI shows them) and out of the terminal
QUIET_CONSOLE: Mapping[str, Any] = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
_WATCHED = {
    dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SKIPPED, dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.RUN_SUCCESS,
    dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_CANCELED,
}
_RUN_ENDS = {dg.DagsterEventType.RUN_SUCCESS: "SUCCESS", dg.DagsterEventType.RUN_FAILURE: "FAILURE",
             dg.DagsterEventType.RUN_CANCELED: "CANCELED"}
_STEP_ENDS = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_SKIPPED}
OUTCOMES = ("passed", "failed", "errored", "not graded")  # a row's, as its results materialization says
_COLOURS = {"passed": "green", "failed": "red", "errored": "yellow", "not graded": "blue"}


def run_label(job_name: str, tags: Mapping[str, str]) -> str:
    """A run's name on the display: its job, and the variant and replicate when they tell runs apart."""
    variant = tags.get(VARIANT_TAG)
    replicate = tags.get(REPLICATE_TAG)
    return job_name + (f" [{variant}]" if variant and variant != "default" else "") + (
        f" #{replicate}" if replicate and replicate != "0" else "")


@dataclass
class RunTally:
    """One run's progress, as its event log tells it."""

    run_id: str
    label: str
    rows: int  # the rows the run carries
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None
    outcomes: dict[str, str] = field(default_factory=dict)  # by row (partition key; "" unpartitioned)
    steps: dict[str, bool] = field(default_factory=dict)  # step id -> ended
    steps_planned: int | None = None
    assets: dict[str, None] = field(default_factory=dict)  # keys as a/b/c, in the order first materialized
    status: str | None = None  # SUCCESS, FAILURE or CANCELED once the run ended
    failure: str | None = None  # the first failure: where and what
    cursor: str | None = None

    def take(self, entry: dg.EventLogEntry) -> None:
        kind = entry.dagster_event_type
        step = entry.step_key.rsplit(".", 1)[-1] if entry.step_key else None
        if kind == dg.DagsterEventType.STEP_START and step:
            self.steps[step] = False
        elif kind in _STEP_ENDS and step:
            self.steps[step] = True
            if kind == dg.DagsterEventType.STEP_FAILURE and self.failure is None:
                self.failure = f"step {step}: {_failure_message(entry)}"
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = entry.asset_materialization
            self.assets.setdefault(materialization.asset_key.to_user_string())
            outcome = _value(materialization.metadata.get("outcome"))
            if step == FINAL_STEP and outcome in OUTCOMES:
                self.outcomes[materialization.partition or ""] = outcome
        elif kind in _RUN_ENDS:
            self.status = _RUN_ENDS[kind]
            self.ended = time.monotonic()
            if self.status != "SUCCESS" and self.failure is None:
                self.failure = _first_line(entry.message or "")

    @property
    def by_rows(self) -> bool:
        """Whether progress counts rows (a dataset's run), else steps (one row)."""
        return self.rows > 1

    def amount(self) -> tuple[int, int | None, str]:
        """Done, out of, and of what."""
        if self.by_rows:
            return len(self.outcomes), self.rows, "rows"
        return sum(self.steps.values()), self.steps_planned, "steps"

    def count(self) -> dict[str, int]:
        """Rows done by outcome; "not graded" only when some are."""
        counted = {outcome: 0 for outcome in OUTCOMES}
        for outcome in self.outcomes.values():
            counted[outcome] += 1
        return {outcome: n for outcome, n in counted.items() if n or outcome != "not graded"}

    def counts(self) -> str:
        return ", ".join(f"{n} {outcome}" for outcome, n in self.count().items())

    def running(self) -> list[str]:
        return [step for step, ended in self.steps.items() if not ended] if self.status is None else []

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started

    def eta(self) -> float | None:
        """Seconds left at the pace so far, once a row is done (rows only: steps differ too much)."""
        done = len(self.outcomes)
        if not self.by_rows or self.status is not None or not done or done >= self.rows:
            return None
        return self.elapsed() / done * (self.rows - done)

    def line(self) -> str:
        """The run's progress as one line of text."""
        done, total, unit = self.amount()
        parts = [f"{self.label}: {done}/{total} {unit}" + (f" ({math.floor(100 * done / total)}%)" if total else "")
                 if total is not None else f"{self.label}: {done} {unit} done"]
        if self.by_rows:
            parts.append(self.counts())
        elif self.outcomes:
            parts.append(next(iter(self.outcomes.values())))
        if running := self.running():
            parts.append(f"running: {', '.join(running)}")
        eta = self.eta()
        parts.append(f"elapsed {_clock(self.elapsed())}" + (f", ETA {_clock(eta)}" if eta is not None else ""))
        if self.status:
            parts.append(self.status)
        return "; ".join(parts)

    def summary(self) -> list[str]:
        """The run in the final summary: status, counts, its page in the UI, its first failure."""
        undone = self.rows - len(self.outcomes)
        counts = f", {self.rows} rows: {self.counts()}" + (f", {undone} not done" if undone else "") if self.by_rows else ""
        lines = [f"    {self.label}: {self.status or 'NOT FINISHED'}{counts}", f"      run:    {run_url(self.run_id)}"]
        if self.failure and self.status != "SUCCESS":
            lines.append(f"      failed: {self.failure}")
        return lines


def _failure_message(entry: dg.EventLogEntry) -> str:
    """A step failure's description, else its error's message without the error's class."""
    data = entry.dagster_event.step_failure_data if entry.dagster_event else None
    described = data.user_failure_data.description if data and data.user_failure_data else None
    if described or not (data and data.error):
        return _first_line(described or entry.message or "")
    error = data.error
    return _first_line(error.message.split(f"{error.cls_name}: ", 1)[-1] if error.cls_name else error.message)


def _first_line(text: str) -> str:
    """A message's first line, short, with every known secret masked."""
    line = redact_text(text.strip().splitlines()[0] if text.strip() else "")
    return line if len(line) <= FAILURE_CHARS else line[:FAILURE_CHARS - 1] + "…"


def _value(metadata_value: Any) -> Any:
    return getattr(metadata_value, "value", metadata_value)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def read_new_events(instance: dg.DagsterInstance, tally: RunTally) -> None:
    """Take into ``tally`` what its run recorded since the last read."""
    if tally.steps_planned is None:
        run = instance.get_run_by_id(tally.run_id)
        if run is None:
            return  # not created yet
        if run.execution_plan_snapshot_id:
            tally.steps_planned = len(instance.get_execution_plan_snapshot(
                run.execution_plan_snapshot_id).step_keys_to_execute)
    while True:
        page = instance.get_records_for_run(tally.run_id, cursor=tally.cursor, of_type=_WATCHED)
        for record in page.records:
            tally.take(record.event_log_entry)
        tally.cursor = page.cursor
        if not page.has_more:
            return


class _View:
    """Where a run's progress shows: nowhere (quiet, verbose)."""

    def started(self, tally: RunTally) -> None: ...

    def update(self, tally: RunTally) -> None: ...

    def finished(self, tally: RunTally) -> None: ...


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
        line = tally.line()
        if line != self.shown[tally.run_id][2]:
            self._print(tally, 10, line)

    def _print(self, tally: RunTally, tenth: int, line: str) -> None:
        self.shown[tally.run_id] = (tenth, time.monotonic(), line)
        print(line, file=self.stream, flush=True)


class _Live(_View):
    """A terminal: a ``rich`` progress display, a line per run, left on screen when it ends.
    It leaves the process's stdout and stderr alone (no redirection): what the run prints goes
    where Dagster's log capture sends it."""

    def __init__(self, stream: IO[str]) -> None:
        self.progress = Progress(
            SpinnerColumn(finished_text=" "), TextColumn("{task.description}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[amount]}"), TextColumn("{task.fields[counts]}"),
            TextColumn("{task.fields[running]}", style="dim"), TextColumn("{task.fields[clock]}"),
            console=Console(file=stream, force_terminal=True, width=_width(stream)), refresh_per_second=4,
            redirect_stdout=False, redirect_stderr=False,
        )
        self.tasks: dict[str, TaskID] = {}

    def started(self, tally: RunTally) -> None:
        if not self.tasks:
            self.progress.start()
        self.tasks[tally.run_id] = self.progress.add_task(escape(tally.label), total=None, **self._fields(tally))

    def update(self, tally: RunTally) -> None:
        done, total, _ = tally.amount()
        self.progress.update(self.tasks[tally.run_id], completed=done, total=total, **self._fields(tally))

    def finished(self, tally: RunTally) -> None:
        done, total, _ = tally.amount()
        self.progress.update(self.tasks[tally.run_id], completed=done, total=total if total is not None else done,
                             **self._fields(tally))
        self.progress.stop_task(self.tasks[tally.run_id])

    def close(self) -> None:
        if self.tasks:
            self.progress.stop()

    @staticmethod
    def _fields(tally: RunTally) -> dict[str, str]:
        done, total, unit = tally.amount()
        if tally.by_rows:
            counts = " ".join(f"[{_COLOURS[outcome]}]{n} {outcome}[/]" for outcome, n in tally.count().items())
        else:
            counts = escape(next(iter(tally.outcomes.values()), ""))
        running = tally.running()
        eta = tally.eta()
        status = {"SUCCESS": "[green]SUCCESS[/]", "FAILURE": "[red]FAILURE[/]"}.get(tally.status or "", tally.status or "")
        return {
            "amount": f"{done}/{total if total is not None else '?'} {unit}",
            "counts": counts,
            "running": escape(f"running: {', '.join(running)}") if running else "",
            "clock": _clock(tally.elapsed()) + (f" ETA {_clock(eta)}" if eta is not None else "") + (
                f" {status}" if status else ""),
        }


def _width(stream: IO[str]) -> int | None:
    """The terminal's width, read once: while a run's logs are captured, rich cannot find its
    terminal among the standard streams. None (rich's own guess) when it has none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or None
    except (AttributeError, OSError, ValueError):
        return None


def _own_handle(stream: IO[str]) -> IO[str]:
    """A handle of the display's own on ``stream``'s file (a duplicate descriptor): while a run
    executes, Dagster points the process's stdout and stderr at the run's captured logs (the
    UI's stdout/stderr of the run), and the progress belongs on the terminal, not in them."""
    try:
        descriptor = os.dup(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's buffer)
        return stream
    return open(descriptor, "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8",
                errors="replace")


class Reporter:
    """One command's progress: every run it watches, shown as ``mode`` says, then summed up."""

    def __init__(self, mode: Mode, stream: IO[str]) -> None:
        self.mode = mode
        self.tallies: list[RunTally] = []
        self._stream = _own_handle(stream) if mode in (Mode.LIVE, Mode.LINES) else stream
        self._owned = self._stream is not stream
        self._view = (_Live(self._stream) if mode == Mode.LIVE else _Lines(self._stream) if mode == Mode.LINES
                      else _View())

    def console_config(self) -> Mapping[str, Any]:
        """The run config of Dagster's console logger: quiet unless ``--verbose``."""
        return {} if self.mode == Mode.VERBOSE else QUIET_CONSOLE

    @contextmanager
    def watch(self, instance: dg.DagsterInstance, label: str, rows: int) -> Iterator[str]:
        """A new run id for the run about to execute; while it (and each retry of it) runs,
        its progress, read from its event log by a thread of its own."""
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
            try:
                self._catch_up(instance, self.tallies[-1])  # what the run recorded last
            except Exception:  # noqa: BLE001 - the display never fails the command
                pass
            self._view.finished(self.tallies[-1])

    def note(self, instance: dg.DagsterInstance, run_id: str, label: str) -> None:
        """A run that executed without a watch (a suite's materialization), for the summary."""
        tally = RunTally(run_id, label, rows=1)
        read_new_events(instance, tally)
        self.tallies.append(tally)

    def _start(self, label: str, rows: int, run_id: str) -> RunTally:
        tally = RunTally(run_id, label, rows)
        self.tallies.append(tally)
        self._view.started(tally)
        return tally

    def _follow(self, instance: dg.DagsterInstance, tally: RunTally, stop: threading.Event) -> None:
        while not stop.wait(POLL_SECONDS):
            try:
                tally = self._catch_up(instance, tally)
            except Exception:  # noqa: BLE001 - a read that failed is tried again at the next poll
                continue
            self._view.update(tally)

    def _catch_up(self, instance: dg.DagsterInstance, tally: RunTally) -> RunTally:
        """Read what the run recorded; once it failed and a retry re-executes it, go on with
        the retry's run (the tally now followed)."""
        read_new_events(instance, tally)
        while tally.status == "FAILURE" and (child := instance.get_run_by_id(tally.run_id).tags.get(TAG_RETRIED_BY)):
            self._view.finished(tally)
            tally = self._start(f"{tally.label} (retry)", tally.rows, child)
            read_new_events(instance, tally)
        return tally

    def close(self) -> None:
        if isinstance(self._view, _Live):
            self._view.close()
        if self._owned:
            self._stream.close()

    def summary_lines(self) -> list[str]:
        """Each run's status and counts with its page in the Dagster UI, then the assets the runs
        materialized."""
        if not self.tallies:
            return []
        lines = [f"  dagster UI: {ui_url()}  (that of `dagster dev -w workspace.yaml`; {UI_URL_ENV} names another)"]
        for tally in self.tallies:
            lines += tally.summary()
        assets = list(dict.fromkeys(key for tally in self.tallies for key in tally.assets))
        lines += [f"    {'assets:' if i == 0 else '':8}{asset_url(key)}" for i, key in enumerate(assets)]
        return lines


_REPORTER: ContextVar[Reporter | None] = ContextVar("agentenv_progress", default=None)


@contextmanager
def reporting(mode: Mode, stream: IO[str] | None = None) -> Iterator[Reporter]:
    """Show the progress of the runs this command executes (``execute_plan`` watches each)."""
    reporter = Reporter(mode, stream or sys.stderr)
    token = _REPORTER.set(reporter)
    try:
        yield reporter
    finally:
        _REPORTER.reset(token)
        reporter.close()


def console_config(job_def: dg.JobDefinition | None = None) -> Mapping[str, Any]:
    """What a run's config says of Dagster's console logger: nothing outside a command that
    reports progress (Dagster's default, every event), nor for a job with loggers of its own
    and no console; quiet in such a command, unless ``--verbose``."""
    reporter = _REPORTER.get()
    if reporter is None or (job_def is not None and job_def.loggers and "console" not in job_def.loggers):
        return {}
    return reporter.console_config()


@contextmanager
def watching(instance: dg.DagsterInstance, label: str, rows: int) -> Iterator[str]:
    """The id to give the run about to execute, its progress shown while it does when the
    command reports progress."""
    reporter = _REPORTER.get()
    if reporter is None:
        yield str(uuid.uuid4())
        return
    with reporter.watch(instance, label, rows) as run_id:
        yield run_id


def noted(instance: dg.DagsterInstance, run_id: str, label: str) -> None:
    """A run executed without a watch, listed in the summary when the command reports progress."""
    reporter = _REPORTER.get()
    if reporter is not None:
        reporter.note(instance, run_id, label)
