"""The op of a step: one definition per step type, copied per step with its description.

An op runs its step for each row as the row arrives (``streams.py``), ``rows_in_flight`` at a time,
and reports each row's asset events as its step ends; a row stopped at a fatal failure is passed on
as stopped. The last op, ``teardown_run``, ends each row's deployments as it leaves the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import queue
import signal
import threading
import time
from datetime import datetime, timezone
from functools import lru_cache, partial
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import dagster as dg

from ..context import TaskStepContext
from ..naming import node_name
from ..runtime.loop import new_event_loop
from ..steps.base import TaskStep
from ..steps.execution import StepFailed, StepOutcome, default_seed, run_step
from .io_manager import FAILED_ATTEMPT, FINAL_STEP, ContextIOManagerBase
from .resources import ARTIFACTS_KEY, JUDGE_KEY, RESOURCE_KEY, AgentEnvResource
from .retries import live_deployers, retries_carried, self_retry_pending
from .rows import REPLICATE_TAG, ROWS, node_assets, op_graph, plan_of, run_keys, step_fields, task_id_of
from .run_tally import STEP_ENDS
from .step_events import (
    asset_events, asset_provenance, check_evaluations, report_unreached, result_materialization, row_page_link,
)
from .streams import Row, StreamRef, StreamWriter, joined, records, running_side_by_side, side_by_side, stop_requested
from .translator import TAG_CONTENT_HASH, TAG_SEED, TAG_STEP_ID, TAG_STEP_TYPE

IO_MANAGER_KEY = "task_context_io_manager"
TEARDOWN_OP = FINAL_STEP
AFTER = "after"  # dependencies that order a node without handing it their context
ASSET_OUTPUT = "asset"  # what a node's task asset maps from (never yielded: each row's materialization is logged)
ARTIFACTS_INPUT = "artifacts"  # what the stored artifacts a node loads map into (lineage only)
STOP_POLL_SECONDS = 0.1  # how often an op looks whether its run was asked to stop
_MAIN_ENDED = object()  # what the loop thread puts in the outbox last


# An op's row stream (a ``StreamRef``): a type of its own, which run config cannot supply
# (Dagster's ``Any`` would add an ``inputs`` config schema to every node of every job).
STREAM = dg.DagsterType(type_check_fn=lambda _, value: isinstance(value, StreamRef), name="RowStream",
                        description="where an op's rows land (streams.StreamRef)")
STREAMS = dg.List[STREAM]


def _stream_op(name: str, run: Callable[..., Iterator[Any]], **op_args: Any) -> dg.OpDefinition:
    """An op running ``run(context, upstream, after)`` whose output is its row stream, mapping its task asset."""

    @dg.op(
        name=name,
        ins={"upstream": dg.In(STREAMS, default_value=[], description="the streams whose rows' contexts it merges"),
             AFTER: dg.In(STREAMS, default_value=[], description="streams whose rows it only waits for"),
             ARTIFACTS_INPUT: dg.In(dg.Nothing, description="the stored artifacts the step loads")},
        out={"result": dg.Out(io_manager_key=IO_MANAGER_KEY, is_required=False,
                              description="the step's row stream: each row as its step ends"),
             ASSET_OUTPUT: dg.Out(dg.Nothing, is_required=False,
                                  description="the task asset the step writes, a materialization a row")},
        **op_args,
    )
    def _op(context, upstream, after):
        yield from run(context, upstream, after)

    return _op


@lru_cache(maxsize=None)
def step_op(step_type: str) -> dg.OpDefinition:
    """The op of one step type; ``config.step`` holds the step's fields (launchpad-editable),
    ``config.rows`` the dataset values of the rows a root op starts."""
    return _stream_op(
        node_name(step_type), partial(run_step_op, step_type=step_type),
        config_schema={
            "step": dg.Field(dg.Permissive(), description="the step's fields"),
            ROWS: dg.Field(dg.Array(str), is_required=False,
                           description="root ops: the rows (partition keys) to run, when not the run's partitions"),
        },
        required_resource_keys={RESOURCE_KEY, ARTIFACTS_KEY, JUDGE_KEY, IO_MANAGER_KEY},
        tags={TAG_STEP_TYPE: step_type},
        description=f"Runs an agent-env `{step_type}` step for each row of the run.",
    )


def run_step_op(
    context: dg.OpExecutionContext, upstream: list[StreamRef], after: list[StreamRef], step_type: str,
) -> Iterator[Any]:
    resource: AgentEnvResource = getattr(context.resources, RESOURCE_KEY)
    io: ContextIOManagerBase = getattr(context.resources, IO_MANAGER_KEY)
    refuse_changed_task(context)
    node, graph = context.op_handle.name, context.op_handle.parent
    step = resource.parse_step(step_type, step_fields(context), node,
                               f"ops.{graph}.config.steps.{node}" if graph is not None else f"ops.{node}.config.step")
    refuse_ended_deployments(context, step)
    out = StreamWriter(io, context.run_id, str(context.op_handle))
    if "result" in context.selected_output_names:
        yield dg.Output(out.ref, "result")  # the ops below may start: they read the rows as they land
    rows = _RowsOfOp(context, resource, io, step, out)
    source = joined(io, upstream, after) if upstream or after else rows.admitted()
    try:
        yield from _driven(context.run_id, lambda outbox: rows.run(source, outbox), rows.events)
    except StepFailed as failed:  # a self-retry is left (``_one``): the stream stays open for the op's next attempt
        raise failed from None
    except BaseException:
        out.end()  # the ops below see the rows it did not pass on as lost
        raise
    rows.finish()


class _RowsOfOp:
    """One op's rows: each one's step run as it arrives, its outcome appended to the stream and told to Dagster."""

    def __init__(self, context: dg.OpExecutionContext, resource: AgentEnvResource, io: ContextIOManagerBase,
                 step: TaskStep, out: StreamWriter) -> None:
        self.context, self.resource, self.io, self.step, self.out = context, resource, io, step, out
        self.task_id = task_id_of(context)
        self.assets = node_assets(context.op.tags)
        self.prices = resource.load_config().model.prices if self.assets["produced"] else {}
        self.replicate = int(replicate) if (replicate := context.run.tags.get(REPLICATE_TAG)) is not None else None
        self.provenance = asset_provenance(context)
        self.row_page = row_page_link(context)
        self.carry_retries = retries_carried(context, step, io)
        # a self-retry pending: its budget comes before fail_task_on_error, and Dagster runs the op again
        self.retried_here = self_retry_pending(context, step)
        self.passed = 0
        self.stopped_here: list[str] = []
        self.first_failure: StepFailed | None = None

    async def admitted(self) -> AsyncIterator[Row]:
        """A root op's rows, fresh contexts, in order; where the run's ops go side by side, a row only once
        fewer than ``max_sandboxes`` are in the run (the teardown op's stream says which have left)."""
        context, resource, plan = self.context, self.resource, plan_of(self.context)
        keys = run_keys(context, context.op_config.get(ROWS))
        defaults = _seed_defaults(context)
        task_bound = plan.document.max_sandboxes if plan is not None else None
        bound = resource.live_rows_bound(task_bound) if side_by_side() and len(keys) > 1 else None
        left = records(self.io, StreamRef(context.run_id, _sibling(context, TEARDOWN_OP))) if bound else None
        departed = 0  # rows the teardown op's stream has passed on
        try:
            for index, key in enumerate(keys):
                while left is not None and departed <= index - bound:
                    if await anext(left, None) is None:  # the teardown op ended: no row will leave any more
                        left = None
                    departed += 1
                seed = (plan.document.partitions or {}).get(key) if key and plan is not None else None  # its values
                # a re-execution (a retry) is the same task instance as its root run
                ctx = resource.initial_context(context.run.root_run_id or context.run_id, self.task_id, key, seed)
                default_seed(ctx, defaults)
                yield Row(key, ctx.to_dict())
        finally:
            if left is not None:
                await left.aclose()

    async def run(self, source: AsyncIterator[Row], outbox: queue.SimpleQueue) -> None:
        """Every row of ``source`` through the step, ``rows_in_flight`` at once."""
        async with self.resource.step_runtime(self.context, self.task_id) as rt:
            async with rt.lanes(self.resource.rows_in_flight) as lanes:
                running: set[asyncio.Task] = {asyncio.create_task(self._warm_up(rt))}
                async for row in source:
                    if row.stopped is not None:
                        self.out.append(row.key, row.context, row.stopped)
                        continue
                    task = asyncio.create_task(self._one(row, lanes, outbox))
                    running.add(task)
                    task.add_done_callback(running.discard)
                await asyncio.gather(*running)

    async def _warm_up(self, rt) -> None:
        try:
            await self.step.warm_up(rt)
        except Exception as exc:  # noqa: BLE001 - the first row's step reports it
            self.context.log.debug(f"step '{self.step.id}' not warmed up: {exc}")

    async def _one(self, row: Row, lanes: asyncio.Queue, outbox: queue.SimpleQueue) -> None:
        ctx = TaskStepContext.from_dict(row.context)
        if self.carry_retries is not None:
            self.carry_retries(row.key, ctx)
        step = self.step.model_copy(update={"fail_task_on_error": True}) if self.retried_here else self.step
        rt = await lanes.get()
        try:
            outcome: StepOutcome | StepFailed = await run_step(step, ctx, rt)
        except StepFailed as failed:
            outcome = failed
        finally:
            lanes.put_nowait(rt)
        if isinstance(outcome, StepFailed):
            if self.retried_here:  # Dagster runs the op again: this row's attempt is kept for its record
                StreamWriter(self.io, self.context.run_id, f"{self.out.ref.name}{FAILED_ATTEMPT}").append(
                    row.key, ctx.to_dict(), outcome.record)
                raise outcome
            self.out.append(row.key, ctx.to_dict(), {**outcome.record, "step_key": self.out.ref.name})
            self.stopped_here.append(row.key)
            self.first_failure = self.first_failure or outcome
        else:
            self.out.append(row.key, ctx.to_dict())
            self.passed += 1
        outbox.put((row.key, outcome, ctx))

    def events(self, finished: list[tuple[str, StepOutcome | StepFailed, TaskStepContext]]) -> Iterator[Any]:
        """The Dagster events of rows whose step ended: each passed row's asset events, then the
        checks of their verifications (which judge the materializations just written)."""
        passed: dict[str, TaskStepContext] = {}
        stopped: list[str] = []
        for key, outcome, ctx in finished:
            if isinstance(outcome, StepFailed):
                self.context.log.error(f"{outcome}{_row(key)}")
                stopped.append(key)
                continue
            if outcome.failure:
                self.context.log.warning(f"step '{self.step.id}' failed (tolerated, fail_task_on_error=false)"
                                         f"{_row(key)}: {outcome.failure['error']}")
            passed[key] = ctx
            yield from asset_events(self.assets, outcome.step, ctx, key or None, prices=self.prices,
                                    replicate=self.replicate, provenance=self.provenance,
                                    row_page=self.row_page(key))
        if stopped:
            report_unreached(self.context, stopped)
        yield from check_evaluations(self.context.instance, self.assets, passed)

    def finish(self) -> None:
        """End the stream; fail the op when every row that reached it stopped here. A one-step-at-a-time executor
        then skips every step below (the teardown op too): the last step still to run ends the run's deployments."""
        self.out.end()
        stopped = self.stopped_here
        self.context.log.info(f"step '{self.step.id}': {self.passed} row(s) passed"
                              + (f", {len(stopped)} stopped here" if stopped else ""))
        failing = bool(stopped and not self.passed)
        one_step_at_a_time = self.context.job_def.executor_def.name in ("in_process", "execute_in_process_executor")
        ended = self.resource.teardown(self.context.run_id) if one_step_at_a_time and not side_by_side() \
            and _last_to_run_after_a_failure(self.context, self.step.id, failing) else []
        if ended and not failing:
            self.context.log.info(f"the run's failed steps skip the rest of it: ended {len(ended)} deployment(s)")
        if failing:
            first = self.first_failure
            several = {"failed_rows": sorted(stopped)} if len(stopped) > 1 else {}
            raise dg.Failure(description=f"{len(stopped)} rows failed; the first: {first}" if several else str(first),
                             metadata={"error_type": first.record["error_type"], "torn_down": ended, **several})


def _take(outbox: queue.SimpleQueue) -> list[Any]:
    """What an op's rows (on its event loop's thread) handed its generator (in the op's thread, which alone may yield
    Dagster events): at least one item (blocking until there is one), and whatever else is waiting (one reader)."""
    items: list[Any] = []
    while not items:  # a timeout now and then: the main thread's signal handlers run meanwhile
        with contextlib.suppress(queue.Empty):
            items.append(outbox.get(timeout=STOP_POLL_SECONDS))
    while not outbox.empty():
        items.append(outbox.get_nowait())
    return items


def _driven(run_id: str, main: Callable[[queue.SimpleQueue], Awaitable[None]],
            to_events: Callable[[list[Any]], Iterator[Any]]) -> Iterator[Any]:
    """Run ``main`` on an event loop in a thread of its own, handing its outbox's items to ``to_events`` in the op's
    thread (Dagster takes events from there only); raises what ``main`` raised. Asked to stop (SIGINT,
    ``streams.request_stop``), ``main`` is cancelled and unwinds, then the interruption is raised."""
    loop = new_event_loop()
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    # made now: ``cancel`` has it at once and it starts first; its context empty, as in the loop's new thread
    task = loop.create_task(main(outbox), context=contextvars.Context())
    ended: list[BaseException | None] = []

    async def supervised() -> None:
        while not task.done() and not stop_requested(run_id):
            await asyncio.wait({task}, timeout=STOP_POLL_SECONDS)
        if not task.done():  # the run was asked to stop
            task.cancel()
            await asyncio.wait({task})
        ended.append(task.exception() if not task.cancelled() else asyncio.CancelledError())

    beside = side_by_side()

    def run_loop() -> None:
        if beside:  # the loop's thread is the step's: it runs beside the other ops too
            running_side_by_side()
        try:
            loop.run_until_complete(supervised())
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException as exc:  # noqa: BLE001 - handed to the op's thread
            ended.append(exc)
        finally:
            loop.close()
            outbox.put(_MAIN_ENDED)

    def cancel() -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)

    interrupted: list[Any] = []
    handler = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    if callable(handler):
        signal.signal(signal.SIGINT, lambda signum, frame: (interrupted.append(frame), cancel()))
    thread = threading.Thread(target=run_loop, name=f"{threading.current_thread().name} rows", daemon=True)
    thread.start()
    try:
        while (items := _take(outbox))[-1] is not _MAIN_ENDED:
            yield from to_events(items)
        yield from to_events(items[:-1])
        if interrupted:
            handler(signal.SIGINT, interrupted[0])  # raises, unless the process defers interrupts
        if ended and ended[0] is not None:
            raise ended[0]
    finally:
        if callable(handler):
            signal.signal(signal.SIGINT, handler)
        if thread.is_alive():  # the generator was closed early: its rows end with it
            cancel()
            thread.join()


