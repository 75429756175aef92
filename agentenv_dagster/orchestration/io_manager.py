"""The context IO managers: each op's context, persisted per run as redacted JSON.

Nothing travels in process memory, so the multiprocess executor works, and with the S3
flavour (``s3_io_manager.py``) any remote executor (Celery, Kubernetes); secrets are stripped
before anything is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from ..config import AgentEnvConfig
from ..context import TaskStepContext, redacted_json
from .rows import merge_upstream, rows_of

FINAL_STEP = "teardown_run"  # the op whose output is the run's final context
FAILED_SUFFIX = ".failed"  # ``<op>.failed``: the contexts of the rows the op's step stopped


def is_failure_name(name: str) -> bool:
    return name.endswith(FAILED_SUFFIX)


def context_folder(base_dir: str | Path, run_id: str) -> Path:
    return Path(base_dir) / run_id / "context"


class ContextIOManagerBase(dg.ConfigurableIOManager):
    """One JSON document per op output, keyed by run id and step key; subclasses say where
    the documents live (``write``/``read``/``read_all``)."""

    def write(self, run_id: str, name: str, data: dict[str, Any]) -> str:
        raise NotImplementedError

    def read(self, run_id: str, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def read_all(self, run_id: str, wanted: Callable[[str], bool] | None = None) -> list[tuple[str, dict[str, Any]]]:
        """Every stored ``(name, document)`` of the run whose name is ``wanted``, oldest first."""
        raise NotImplementedError

    def failed_rows(self, run_id: str) -> list[str]:
        """The rows a fatal step failure stopped in the run (each op stores its own; a retry
        that succeeded stored none)."""
        return sorted({key for _, doc in self.read_all(run_id, is_failure_name) for key in rows_of(doc)})

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        run_id, step_key = context.get_identifier()[:2]
        where = self.write(run_id, step_key, obj)
        context.add_output_metadata({"path": dg.MetadataValue.path(where)})

    def load_input(self, context: dg.InputContext) -> Any:
        run_id, step_key = context.upstream_output.get_identifier()[:2]
        return self.read(run_id, step_key)

    def final_contexts(self, run_id: str) -> dict[str, TaskStepContext]:
        """Each row's final context: the teardown op's (every sink merged) and, for the rows
        that stopped at a failure, what they had then; without a teardown output (the run
        stopped early) every stored step context merged."""
        stored = self.read_all(run_id, lambda name: name == FINAL_STEP or is_failure_name(name))
        if not any(name == FINAL_STEP for name, _ in stored):
            stored = self.read_all(run_id)
        return merge_upstream((data for _, data in stored), every=False)


class TaskContextIOManager(ContextIOManagerBase):
    """Stores ``<base_dir>/<run_id>/context/<step_key>.json``."""

    base_dir: str

    def _path(self, run_id: str, name: str) -> Path:
        return context_folder(self.base_dir, run_id) / f"{name}.json"

    def write(self, run_id: str, name: str, data: dict[str, Any]) -> str:
        path = self._path(run_id, name)
        write_context(path, data)
        return str(path)

    def read(self, run_id: str, name: str) -> dict[str, Any]:
        return json.loads(self._path(run_id, name).read_bytes())

    def read_all(self, run_id: str, wanted: Callable[[str], bool] | None = None) -> list[tuple[str, dict[str, Any]]]:
        folder = context_folder(self.base_dir, run_id)
        files = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns) if folder.is_dir() else []
        named = [(p.name[: -len(".json")], p) for p in files]
        return [(name, json.loads(p.read_bytes())) for name, p in named if wanted is None or wanted(name)]


def context_io_manager(config: AgentEnvConfig) -> ContextIOManagerBase:
    """The project's IO manager: the state folder, or its bucket (``[stores] backend = "s3"``,
    what a distributed executor needs)."""
    if config.stores.backend == "s3":
        from ..runtime.s3 import s3_location
        from .s3_io_manager import S3ContextIOManager

        location = s3_location(config)
        return S3ContextIOManager(
            bucket=location.bucket, prefix=location.prefix, endpoint_url=location.endpoint_url,
            region=location.region,
        )
    return TaskContextIOManager(base_dir=str(config.state_dir / "runs"))


def write_context(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(redacted_json(data))
    os.replace(tmp, path)


def final_contexts(base_dir: str | Path, run_id: str) -> dict[str, TaskStepContext]:
    """A run's final contexts in the state folder ``base_dir`` (see
    :meth:`ContextIOManagerBase.final_contexts`)."""
    return TaskContextIOManager(base_dir=str(base_dir)).final_contexts(run_id)


def final_context(base_dir: str | Path, run_id: str) -> TaskStepContext:
    """The final context of a one-row run (the task, or one partition)."""
    contexts = final_contexts(base_dir, run_id)
    return next(iter(contexts.values())) if len(contexts) == 1 else TaskStepContext()
