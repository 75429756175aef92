"""One Dagster run's progress as its event log tells it (rows done by ``outcome``, steps, assets, how it
ended), and the run's and assets' pages in the Dagster UI: what ``progress.py`` shows and sums up."""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import quote

import dagster as dg

from ..redaction import redact_text
from .io_manager import FINAL_STEP

UI_URL_ENV = "AGENTENV_UI_URL"


def ui_url() -> str:
    """Where the project's Dagster UI is: ``AGENTENV_UI_URL``, else ``dagster dev``'s default address."""
    return (os.environ.get(UI_URL_ENV) or "http://127.0.0.1:3000").rstrip("/")


def asset_url(key: str) -> str:
    """An asset's page in the UI, from its key as ``a/b/c``."""
    return f"{ui_url()}/assets/{'/'.join(quote(part, safe='') for part in key.split('/'))}"


FAILURE_CHARS = 300  # of a failure's message in the summary
OUTCOMES = ("passed", "failed", "errored", "not graded")  # a row's, as its results materialization says
_RUN_ENDS = {dg.DagsterEventType.RUN_SUCCESS: "SUCCESS", dg.DagsterEventType.RUN_FAILURE: "FAILURE",
             dg.DagsterEventType.RUN_CANCELED: "CANCELED"}
STEP_ENDS = {dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.STEP_SKIPPED}
WATCHED = {*_RUN_ENDS, *STEP_ENDS, dg.DagsterEventType.STEP_START, dg.DagsterEventType.ASSET_MATERIALIZATION}


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
        elif kind in STEP_ENDS and step:
            self.steps[step] = True
            if kind == dg.DagsterEventType.STEP_FAILURE and self.failure is None:
                self.failure = f"step {step}: {_failure_message(entry)}"
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = entry.asset_materialization
            self.assets.setdefault(materialization.asset_key.to_user_string())
            outcome = getattr(materialization.metadata.get("outcome"), "value", None)
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
        counted = Counter(self.outcomes.values())
        return {outcome: counted[outcome] for outcome in OUTCOMES if counted[outcome] or outcome != "not graded"}

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
        parts.append(f"elapsed {clock(self.elapsed())}" + (f", ETA {clock(eta)}" if eta is not None else ""))
        if self.status:
            parts.append(self.status)
        return "; ".join(parts)

    def summary(self) -> list[str]:
        """The run in the final summary: status, counts, its page in the UI, its first failure."""
        undone = self.rows - len(self.outcomes)
        counts = (f", {self.rows} rows: {self.counts()}" + (f", {undone} not done" if undone else "")
                  if self.by_rows else "")
        failed = [f"      failed: {self.failure}"] if self.failure and self.status != "SUCCESS" else []
        return [f"    {self.label}: {self.status or 'NOT FINISHED'}{counts}",
                f"      run:    {ui_url()}/runs/{self.run_id}", *failed]


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


def clock(seconds: float) -> str:
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
        page = instance.get_records_for_run(tally.run_id, cursor=tally.cursor, of_type=WATCHED)
        for record in page.records:
            tally.take(record.event_log_entry)
        tally.cursor = page.cursor
        if not page.has_more:
            return
