"""Reap what killed runs left behind, and prune old run folders.

A run killed hard (``kill -9`` of the CLI, a lost run worker) never closes its ledger: its containers may
still run and its Dagster run stays ``STARTED``. :func:`reap_dead_runs`, run when the CLI starts and when
the code location loads, ends what such runs of this machine left, marks them failed, and removes run
folders older than ``[stores] keep_runs_days``.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import dagster as dg

from ..config import AgentEnvConfig
from ..runtime.local import Ledger

log = logging.getLogger("agentenv_dagster")
DAY_SECONDS = 86400


def reap_dead_runs(instance: dg.DagsterInstance, config: AgentEnvConfig) -> list[str]:
    """End what runs whose owner process is gone left running, fail them, prune old run folders; the ids reaped."""
    runs_dir = config.state_dir / "runs"
    reaped = []
    for run_dir in sorted(runs_dir.iterdir()) if runs_dir.is_dir() else ():
        ledger = Ledger.of_run(run_dir)
        owner = ledger.owner()
        if ledger.closed or owner is None or not owner.here or owner.alive():
            continue
        ended = ledger.close()
        reason = (f"agentenv: the process that ran this run (pid {owner.pid}) ended before the run did "
                  f"(killed?); ended what it left running: {', '.join(ended) or 'nothing'}")
        run = instance.get_run_by_id(run_dir.name)
        if run is not None and not run.is_finished:
            instance.report_run_failed(run, message=reason)
        log.warning("run %s: %s", run_dir.name, reason)
        reaped.append(run_dir.name)
    prune_old_runs(runs_dir, config.stores.keep_runs_days)
    return reaped


def prune_old_runs(runs_dir: Path, keep_days: float) -> list[str]:
    """Remove the folders of runs over and untouched for ``keep_days`` (0 keeps them all); the ids removed."""
    if keep_days <= 0 or not runs_dir.is_dir():
        return []
    cutoff = time.time() - keep_days * DAY_SECONDS
    removed = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        ledger = Ledger.of_run(run_dir)
        owner = ledger.owner()
        over = ledger.closed or owner is None or (owner.here and not owner.alive())
        if over and _last_touched(run_dir) < cutoff:
            shutil.rmtree(run_dir, ignore_errors=True)
            removed.append(run_dir.name)
    return removed


def _last_touched(run_dir: Path) -> float:
    """When the run last wrote its folder or one of its direct subfolders (contexts, ledger)."""
    return max(folder.stat().st_mtime for folder in [run_dir, *(p for p in run_dir.iterdir() if p.is_dir())])