def _last_to_run_after_a_failure(context: dg.OpExecutionContext, step_id: str, failing: bool) -> bool:
    """Whether a step of the run has failed (this one, when ``failing``) and no step is left to run but a failed
    step's descendants, which a one-step-at-a-time executor skips (the teardown op among them)."""
    plan = plan_of(context)
    if plan is None:  # (a job not built from a task plan: nothing to wait for is known)
        return failing
    ends = context.instance.get_records_for_run(context.run_id, of_type=STEP_ENDS).records
    ended = {r.event_log_entry.step_key: r.event_log_entry.dagster_event_type for r in ends}
    key = step_keys(context)
    failed = {s for s, k in key.items() if ended.get(k) == dg.DagsterEventType.STEP_FAILURE}
    failed |= {step_id} if failing else set()
    selected = context.run.step_keys_to_execute
    still_to_run = [s for s, k in key.items() if s != step_id and k not in ended
                    and (selected is None or k in selected) and not plan.ancestors(s) & failed]
    return bool(failed) and not still_to_run


def step_keys(context: dg.OpExecutionContext) -> dict[str, str]:
    """The step key of each step of the op's task, by step id (its node's tag)."""
    return {step_id: _sibling(context, node.name) for node in op_graph(context).nodes
            if (step_id := node.tags.get(TAG_STEP_ID))}


