"""The context IO managers: each op's row stream (``streams.py``), persisted per run as redacted JSON.

Nothing travels in process memory, so the multiprocess executor works, and with the S3 flavour
(``s3_io_manager.py``) any remote executor (Celery, Kubernetes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import dagster as dg

from ..config import AgentEnvConfig
from ..context import TaskStepContext, redacted_json
from ..runtime.s3 import s3_location
from .streams import StreamRef

FINAL_STEP = "teardown_run"  # the op whose stream holds each row's final context
FAILED_ATTEMPT = ".failed"  # ``<step key>.failed``: the row of an op's attempt that Dagster retries


class ContextIOManagerBase(dg.ConfigurableIOManager):
    """Each op's row stream, keyed by run id and step key. Subclasses say where the records live:
    ``start_stream(run_id, name)`` empties one, ``append_records(run_id, name, records)`` adds to it,
    ``read_records(run_id, name, position=None)`` returns the records since ``position`` (None: from the
    start), the position after them and whether the stream has ended; ``stream_names(run_id)``, oldest first."""

    reads_remotely: ClassVar[bool] = False  # whether a read waits on the network (then it runs off the event loop)

    @staticmethod
    def encoded(records: list[dict[str, Any]]) -> bytes:
        """Records as JSON lines, secrets stripped: nothing unredacted is stored."""
        return b"".join(redacted_json(record) + b"\n" for record in records)

    @staticmethod
    def decoded(data: bytes) -> tuple[list[dict[str, Any]], bool]:
        """The row records of JSON lines, and whether they end with the stream's end."""
        found = [json.loads(line) for line in data.splitlines() if line]
        return [r for r in found if "row" in r], bool(found) and found[-1].get("end") is True

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        if not isinstance(obj, StreamRef):
            raise dg.Failure(f"the agentenv IO manager stores row streams, not {type(obj).__name__}")
        context.add_output_metadata({"stream": obj.name})

    def load_input(self, context: dg.InputContext) -> StreamRef:
        return StreamRef(*context.upstream_output.get_identifier()[:2])  # its run id and step key

    def rows(self, run_id: str, name: str) -> dict[str, dict[str, Any]]:
        """A stream's rows as written so far: each row's last record, in the order the rows arrived."""
        return {record["row"]: record for record in self.read_records(run_id, name)[0]}

    def stopped_rows(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's rows that stopped at a fatal failure: each one's record of the step it
        stopped at, with the failure and what the row had then."""
        stopped: dict[str, dict[str, Any]] = {}
        for stream in self.stream_names(run_id):
            for key, record in self.rows(run_id, stream).items():
                if "stopped" in record and record["stopped"].get("step_key", stream) == stream:
                    stopped.setdefault(key, record)
        return stopped

    def step_stream(self, run_id: str, node: str) -> str | None:
        """The stream of step ``node`` of the run (its step key: the node's name, under its graph's)."""
        return next((name for name in self.stream_names(run_id) if name == node or name.endswith(f".{node}")), None)

    def final_contexts(self, run_id: str) -> dict[str, TaskStepContext]:
        """Each row's final context: the teardown op's record of it; for a run that ended before
        its teardown op did, each row's last record of every stream, merged."""
        final = self.step_stream(run_id, FINAL_STEP)
        records, _, ended = self.read_records(run_id, final) if final else ([], None, False)
        if ended:
            return {record["row"]: TaskStepContext.from_dict(record["context"]) for record in records}
        by_row: dict[str, list[dict[str, Any]]] = {}
        for name in self.stream_names(run_id):
            for key, record in self.rows(run_id, name).items():
                by_row.setdefault(key, []).append(record["context"])
        return {key: TaskStepContext.merge_dicts(contexts) for key, contexts in by_row.items()}


class TaskContextIOManager(ContextIOManagerBase):
    """Stores ``<base_dir>/<run_id>/context/<step_key>.jsonl``, a record a line."""

    base_dir: str

    def _folder(self, run_id: str) -> Path:
        return Path(self.base_dir) / run_id / "context"

    def _path(self, run_id: str, name: str) -> Path:
        return self._folder(run_id) / f"{name}.jsonl"

    def start_stream(self, run_id: str, name: str) -> None:
        path = self._path(run_id, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")

    def append_records(self, run_id: str, name: str, records: list[dict[str, Any]]) -> None:
        # one writer a stream, and one write a batch: a reader sees whole lines or none of a batch
        with open(self._path(run_id, name), "ab", buffering=0) as stream:  # (an unbuffered write is one write call)
            stream.write(self.encoded(records))

    def read_records(self, run_id: str, name: str, position: Any = None) -> tuple[list[dict[str, Any]], Any, bool]:
        offset = position or 0
        try:
            with open(self._path(run_id, name), "rb") as stream:
                stream.seek(offset)
                data = stream.read()
        except FileNotFoundError:
            return [], offset, False
        whole = data[: data.rfind(b"\n") + 1]  # a line still being written is read next time
        rows, ended = self.decoded(whole)
        return rows, offset + len(whole), ended

    def stream_names(self, run_id: str) -> list[str]:
        files = sorted(self._folder(run_id).glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
        return [p.stem for p in files if not p.stem.endswith(FAILED_ATTEMPT)]


def context_io_manager(config: AgentEnvConfig) -> ContextIOManagerBase:
    """The project's IO manager: the state folder, or its bucket (``[stores] backend = "s3"``)."""
    if config.stores.backend == "s3":
        from .s3_io_manager import S3ContextIOManager  # (it imports this module)

        return S3ContextIOManager(**dataclasses.asdict(s3_location(config)))
    return TaskContextIOManager(base_dir=str(config.state_dir / "runs"))


def final_contexts(base_dir: str | Path, run_id: str) -> dict[str, TaskStepContext]:
    """A run's final contexts in the state folder ``base_dir`` (:meth:`ContextIOManagerBase.final_contexts`)."""
    return TaskContextIOManager(base_dir=str(base_dir)).final_contexts(run_id)


def final_context(base_dir: str | Path, run_id: str) -> TaskStepContext:
    """The final context of a one-row run (the task, or one partition)."""
    contexts = final_contexts(base_dir, run_id)
    return next(iter(contexts.values())) if len(contexts) == 1 else TaskStepContext()
