"""A dataset's selected rows as shard runs: contiguous slices of its partitions, each one Dagster
run over a range of partitions, run side by side in their own processes.

One run's ops are barriers and its Python is one core: grading (CPU) cannot overlap the
prompts (waiting). Two shards on two cores do overlap them: on the 1,000-row benchmark,
16.5–18.4 s in one run against 14.4–15.6 s in two. Each shard has an agent host of its own;
they are forked from one import as the runs start (``hosts_ahead.forked_shard_hosts``).
``rows_in_flight`` is shared out (the shares add up to it, and there are never more shards
than rows in flight), so the agents see the same number of prompts at once either way.
Afterwards the suite's Dagster run goes ``beside`` the reports in the same way.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import dagster as dg

from ..compiler import step_registry
from ..config import AgentEnvConfig
from ..context import TaskStepContext
from ..plan import TaskPlan
from ..runtime.local import adopting_forked_hosts
from .execute import execute_plan, opened_instance
from .hosts_ahead import forked_shard_hosts
from .resources import AgentEnvResource

log = logging.getLogger(__name__)


def run_rows(
    plan: TaskPlan, config: AgentEnvConfig, rows: list[str] | None, *, output_dir: Path,
    instance: dg.DagsterInstance | None, rows_in_flight: int | None, tags: dict[str, str], shards: int = 1,
    meanwhile: Callable[[], None] | None = None,
) -> dict[str, TaskStepContext]:
    """Each row's final context, in row order (key ``""`` for a task without a dataset).
    ``meanwhile`` is work of this process's to do while shard runs go on (see ``_when_idle``)."""
    if not rows:
        run = execute_plan(plan, config, output_dir=output_dir, instance=instance, tags=tags)
        return {"": run.context}
    total = rows_in_flight or AgentEnvResource.model_fields["rows_in_flight"].default
    size = math.ceil(len(rows) / max(1, min(shards, len(rows), total)))  # every shard has a row in flight
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    if len(chunks) == 1:
        contexts = execute_plan(plan, config, output_dir=output_dir, instance=instance, partition_keys=rows,
                                rows_in_flight=rows_in_flight, tags=tags).contexts
    else:
        # the bound holds across the shards: their shares add up to it
        shares = [total // len(chunks) + (i < total % len(chunks)) for i in range(len(chunks))]
        blob = pickle.dumps(plan)
        # the hosts import while the runs start; the parent opens the instance first: a new
        # SQLite instance creates its tables on opening, and two shards doing that at once
        # collide ("table runs already exists")
        with forked_shard_hosts(plan, config, len(chunks)) as forked, opened_instance(config, instance) as opened:
            ref = opened.get_ref()
            with ProcessPoolExecutor(len(chunks), mp_context=_start_method()) as pool:
                futures = [
                    pool.submit(_shard, blob, config, ref, chunk, share, tags, output_dir / f"shard-{i}",
                                forked[i] if forked else None)
                    for i, (chunk, share) in enumerate(zip(chunks, shares))
                ]
                with _when_idle(meanwhile):
                    contexts = {k: c for future in futures for k, c in future.result().items()}
    return {k: contexts[k] for k in rows if k in contexts}


@contextlib.contextmanager
def _when_idle(fn: Callable[[], None] | None) -> Iterator[None]:
    """While the block runs, ``fn()`` in a thread of this process at the lowest CPU priority
    (Linux gives a thread its own), so it takes what the shard runs leave idle (their prompts
    wait on the agents), not what their start needs; the block's end waits for it. Its work is
    done ahead of when it is needed, and done again then if need be: what it raises is logged,
    not raised."""
    if fn is None:
        yield
        return

    def run() -> None:
        with contextlib.suppress(AttributeError, OSError):  # (elsewhere, at the thread's usual priority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - an optimisation's failure: its work is redone when needed
            log.debug("%s, done ahead, failed: %s", getattr(fn, "__name__", fn), exc)

    thread = threading.Thread(target=run, name="while-the-shards-run")
    thread.start()
    try:
        yield
    finally:
        thread.join()


def beside(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
    """``fn(*args)`` in a process forked from this one, on the other core while this one goes
    on; or now, where forking is not safe. Call what it returns to wait for it: that raises
    what ``fn`` raised (its traceback as the cause). A bare process and a pipe, not a
    ``ProcessPoolExecutor``: that one's manager thread would keep later shards from forking."""
    if not _forks_safely():
        fn(*args)
        return lambda: None
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_call, args=(send, fn, args))
    child.start()
    send.close()

    def wait() -> None:
        try:
            outcome = receive.recv()
        except EOFError:  # it ended before it could say
            outcome = False
        finally:
            receive.close()
        child.join()
        if outcome is False:
            raise RuntimeError(f"{fn.__name__} ended with exit code {child.exitcode}")
        if outcome is not None:
            error, trace = outcome
            raise error from ForkedTraceback(trace)

    return wait


class ForkedTraceback(Exception):
    """Where an error raised in a forked process came from (as ``concurrent.futures`` does)."""


def _call(send, fn: Callable[..., None], args: tuple) -> None:
    gc.freeze()  # what the fork brought along stays out of the collector's sweeps
    try:
        fn(*args)
        send.send(None)
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        trace = traceback.format_exc()
        try:
            send.send((exc, trace))
        except Exception:  # an error that does not pickle: its text
            send.send((RuntimeError(f"{type(exc).__name__}: {exc}"), trace))


def _forks_safely() -> bool:
    """A fork carries only the thread that calls it: safe while this process runs no other."""
    return sys.platform == "linux" and threading.active_count() == 1


def _start_method():
    """Shard processes forked from this one while it runs no other thread (what the CLI has
    imported comes along: ~1.5 s sooner than a fresh start on 2 cores), else from a server
    that has imported Dagster and this package once (fork-safe: the server runs no threads)."""
    if _forks_safely():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dagster", "agentenv_dagster.orchestration.shards"])
    return context


def _shard(plan_blob: bytes, config: AgentEnvConfig, instance_ref, keys: list[str], rows_in_flight: int,
           tags: dict[str, str], output_dir: Path, forked_hosts: dict[str, Any] | None) -> dict[str, TaskStepContext]:
    gc.freeze()  # what a fork brought along stays out of the collector's sweeps (and its pages shared)
    step_registry(config)  # a project's own step modules importable before the plan is read back
    plan = pickle.loads(plan_blob)
    with adopting_forked_hosts(forked_hosts), dg.DagsterInstance.from_ref(instance_ref) as instance:
        return execute_plan(plan, config, output_dir=output_dir, instance=instance, partition_keys=keys,
                            rows_in_flight=rows_in_flight, tags=tags).contexts