def _sibling(context: dg.OpExecutionContext, name: str) -> str:
    """The step key of another node of the op's graph (``<graph>.<name>`` inside a graph)."""
    parent = context.op_handle.parent
    return f"{parent}.{name}" if parent is not None else name


def _seed_defaults(context: dg.OpExecutionContext) -> dict[str, Any] | None:
    """The task's default token values: the run's tag (the launchpad can edit it), else its plan's."""
    if (raw := context.run.tags.get(TAG_SEED)) is None:
        return plan.document.seed if (plan := plan_of(context)) is not None else None
    with contextlib.suppress(ValueError):
        if isinstance(value := json.loads(raw or "null"), dict | None):  # (an empty tag: none)
            return value
    raise dg.Failure(description=f"run tag '{TAG_SEED}' must be a JSON object of token values, got {raw!r}")


def _row(key: str) -> str:
    return f" (row '{key}')" if key else ""


def refuse_ended_deployments(context, step: TaskStep) -> None:
    """Refuse a step of a re-execution that uses an env, agent or sandbox its parent run deployed (which
    ended with that run) and its own run does not deploy again, naming the steps to select."""
    selected = context.run.step_keys_to_execute
    plan = plan_of(context)
    if not context.run.parent_run_id or selected is None or plan is None or step.id not in plan.step_by_id:
        return
    keys = step_keys(context)
    if ended := sorted(d for d in live_deployers(plan, step.id) if d in keys and keys[d] not in selected):
        raise dg.Failure(description=(
            f"step '{step.id}' uses what step(s) {', '.join(repr(d) for d in ended)} deployed in run "
            f"{context.run.parent_run_id}, which ended with that run: re-execute from "
            f"'{ended[0]}' (select it and the steps after it), or re-execute all"))


