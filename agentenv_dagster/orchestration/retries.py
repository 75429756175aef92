"""retry_config at run time: a span retry is a Dagster re-execution, a self-retry an op RetryPolicy.

Where agent-env rolls a span back within its run, here the failed run stays as it ran and a child run
re-executes the ``retry_from`` step, its dependents and the deployers of what they use (the failed run ended
them), at most ``max_retries`` times per step; it records ``metadata.retry_resets`` as agent-env does.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable

import dagster as dg

from ..context import TaskStepContext
from ..plan import TaskPlan
from ..steps.base import AGENT, ENV, SANDBOX, TaskStep
from ..steps.containers import CONTAINER
from ..steps.execution import record_retries, rolled_back_sandboxes
from .dagster_internals import (
    RUN_KEY_TAG, SENSOR_NAME_TAG, TAGS_TO_MAYBE_OMIT_ON_RETRY, create_reexecution, execute_here,
)
from .io_manager import FAILED_ATTEMPT, FINAL_STEP, ContextIOManagerBase
from .rows import node_step_key, task_graph_of
from .translator import TAG_CONTENT_HASH, TaskTranslator

TAG_RETRY_SPAN = "agentenv/retry_span"  # node tag: the span a step's retry_config re-executes
TAG_RETRY_OF = "agentenv/retry_of"  # the failed run a retry re-executes: one retry per failure
TAG_RETRY_STEP = "agentenv/retry_step"
TAG_RETRY_FROM = "agentenv/retry_from"
TAG_RETRY_ATTEMPT = "agentenv/retry_attempt"
TAG_RETRY_RESETS = "agentenv/retry_resets"  # every reset of the chain so far (JSON)
TAG_RETRIED_BY = "agentenv/retried_by"  # on the failed run: its child

LIVE = (ENV, AGENT, SANDBOX, CONTAINER)  # names whose writer starts something a failed run ends
log = logging.getLogger("agentenv_dagster")


# -- compile time ---------------------------------------------------------------------------

def retry_span(plan: TaskPlan, step_id: str) -> list[str]:
    """The steps a retry of ``step_id`` re-executes, in list order: ``retry_from``, its dependents
    and, transitively, every ancestor that deployed something a member uses."""
    selected = {plan.step_by_id[step_id].retry_config.retry_from_step_id}
    while True:
        grown = selected | {s.id for s in plan.steps if plan.ancestors(s.id) & selected}
        for member in list(grown):
            grown |= live_deployers(plan, member)
        if grown == selected:
            return [s.id for s in plan.steps if s.id in selected]
        selected = grown


def live_deployers(plan: TaskPlan, step_id: str) -> set[str]:
    """The ancestors of ``step_id`` that deployed an env, agent, sandbox or container it uses (a run ends them)."""
    used = {(n.kind, n.name) for n in plan.step_by_id[step_id].names_read() if n.kind in LIVE}
    return {a for a in plan.ancestors(step_id) if used & plan.written_by(plan.step_by_id[a])}


def span_tags(plan: TaskPlan, step: TaskStep, translator: TaskTranslator) -> dict[str, str]:
    """The node tag of a step whose retry_config names an ancestor (a self-retry is the node's RetryPolicy)."""
    config = step.retry_config
    if not config or config.retry_from_step_id == step.id or config.max_retries <= 0:
        return {}
    replay = [[translator.get_node_name(plan.step_by_id[s]), s] for s in retry_span(plan, step.id)]
    return {TAG_RETRY_SPAN: json.dumps({"step_id": step.id, "retry_from_step_id": config.retry_from_step_id,
                                        "max_retries": config.max_retries, "replay": replay})}


# -- deciding and creating a retry run ------------------------------------------------------

@dataclass(frozen=True)
class Retry:
    parent: dg.DagsterRun
    step_keys: list[str]
    tags: dict[str, str]
    reset: dict[str, Any]


def plan_retry(instance: dg.DagsterInstance, job_def: dg.JobDefinition, run: dg.DagsterRun,
               io: ContextIOManagerBase) -> Retry | str | None:
    """The child run that retries the failed ``run``; else why not (None: no retry_config span failed)."""
    failed = sorted({e.step_key for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
                     if e.step_key and e.step_key != FINAL_STEP})  # (the teardown fails because a row stopped)
    nodes = {node_step_key(job_def, node.name): node for node in task_graph_of(job_def).nodes}
    spans = {key: json.loads(tag) for key in failed if key in nodes and (tag := nodes[key].tags.get(TAG_RETRY_SPAN))}
    if not spans:
        return None
    if len(failed) > 1:
        return f"steps {failed} failed in one run: not retried (only a lone retryable failure is)"
    (span,) = spans.values()
    step_id = span["step_id"]
    if run.tags.get(TAG_CONTENT_HASH) != job_def.tags.get(TAG_CONTENT_HASH):
        return f"the task changed since run {run.run_id}: not retried"
    if done := instance.get_run_ids(dg.RunsFilter(tags={TAG_RETRY_OF: run.run_id}), limit=1):
        return f"run {run.run_id} was already retried by run {done[0]}"
    chain = [run]  # and its parents, up to the root
    while chain[-1].parent_run_id and (parent := instance.get_run_by_id(chain[-1].parent_run_id)):
        chain.append(parent)
    retries = [r for r in chain if r.parent_run_id and r.tags.get(TAG_RETRY_OF) == r.parent_run_id]
    used = sum(1 for r in retries if r.tags.get(TAG_RETRY_STEP) == step_id)
    if used >= span["max_retries"]:
        return (f"step '{step_id}' failed after {used} retr{'y' if used == 1 else 'ies'} "
                f"(max_retries={span['max_retries']})")
    replayed = [node for node, _ in span["replay"]]
    attempt = len(retries) + 2
    reset = {"attempt": attempt, "step_id": step_id, "retry_from_step_id": span["retry_from_step_id"],
             "replayed": [s for _, s in span["replay"]], "at_utc": datetime.now(timezone.utc).isoformat(),
             "rolled_back_sandboxes": _rolled_back(io, chain, job_def, set(replayed)), "parent_run_id": run.run_id}
    tags = {
        **{k: v for k, v in run.tags.items() if k not in TAGS_TO_MAYBE_OMIT_ON_RETRY and not k.startswith("agentenv/")},
        **job_def.tags, TAG_RETRY_OF: run.run_id, TAG_RETRY_STEP: step_id, TAG_RETRY_FROM: span["retry_from_step_id"],
        TAG_RETRY_ATTEMPT: str(attempt),
        TAG_RETRY_RESETS: json.dumps([*json.loads(run.tags.get(TAG_RETRY_RESETS) or "[]"), reset])}
    return Retry(parent=run, step_keys=[node_step_key(job_def, n) for n in (*replayed, FINAL_STEP)], tags=tags,
                 reset=reset)


def create_retry_run(instance: dg.DagsterInstance, job_def: dg.JobDefinition, retry: Retry) -> dg.DagsterRun:
    """The child run, as ``ReexecutionOptions(parent, step_selection)`` makes it, announced on the parent."""
    child = create_reexecution(instance, job_def, retry.parent, retry.step_keys, retry.tags)
    reset = retry.reset
    instance.report_engine_event(
        f"agentenv: step '{reset['step_id']}' failed; retrying from '{reset['retry_from_step_id']}' "
        f"(attempt {reset['attempt']}) in run {child.run_id}: {', '.join(reset['replayed'])}", dagster_run=retry.parent)
    instance.add_run_tags(retry.parent.run_id, {TAG_RETRIED_BY: child.run_id})
    return child


def launch_retry(instance: dg.DagsterInstance, job_def: dg.JobDefinition, run: dg.DagsterRun, io: ContextIOManagerBase,
                 sensor_name: str, logger: logging.Logger) -> dg.DagsterRun | None:
    """The sensor's part: create the child run and queue it, tagged as the sensor's (run key: the failed run)."""
    outcome = plan_retry(instance, job_def, run, io)
    if not isinstance(outcome, Retry):
        if outcome:
            logger.info(f"run {run.run_id}: {outcome}")
        return None
    if run.remote_job_origin is None:
        logger.info(f"run {run.run_id} was not launched from a code location: retry it from the UI")
        return None
    if not isinstance(instance.run_coordinator, dg.QueuedRunCoordinator):
        logger.info(f"run {run.run_id}: the instance has no run queue to launch its retry: retry it from the UI")
        return None
    outcome = replace(outcome, tags={**outcome.tags, SENSOR_NAME_TAG: sensor_name, RUN_KEY_TAG: run.run_id})
    child = create_retry_run(instance, job_def, outcome)
    instance.submit_run(child.run_id, workspace=None)  # the queue's daemon launches it
    logger.info(f"run {run.run_id}: retrying in run {child.run_id}")
    return child


def retry_in_process(instance: dg.DagsterInstance, job_def: dg.JobDefinition, run_id: str,
                     io: ContextIOManagerBase) -> list[str]:
    """The CLI's part: while the run failed and may be retried, execute its child here; the children's ids."""
    children = []
    while True:
        run = instance.get_run_by_id(run_id)
        outcome = plan_retry(instance, job_def, run, io) if run.status == dg.DagsterRunStatus.FAILURE else None
        if not isinstance(outcome, Retry):
            if outcome:
                log.info(f"run {run_id}: {outcome}")
            return children
        child = create_retry_run(instance, job_def, outcome)
        execute_here(job_def, child, instance)
        run_id = child.run_id
        children.append(run_id)


def _rolled_back(io: ContextIOManagerBase, chain: list[dg.DagsterRun], job_def: dg.JobDefinition,
                 replayed: set[str]) -> dict[str, list[dict]]:
    """Deployments the failed attempt held that the outputs the child reuses do not."""
    failed = [TaskStepContext.from_dict(record["context"]) for name in io.stream_names(chain[0].run_id)
              for record in io.rows(chain[0].run_id, name).values()]
    reused = {node_step_key(job_def, n.name) for n in task_graph_of(job_def).nodes
              if n.name not in replayed and n.name != FINAL_STEP}
    nearest = {name: run.run_id for run in reversed(chain)  # each reused output's nearest run that stored it
               for name in io.stream_names(run.run_id) if name in reused}
    kept = [TaskStepContext.from_dict(record["context"]) for name, run_id in nearest.items()
            for record in io.rows(run_id, name).values()]
    return rolled_back_sandboxes(failed, kept)


# -- in the op ------------------------------------------------------------------------------

def self_retry_pending(context: dg.OpExecutionContext, step: TaskStep) -> bool:
    """The op's RetryPolicy will run this step again: what the run deployed must stay up."""
    config = step.retry_config
    return bool(config and config.retry_from_step_id == step.id and context.retry_number < config.max_retries)


def retries_carried(context: dg.OpExecutionContext, step: TaskStep,
                    io: ContextIOManagerBase) -> Callable[[str, TaskStepContext], None] | None:
    """What a retried attempt writes into each row's context before the step runs (None: no retry): the chain's
    resets and the failed attempt's fatal records (the parent run's, or a self-retry's own)."""
    resets = json.loads(context.run.tags.get(TAG_RETRY_RESETS) or "[]")
    parent = context.run.parent_run_id
    if not (resets and parent) and not context.retry_number:
        return None
    inherited = _contexts(io.stopped_rows(parent)) if resets and parent else {}
    own = _contexts(io.rows(context.run_id, f"{context.op_handle}{FAILED_ATTEMPT}")) if context.retry_number else {}
    retried = {r["step_id"] for r in resets}

    def carry(key: str, ctx: TaskStepContext) -> None:
        row_resets, records = list(resets), _fatal_records(inherited.get(key, []), retried)
        for failed in own.get(key, []):
            row_resets += [*failed.metadata.get("retry_resets", []), {
                "attempt": context.retry_number + 1, "step_id": step.id, "retry_from_step_id": step.id,
                "replayed": [step.id], "at_utc": datetime.now(timezone.utc).isoformat(),
                "rolled_back_sandboxes": rolled_back_sandboxes([failed], [ctx])}]
            records += _fatal_records([failed])
        if row_resets or records:
            record_retries(ctx, row_resets, records)

    return carry


def _contexts(rows: dict[str, dict[str, Any]]) -> dict[str, list[TaskStepContext]]:
    """Per row, the context of its stream record."""
    return {key: [TaskStepContext.from_dict(record["context"])] for key, record in rows.items()}


def _fatal_records(contexts: list[TaskStepContext], step_ids: set[str] | None = None) -> list[dict]:
    return [r for ctx in contexts for r in ctx.metadata.get("failed_steps", [])
            if r.get("is_fatal") and (step_ids is None or r.get("step_id") in step_ids)]
