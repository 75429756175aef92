"""Human review decisions of a run, as files in the run folder: the ``review`` step, the
``agentenv-dagster review RUN_ID approve|reject`` CLI and a sensor are different processes.

Under ``<run_dir>/reviews/``: ``awaiting/<step>__<instance>.json`` while a step waits;
``decisions/<step>.json`` for every row of the step, or ``decisions/<step>__<instance>.json``
for one row (it wins). A decision may be written before the step asks (a pre-approval).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CONTINUE, ABORT = "continue", "abort"  # upstream's review-store states
VERBS = {"approve": CONTINUE, "approved": CONTINUE, "continue": CONTINUE,
         "reject": ABORT, "rejected": ABORT, "abort": ABORT}


class ReviewError(ValueError):
    """A decision that cannot be given (no such run, no review awaiting, ambiguous)."""


def _part(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")  # whole or not at all: the step reads concurrently
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunReviews:
    """The review decisions of one run, as files: where a ``review`` step registers and finds them."""

    folder: Path

    @classmethod
    def of_run(cls, run_dir: Path) -> "RunReviews":
        return cls(run_dir / "reviews")

    def put_awaiting(self, step_id: str, instance_id: str, record: dict[str, Any]) -> None:
        _write(self._path("awaiting", step_id, instance_id), {"step_id": step_id, "instance_id": instance_id, **record})

    def clear_awaiting(self, step_id: str, instance_id: str) -> None:
        self._path("awaiting", step_id, instance_id).unlink(missing_ok=True)

    def get(self, step_id: str, instance_id: str) -> dict[str, Any] | None:
        for path in (self._path("decisions", step_id, instance_id), self._path("decisions", step_id)):
            record = _read(path)
            if record and record.get("decision") in (CONTINUE, ABORT):
                return record
        return None

    def awaiting(self) -> list[dict[str, Any]]:
        """The reviews waiting for a decision now, oldest first."""
        records = [_read(p) for p in (self.folder / "awaiting").glob("*.json")]
        return sorted((r for r in records if r), key=lambda r: r.get("requested_at_utc") or "")

    def decide(self, decision: str, *, step_id: str | None = None, instance_id: str | None = None,
               note: str | None = None, decided_by: str | None = None, source: str = "cli") -> dict[str, Any]:
        """Record and return ``approve``/``reject`` (or ``continue``/``abort``) for ``step_id``
        (every row, or row ``instance_id``), by default for the one review awaiting now."""
        state = VERBS.get(decision.lower())
        if state is None:
            raise ReviewError(f"decision must be approve or reject, not {decision!r}")
        if step_id is None:
            steps = sorted({r["step_id"] for r in self.awaiting() if instance_id in (None, r.get("instance_id"))})
            if not steps:
                raise ReviewError("no review is awaiting a decision in this run (name one with --step)")
            if len(steps) > 1:
                raise ReviewError(f"{len(steps)} reviews are awaiting a decision; choose one with --step: {steps}")
            step_id = steps[0]
        record = {"decision": state, "step_id": step_id, "instance_id": instance_id, "note": note,
                  "decided_by": decided_by, "decided_at_utc": now_utc(), "source": source}
        _write(self._path("decisions", step_id, instance_id), record)
        return record

    def _path(self, kind: str, step_id: str, instance_id: str | None = None) -> Path:
        name = _part(step_id) + (f"__{_part(instance_id)}" if instance_id else "")
        return self.folder / kind / f"{name}.json"


ReviewDecisions = RunReviews  # the name the review step knows them by


def find_run_dir(runs_dir: Path, run_id: str) -> Path:
    """The folder of run ``run_id``, or of the one run whose id starts with it (the Dagster UI shows 8 characters)."""
    if run_id and (runs_dir / run_id).is_dir():
        return runs_dir / run_id
    matches = sorted(p for p in runs_dir.glob(f"{_part(run_id)}*") if p.is_dir()) if run_id else []
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ReviewError(f"no run '{run_id}' under {runs_dir}")
    raise ReviewError(f"run id '{run_id}' is ambiguous: {[p.name for p in matches]}")
