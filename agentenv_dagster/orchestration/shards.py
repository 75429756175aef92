"""A dataset's selected rows as shard runs: contiguous slices of its partitions, each one Dagster
run over a range of partitions, run side by side in their own processes.

One run's ops are barriers and its Python is one core: grading (CPU) cannot overlap the
prompts (waiting). Two shards on two cores do overlap them: on the 1,000-row benchmark,
16.5–18.4 s in one run against 14.4–15.6 s in two. Each shard has an agent host of its own;
they are forked from one import as the runs start (``hosts_ahead.forked_shard_hosts``).
``rows_in_flight`` is shared out (the shares add up to it, and there are never more shards
than rows in flight), so the agents see the same number of prompts at once either way.
With enough rows a core's slice goes in runs that take turns at the agent (``handover``):
each later one starts as the one before it begins prompting and takes its lanes as its last
rows end, so each run's grading overlaps the next one's prompts (two runs a core against one,
1,000 rows at 200 ms: ~1.2 s, 10 %, sooner). Those runs are bare forked processes, which
inherit their pipes.
Each run's process also finishes its rows as it ends (``finish``: the command's task.json
records), so the earlier runs' rows are done while the later runs go on. Afterwards the
suite's Dagster run goes ``beside`` the reports in the same way.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import multiprocessing
import os
import pickle
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
from ..runtime.processes import forks_safely
from .execute import execute_plan, opened_instance
from .handover import GATED_STEP_TYPES, Handover, chain, taking_turns
from .hosts_ahead import forked_shard_hosts
from .resources import AgentEnvResource

log = logging.getLogger(__name__)


def run_rows(
    plan: TaskPlan, config: AgentEnvConfig, rows: list[str] | None, *, output_dir: Path,
    instance: dg.DagsterInstance | None, rows_in_flight: int | None, tags: dict[str, str], shards: int = 1,
    meanwhile: Callable[[], None] | None = None, finish: Callable[[str, TaskStepContext], Any] | None = None,
    landed: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Each row's final context, in row order (key ``""`` for a task without a dataset), or
    what ``finish(key, context)`` made of it: in the row's shard process as its run ends, so the
    earlier runs' rows are finished while the later runs go on, and the last ones on every core
    at once. ``meanwhile`` is work of this process's to do while shard runs go on (see
    ``_when_idle``); ``landed`` is given each run's finished rows in this process as that run
    ends (the earlier runs' while the later ones go on)."""
    finish = finish or _as_it_is
    landed = landed or _ignore
    if not rows:
        run = execute_plan(plan, config, output_dir=output_dir, instance=instance, tags=tags)
        finished = {"": finish("", run.context)}
        landed(finished)
        return finished
    total = rows_in_flight or AgentEnvResource.model_fields["rows_in_flight"].default
    size = math.ceil(len(rows) / max(1, min(shards, len(rows), total)))  # every shard has a row in flight
    chunks = [rows[i:i + size] for i in range(0, len(rows), size)]
    if len(chunks) == 1:
        contexts = execute_plan(plan, config, output_dir=output_dir, instance=instance, partition_keys=rows,
                                rows_in_flight=rows_in_flight, tags=tags).contexts
        finished = {k: finish(k, c) for k, c in contexts.items()}
        landed(finished)
    else:
        # the bound holds across the shards: their shares add up to it
        shares = [total // len(chunks) + (i < total % len(chunks)) for i in range(len(chunks))]
        runs = _runs(plan, chunks, shares)
        every = tuple(turns for _, _, turns in runs if turns)
        blob = pickle.dumps(plan)
        # the hosts import while the runs start (the first runs' first); the parent opens the
        # instance first: a new SQLite instance creates its tables on opening, and two shards
        # doing that at once collide ("table runs already exists")
        try:
            with forked_shard_hosts(plan, config, len(runs), len(chunks) if every else None) as forked, \
                    opened_instance(config, instance) as opened:
                args = [(blob, config, opened.get_ref(), keys, share, tags, output_dir / f"shard-{i}",
                         forked[i] if forked else None, finish) for i, (keys, share, _) in enumerate(runs)]
                if every:
                    waits = [_forked(_shard, *a, turns, every) for a, (_, _, turns) in zip(args, runs)]
                    for turns in every:
                        turns.close()  # the parent's copies: each pipe ends with its one writer
                    with _when_idle(meanwhile):
                        finished = {k: c for found in _all_of(waits, landed) for k, c in found.items()}
                else:
                    with ProcessPoolExecutor(len(runs), mp_context=_start_method()) as pool:
                        futures = [pool.submit(_shard, *a) for a in args]
                        with _when_idle(meanwhile):
                            finished = {}
                            for future in futures:
                                found = future.result()
                                landed(found)
                                finished.update(found)
        finally:
            for turns in every:  # (already closed, unless something failed before the runs forked)
                turns.close()
    return {k: finished[k] for k in rows if k in finished}


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
    if not forks_safely():
        fn(*args)
        return lambda: None
    return _forked(fn, *args)


class Ahead:
    """A process forked ahead of what it must wait for (``ahead``): ``go()`` tells it to go on
    and returns the wait for it; ``stop()`` tells it not to, and waits for it to end."""

    def __init__(self, told: int, wait: Callable[[], Any]) -> None:
        self._told, self._wait = told, wait

    def go(self) -> Callable[[], Any]:
        with contextlib.suppress(BrokenPipeError):  # it has ended: its wait says why
            os.write(self._told, b"g")
        os.close(self._told)
        return self._wait

    def stop(self) -> None:
        os.close(self._told)  # the end of the pipe, once the processes forked since have ended too
        self._wait()


def ahead(fn: Callable[..., None], *args: Any) -> Ahead | None:
    """``fn(*args, told)`` in a process forked now, where forking is safe (else None): ``told``
    is the read end of a pipe, where a byte says go on and the end of the pipe says stop (the
    processes forked after it hold the write end too, until they end)."""
    if not forks_safely():
        return None
    told, tell = os.pipe()
    wait = _forked(_told_by, fn, args, told, tell)
    os.close(told)
    return Ahead(tell, wait)


def _told_by(fn: Callable[..., None], args: tuple, told: int, tell: int) -> None:
    os.close(tell)  # only the parent tells
    fn(*args, told)


def _forked(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    """``fn(*args)`` in a process forked now; what it returns is the wait for its result."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_call, args=(send, fn, args))
    child.start()
    send.close()

    def wait() -> Any:
        try:
            done, outcome = receive.recv()
        except EOFError:  # it ended before it could say
            done, outcome = None, None
        finally:
            receive.close()
        child.join()
        if done is None:
            raise RuntimeError(f"{fn.__name__} ended with exit code {child.exitcode}")
        if not done:
            error, trace = outcome
            raise error from ForkedTraceback(trace)
        return outcome

    return wait


def _all_of(waits: list[Callable[[], Any]], each: Callable[[Any], None]) -> list[Any]:
    """What each forked process returned, once every one has ended (``each`` of it as it
    comes, in order); the first error raised."""
    found, errors = [], []
    for wait in waits:
        try:
            found.append(wait())
            each(found[-1])
        except BaseException as exc:  # noqa: BLE001 - raised once the others have ended
            errors.append(exc)
    if errors:
        raise errors[0]
    return found


class ForkedTraceback(Exception):
    """Where an error raised in a forked process came from (as ``concurrent.futures`` does)."""


def _call(send, fn: Callable[..., Any], args: tuple) -> None:
    gc.freeze()  # what the fork brought along stays out of the collector's sweeps
    try:
        send.send((True, fn(*args)))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        trace = traceback.format_exc()
        try:
            send.send((False, (exc, trace)))
        except Exception:  # an error that does not pickle: its text
            send.send((False, (RuntimeError(f"{type(exc).__name__}: {exc}"), trace)))


def _start_method():
    """Shard processes forked from this one while it runs no other thread (what the CLI has
    imported comes along: ~1.5 s sooner than a fresh start on 2 cores), else from a server
    that has imported Dagster and this package once (fork-safe: the server runs no threads)."""
    if forks_safely():
        return multiprocessing.get_context("fork")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["dagster", "agentenv_dagster.orchestration.shards"])
    return context


def _shard(plan_blob: bytes, config: AgentEnvConfig, instance_ref, keys: list[str], rows_in_flight: int,
           tags: dict[str, str], output_dir: Path, forked_hosts: dict[str, Any] | None,
           finish: Callable[[str, TaskStepContext], Any], turns: Handover | None = None,
           every: tuple[Handover, ...] = ()) -> dict[str, Any]:
    gc.freeze()  # what a fork brought along stays out of the collector's sweeps (and its pages shared)
    with taking_turns(turns, every):  # a later run waits here for its turn
        step_registry(config)  # a project's own step modules importable before the plan is read back
        plan = pickle.loads(plan_blob)
        with adopting_forked_hosts(forked_hosts), dg.DagsterInstance.from_ref(instance_ref) as instance:
            contexts = execute_plan(plan, config, output_dir=output_dir, instance=instance, partition_keys=keys,
                                    rows_in_flight=rows_in_flight, tags=tags).contexts
    return {k: finish(k, c) for k, c in contexts.items()}


def _ignore(finished: dict[str, Any]) -> None:
    """What ``run_rows`` does with each run's rows as it ends, unless told otherwise: nothing."""


def _as_it_is(key: str, context: TaskStepContext) -> TaskStepContext:
    """A row's context, unfinished (``run_rows`` without ``finish``)."""
    return context


TURN_ROUNDS = 3  # a core's rows take turns in runs when each has this many rounds of its lanes
# Of a core's rows, each run's part, by how many runs take turns (the most that have their
# rounds). The first run's set-up (its sandboxes, workspaces and agents) is all that precedes
# the prompts, and the last run's grading (criteria, teardown) all that follows them: both are
# small, and each run in between sets its rows up while the one before prompts and grades them
# while the one after prompts. A row's grading costs more than its setting up, so the runs get
# smaller towards the end, and the last takes the fewest. (1,000 rows at 200 ms: three runs a
# core against two, the first prompt ~0.4 s sooner and the last grading ~0.2 s shorter; four
# against three ~0.1 s sooner again. 300 rows: two runs a core against one, 3.1 s against 3.3.)
PARTS = {4: (0.3, 0.4, 0.18, 0.12), 3: (0.3, 0.45, 0.25), 2: (0.6, 0.4)}


def _runs(plan: TaskPlan, chunks: list[list[str]], shares: list[int]) -> list[tuple[list[str], int, Handover | None]]:
    """Each shard run's rows, rows in flight and part in a chain taking turns, every core's
    first run first: a core's rows in four runs, three or two (``handover``, ``PARTS``), the
    most whose parts each have ``TURN_ROUNDS`` rounds of its lanes or more, when its plan has
    steps that talk to the agent and this process can fork its runs (they inherit the pipes);
    else a run a core."""
    gated = tuple(s.id for s in plan.steps if s.type_name in GATED_STEP_TYPES)
    for parts in PARTS.values():
        splits = [_split(chunk, parts) for chunk in chunks]
        if gated and forks_safely() and all(
                min(map(len, split)) >= TURN_ROUNDS * n for split, n in zip(splits, shares)):
            cores = [[(rows, share, turns) for rows, turns in zip(split, chain(gated, len(parts)))]
                     for split, share in zip(splits, shares)]
            # by turn: the runs (and so their hosts) that prompt first are forked first
            return [run for turn in zip(*cores) for run in turn]
    return [(chunk, share, None) for chunk, share in zip(chunks, shares)]


def _split(chunk: list[str], parts: tuple[float, ...]) -> list[list[str]]:
    """``chunk`` in consecutive slices, each ``parts`` of it (the last one the rest)."""
    ends = [math.ceil(len(chunk) * sum(parts[:i + 1])) for i in range(len(parts) - 1)] + [len(chunk)]
    return [chunk[start:end] for start, end in zip([0, *ends], ends)]
