"""Job snapshot ids remembered from one load of the code location to the next.

The code server's first answer to the webserver lists every job with its snapshot id: a hash
of the job's whole snapshot. So on every load Dagster builds and serializes every job's
snapshot to hash it, before the webserver and the daemon fetch every job's snapshot (Dagster
1.13 fetches them all as it loads a location, ``ExternalJob``, four at a time).

Here a task's job carries its *recipe* (everything ``build_job`` hands Dagster that differs
between tasks) and the location remembers, in the project's state folder, the id each recipe
hashed to last time, under a key that also covers what every job shares: the versions of
Dagster, Python and this package's source, the project's config, the resources, the executor
and the op definitions. A load then hashes the snapshots of changed tasks only. Every task
job's snapshot, hashed or fetched, is built once, from the parts task jobs share
(``snapshot_hash``).

A remembered id is checked whenever its job's snapshot is built (fetched, or a run starts): a
mismatch is logged and the id corrected for the next load.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import dagster as dg
from dagster._config.snap import snap_from_field
from dagster._core.execution.build_resources import wrap_resources_for_execution
from dagster._core.snap import JobSnap
from dagster._core.snap.mode import build_resource_def_snap
from dagster._core.snap.node import build_op_def_snap
from dagster._serdes import create_snapshot_id, serialize_value

from ..config import AgentEnvConfig

log = logging.getLogger("agentenv_dagster")
FORMAT = 1


class TaskJob(dg.JobDefinition):
    """A task's job, whose snapshot id may be known before its snapshot is built, and whose
    snapshot is built from the parts task jobs share."""

    def __init__(self, *, recipe: Callable[[], Mapping[str, Any]], **job_args: Any):
        super().__init__(**job_args)
        self.recipe = recipe  # computed only where ids are remembered: a run worker never asks
        self.remembered: tuple[SnapshotIds, str] | None = None  # set by SnapshotIds.attach
        self._built: tuple[JobSnap, str] | None = None

    def get_job_snapshot_id(self) -> str:
        if self.remembered is None:
            return super().get_job_snapshot_id()
        ids, key = self.remembered
        return ids.known(key) or ids.learn(key, self._snapshot_and_id()[1])

    def get_job_snapshot(self) -> JobSnap:
        if self.remembered is None:
            return super().get_job_snapshot()
        snapshot, snapshot_id = self._snapshot_and_id()
        ids, key = self.remembered
        ids.check(key, snapshot_id, self.name)
        return snapshot

    def _snapshot_and_id(self) -> tuple[JobSnap, str]:
        """Built once, from the shared parts (or Dagster's way): the code server hashes it
        for the job list, then the webserver and the daemon each fetch it as they load the
        location."""
        ids, _ = self.remembered
        with ids.building:  # the webserver and the daemon fetch the same jobs at the same time
            if self._built is None:
                self._built = ids.hasher.snapshot(self) or (super().get_job_snapshot(), super().get_job_snapshot_id())
        return self._built


class SnapshotIds:
    """The remembered ids of one code location (a JSON file of key -> id), saved once every
    job of the load has its id."""

    def __init__(self, path: Path, shared: str):
        self.path = path
        self.shared = shared  # the digest of what every job of the location shares
        self._known = _read(path)
        self._used: dict[str, str] = {}
        self._pending = 0
        from .snapshot_hash import SnapshotHasher  # (Dagster's snapshot internals: not for a run worker's import)

        self.hasher = SnapshotHasher()  # the jobs' snapshots, from the parts they share
        self.building = threading.Lock()  # one job's snapshot at a time: each is built once
        self._lock = threading.Lock()

    @classmethod
    def of_location(
        cls, config: AgentEnvConfig, tasks_dir: Path, translator: object, resources: Mapping[str, Any],
        executor: dg.ExecutorDefinition,
    ) -> "SnapshotIds":
        """A file per task folder and translator: two locations of one folder keep their own."""
        kind = type(translator)
        folder_key = hashlib.sha256(f"{tasks_dir}\n{kind.__module__}.{kind.__qualname__}".encode()).hexdigest()[:12]
        shared = _shared_digest(config, resources, executor)
        return cls(config.state_dir / "snapshot_ids" / f"{folder_key}.json", shared)

    def attach(self, jobs: Iterable[dg.JobDefinition]) -> None:
        """Let each task job answer its snapshot id from memory (or learn it once hashed)."""
        ops: dict[str, str] = {}
        for job in jobs:
            if not isinstance(job, TaskJob):
                continue
            key = self._key(job, ops)
            job.remembered = (self, key)
            if key in self._known:
                self._used[key] = self._known[key]
            else:
                self._pending += 1

    def known(self, key: str) -> str | None:
        return self._used.get(key)

    def learn(self, key: str, snapshot_id: str) -> str:
        with self._lock:
            if key not in self._used:
                self._used[key] = snapshot_id
                self._pending -= 1
                if self._pending == 0:
                    self._save()
        return snapshot_id

    def check(self, key: str, actual: str, job_name: str) -> None:
        with self._lock:
            remembered = self._used.get(key)
            if remembered is None or remembered == actual:
                return
            log.warning("job '%s': remembered snapshot id %s is not its snapshot's (%s); "
                        "corrected for the next load", job_name, remembered, actual)
            self._used[key] = actual
            self._save()

    def _key(self, job: TaskJob, ops: dict[str, str]) -> str:
        for op_def in job.graph.node_defs:
            if op_def.name not in ops:
                ops[op_def.name] = create_snapshot_id(build_op_def_snap(op_def, job))
        recipe = {**job.recipe(), "op_snapshots": sorted(ops[d.name] for d in job.graph.node_defs)}
        canonical = json.dumps(recipe, sort_keys=True, default=repr)
        return hashlib.sha256(f"{self.shared}\n{canonical}".encode()).hexdigest()

    def _save(self) -> None:
        """The ids of this load's jobs (a removed task's id goes with it); whole or not at all."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.path.parent, suffix=".tmp", delete=False) as tmp:
                json.dump({"format": FORMAT, "ids": self._used}, tmp)
            os.replace(tmp.name, self.path)
        except OSError as exc:  # a read-only project still loads, hashing every job each time
            log.warning("snapshot ids not saved to %s: %s", self.path, exc)


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("ids", {}) if isinstance(data, dict) and data.get("format") == FORMAT else {}


def _shared_digest(config: AgentEnvConfig, resources: Mapping[str, Any], executor: dg.ExecutorDefinition) -> str:
    wrapped = wrap_resources_for_execution(resources)
    parts = [
        dg.__version__, sys.version, _package_digest(), config.model_dump_json(), executor.name,
        serialize_value(snap_from_field("config", executor.config_schema.as_field())),
        *(serialize_value(build_resource_def_snap(k, wrapped[k])) for k in sorted(wrapped)),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def _package_digest() -> str:
    """This package's source: any change to how jobs are built forgets every id."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