def refuse_changed_task(context) -> None:
    """Refuse a re-execution of a task whose content changed since its parent run."""
    parent_id = context.run.parent_run_id
    parent = context.instance.get_run_by_id(parent_id) if parent_id else None
    before = parent.tags.get(TAG_CONTENT_HASH) if parent else None
    now = context.op.tags.get(TAG_CONTENT_HASH)
    if before and now and before != now:
        raise dg.Failure(description=f"re-execution refused: the task changed since run {parent_id} "
                         f"(content hash {before} -> {now}); launch a new run instead")


@lru_cache(maxsize=None)
def teardown_op() -> dg.OpDefinition:
    """The last op of every task graph."""
    return _stream_op(
        TEARDOWN_OP, run_teardown, required_resource_keys={RESOURCE_KEY, IO_MANAGER_KEY},
        description="Ends each row's envs, agents and sandboxes as the row leaves the run (every "
        "last step done, or stopped at a failure), then whatever the run still holds; its stream "
        "holds each row's final context. Fails the run when a row stopped at a failing step.",
    )


def run_teardown(context: dg.OpExecutionContext, upstream: list[StreamRef], after: list[StreamRef]) -> Iterator[Any]:
    resource: AgentEnvResource = getattr(context.resources, RESOURCE_KEY)
    io: ContextIOManagerBase = getattr(context.resources, IO_MANAGER_KEY)
    out = StreamWriter(io, context.run_id, str(context.op_handle))
    if "result" in context.selected_output_names:
        yield dg.Output(out.ref, "result")
    # the teardown node's asset (each row's outcome); none in a job of the op graph alone
    results_key = context.asset_key_for_output(ASSET_OUTPUT) if context.has_assets_def else None
    provenance = asset_provenance(context, results_key) if results_key is not None else None
    stopped: list[str] = []
    ended: list[str] = []

    async def leave(outbox: queue.SimpleQueue) -> None:
        async for row in joined(io, upstream, after):
            ctx = TaskStepContext.from_dict(row.context)
            timing = ctx.metadata_map("step_timings")[TEARDOWN_OP] = {
                "started_at_utc": datetime.now(timezone.utc).isoformat()}
            started = time.perf_counter()
            ended.extend(await asyncio.to_thread(resource.end_row, context.run_id, ctx))
            timing["duration_seconds"] = round(time.perf_counter() - started, 3)
            if row.stopped is not None:
                stopped.append(row.key)
            out.append(row.key, ctx.to_dict(), row.stopped)
            outbox.put((row.key, ctx, row.stopped))

    def materialized(left: list[tuple[str, TaskStepContext, dict | None]]) -> Iterator[Any]:
        for row, ctx, failure in left if results_key is not None else []:
            yield result_materialization(results_key, row or None, ctx, failure, provenance)

    yield from _driven(context.run_id, leave, materialized)
    ended += resource.teardown(context.run_id)
    out.end()
    rows = len(io.rows(context.run_id, out.ref.name))
    if stopped:  # the others finished; the run fails so Dagster marks the stopped rows failed
        raise dg.Failure(
            description=f"{len(stopped)} of {rows} rows stopped at a failing step (their verifications are "
            f"failed partitions): {', '.join(stopped[:20])}" + (" ..." if len(stopped) > 20 else ""),
            metadata={"torn_down": sorted(ended), "failed_rows": dg.MetadataValue.json(stopped[:1000])})
    context.log.info(f"{rows} row(s) done; ended {len(ended)} deployment(s)")
