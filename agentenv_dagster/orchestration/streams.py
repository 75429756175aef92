"""Row streams: how a run's rows flow from op to op without waiting for each other.

Every op outputs a stream (a :class:`StreamRef`) as it starts and appends each row's record as the
row's step ends; the op below reads it as it grows (docs/architecture.md, "Datasets: how rows flow").
The run's IO manager stores the streams, so they outlive the op's process; a writer wakes the
readers in its process at once, others look every ``POLL_SECONDS``.

A record is ``{"row": key, "context": {...}}``, ``{"row": key, "stopped": {...}, "context": {...}}``
(the row stopped at a fatal failure, here or upstream), or the stream's end, ``{"end": true}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator

from ..context import TaskStepContext

if TYPE_CHECKING:
    from .io_manager import ContextIOManagerBase

POLL_SECONDS = 0.5  # how often a reader looks for rows a writer in another process appended


@dataclass(frozen=True)
class StreamRef:
    """An op's output: the stream its rows land in (``run_id`` is the run that wrote it, which a
    re-execution's op reads from its parent)."""

    run_id: str
    name: str


@dataclass
class Row:
    """One row arriving at an op: its merged context, or why it stopped before getting here."""

    key: str
    context: dict[str, Any]
    stopped: dict[str, Any] | None = None


_WAITING_LOCK = threading.Lock()
_WAITING: dict[StreamRef, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}  # the readers in this process
_STEP_THREAD = threading.local()  # set in the threads of an executor that runs a job's ops side by side
_STOPS: set[str] = set()  # runs asked to stop (terminated), by run id


@contextlib.contextmanager
def _woken(stream: StreamRef) -> Iterator[asyncio.Event]:
    """An event set when ``stream`` grows in this process, while the ``with`` lasts."""
    waiter = (asyncio.get_running_loop(), asyncio.Event())
    with _WAITING_LOCK:
        _WAITING.setdefault(stream, set()).add(waiter)
    try:
        yield waiter[1]
    finally:
        with _WAITING_LOCK:
            _WAITING[stream].discard(waiter)  # (there while it holds a waiter)
            if not _WAITING[stream]:
                del _WAITING[stream]


class StreamWriter:
    """Appends an op's row records to its stream, waking the readers in this process."""

    def __init__(self, io: ContextIOManagerBase, run_id: str, name: str) -> None:
        self.io, self.ref = io, StreamRef(run_id, name)
        io.start_stream(run_id, name)  # (an op retried in the same run starts its stream again)

    def append(self, key: str, context: dict[str, Any], stopped: dict[str, Any] | None = None) -> None:
        """A row's record: its context, and why it stopped (a fatal failure, here or upstream) if it did."""
        self._write({"row": key, **({"stopped": stopped} if stopped is not None else {}), "context": context})

    def end(self) -> None:
        self._write({"end": True})

    def _write(self, record: dict[str, Any]) -> None:
        self.io.append_records(self.ref.run_id, self.ref.name, [record])
        with _WAITING_LOCK:
            waiting = list(_WAITING.get(self.ref, ()))
        for loop, event in waiting:  # the readers in this process
            with contextlib.suppress(RuntimeError):  # its loop has closed: its reader is gone
                loop.call_soon_threadsafe(event.set)


async def records(io: ContextIOManagerBase, ref: StreamRef) -> AsyncIterator[dict[str, Any]]:
    """The stream's row records as they are appended, until its end."""
    position: Any = None
    while True:
        with _woken(ref) as woken:  # before reading: an append after the read wakes it
            found, position, ended = await asyncio.to_thread(io.read_records, ref.run_id, ref.name, position) \
                if io.reads_remotely else io.read_records(ref.run_id, ref.name, position)
            for record in found:
                yield record
            if ended:
                return
            if not found:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(woken.wait(), POLL_SECONDS)


async def joined(io: ContextIOManagerBase, sources: list[StreamRef], after: list[StreamRef]) -> AsyncIterator[Row]:
    """Each row once every upstream stream has delivered it: the ``sources``' contexts merged (in
    their order), ``after`` only waited for. A row stopped on any upstream, or that an upstream ended
    without, arrives stopped once the others are done with it (so its context has all they did)."""
    streams = [*sources, *after]
    queue: asyncio.Queue[tuple[int, dict[str, Any] | None]] = asyncio.Queue()

    async def pump(index: int, ref: StreamRef) -> None:
        try:
            async for record in records(io, ref):
                await queue.put((index, record))
        finally:
            await queue.put((index, None))

    pumps = [asyncio.create_task(pump(i, ref)) for i, ref in enumerate(streams)]
    arrivals: dict[str, dict[int, dict[str, Any]]] = {}
    open_streams = len(streams)
    try:
        while open_streams:
            index, record = await queue.get()
            if record is None:
                open_streams -= 1
                continue
            got = arrivals.setdefault(record["row"], {})
            got[index] = record
            if len(got) == len(streams):
                yield _arrived(record["row"], arrivals.pop(record["row"]), len(sources))
        for key, got in arrivals.items():  # an upstream ended without it: it cannot come
            missing = [streams[i].name for i in range(len(streams)) if i not in got]
            lost = {"error": f"never reached this step: {', '.join(missing)} did not pass it on",
                    "error_type": "RowLost", "step_id": missing[0], "step_key": missing[0], "is_fatal": True}
            yield _arrived(key, {**got, -1: {"row": key, "stopped": lost, "context": {}}}, len(sources))
    finally:
        for task in pumps:
            task.cancel()


def _arrived(key: str, got: dict[int, dict[str, Any]], sources: int) -> Row:
    """A row once every upstream has delivered it: the sources' contexts merged; stopped (the
    first upstream's failure, every context merged) when any of them stopped it."""
    if stops := [got[i] for i in sorted(got) if "stopped" in got[i]]:
        contexts = [got[i]["context"] for i in sorted(got) if got[i].get("context")]
        return Row(key, TaskStepContext.merge_dicts(contexts).to_dict() if contexts else {},
                   stopped=stops[0]["stopped"])
    merged = [got[i]["context"] for i in range(sources)]
    return Row(key, TaskStepContext.merge_dicts(merged).to_dict() if len(merged) > 1 else merged[0] if merged else {})


def running_side_by_side() -> None:
    """The executor's mark for the step run in this thread (``executors.py``)."""
    _STEP_THREAD.side_by_side = True


def side_by_side() -> bool:
    """Whether this op runs beside the other ops of its run (so its rows may wait for rows that
    leave the run further down): only under the project's executor."""
    return getattr(_STEP_THREAD, "side_by_side", False)


def request_stop(run_id: str) -> None:
    _STOPS.add(run_id)


def stop_requested(run_id: str) -> bool:
    return run_id in _STOPS
