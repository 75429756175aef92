"""The one module that uses Dagster's private API, each use with why no public one does.

Everything else in the package imports ``dagster`` (public names) only. When Dagster changes
one of these, this file is where the port happens; the tests of the executor, the step
events and the retries cover each name.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Callable, Iterator

import dagster as dg

# A concurrent in-process executor: Dagster ships an in-process executor that runs one step at
# a time and a multiprocess one that starts a process per step (~0.5-2 s before a step starts);
# running a job's streamed ops side by side in one process needs the plan-execution loop both
# are built from, which is not public.
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.compute_logs import create_compute_log_file_key
from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import dagster_event_sequence_for_step
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig

# A partition's check evaluation names the materialization it judged (else Dagster does not
# count it as that materialization's check); a run over a range of partitions cannot use
# ``AssetCheckResult``, which resolves only the step's own single partition.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (  # noqa: F401 - re-exported
    AssetCheckEvaluationPlanned,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.events import AssetMaterializationPlannedData, DagsterEventType  # noqa: F401 - re-exported


@dataclass(frozen=True)
class _StepEnded:
    key: str


class ThreadedExecutor(dg.Executor):
    """Runs each step of a run in a thread of the run's process, every step as soon as the
    outputs it reads exist (``require_upstream_step_success: false``): streamed ops
    (``streams.py``) then run side by side, each row going on as soon as its own upstream
    steps are done. ``in_step_thread`` runs first in each step's thread."""

    def __init__(self, retries: RetryMode, in_step_thread: Callable[[], None],
                 on_interrupt: Callable[[str], None]) -> None:
        self._retries = retries
        self._in_step_thread = in_step_thread
        self._on_interrupt = on_interrupt

    @property
    def retries(self) -> RetryMode:
        return self._retries

    @property
    def step_dependency_config(self) -> StepDependencyConfig:
        return StepDependencyConfig(require_upstream_step_success=False)

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        yield DagsterEvent.engine_event(
            plan_context, f"Executing steps side by side in threads of process {os.getpid()}",
            event_specific_data=EngineEventData.in_process(os.getpid(), execution_plan.step_keys_to_execute),
        )
        yield from iter(ExecuteRunWithPlanIterable(
            execution_plan=plan_context.execution_plan,
            iterator=self._steps_in_threads,
            execution_context_manager=PlanExecutionContextManager(
                job=plan_context.job, retry_mode=plan_context.retry_mode,
                execution_plan=plan_context.execution_plan, run_config=plan_context.run_config,
                dagster_run=plan_context.dagster_run, instance=plan_context.instance,
                raise_on_error=plan_context.raise_on_error, output_capture=plan_context.output_capture,
                step_dependency_config=self.step_dependency_config,
            ),
        ))

    def _steps_in_threads(self, job_context: PlanExecutionContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        """In-process execution (``inner_plan_execution_iterator``), each step in a thread."""
        events: queue.Queue[DagsterEvent | _StepEnded] = queue.Queue()
        running: dict[str, threading.Thread] = {}
        manager = job_context.instance.compute_log_manager
        step_keys = [step.key for step in execution_plan.get_steps_to_execute_in_topo_order()]
        with InstanceConcurrencyContext(job_context.instance, job_context.dagster_run) as concurrency, \
                execution_plan.start(retry_mode=job_context.retry_mode, instance_concurrency_context=concurrency,
                                     step_dependency_config=job_context.step_dependency_config) as active, \
                ExitStack() as capture:
            log_key = manager.build_log_key_for_run(job_context.run_id, create_compute_log_file_key())
            try:
                log_context = capture.enter_context(manager.capture_logs(log_key))
                yield DagsterEvent.capture_logs(job_context, step_keys, log_key, log_context)
            except Exception:  # the run goes on without its logs captured, as in-process does
                yield DagsterEvent.engine_event(job_context, "Exception while setting up compute log capture",
                                                EngineEventData(error=None))
            interrupted = False
            while not active.is_complete:
                if not interrupted and active.check_for_interrupts():
                    interrupted = True
                    active.mark_interrupted()
                    self._on_interrupt(job_context.run_id)
                    yield DagsterEvent.engine_event(job_context, "Interrupted: the running steps are stopping",
                                                    EngineEventData.interrupted(list(running)))
                if not interrupted:
                    for step in active.get_steps_to_execute():
                        step_context = job_context.for_step(step, active.get_known_state())
                        thread = threading.Thread(target=self._run_step, args=(step_context, events),
                                                  name=f"step {step.key}", daemon=True)
                        running[step.key] = thread
                        thread.start()
                yield from active.concurrency_event_iterator(job_context)
                if not running:
                    if interrupted:
                        break
                    active.sleep_til_ready()
                    continue
                try:
                    item = events.get(timeout=0.1)
                except queue.Empty:
                    continue
                while True:
                    if isinstance(item, _StepEnded):
                        running.pop(item.key).join()
                        active.verify_complete(job_context, item.key)
                        yield from active.plan_events_iterator(job_context)
                    else:
                        yield item
                        active.handle_event(item)
                    try:
                        item = events.get_nowait()
                    except queue.Empty:
                        break
            capture.close()

    def _run_step(self, step_context, events: queue.Queue) -> None:
        try:
            self._in_step_thread()
            for event in dagster_event_sequence_for_step(step_context):
                events.put(event)
        except BaseException:  # noqa: BLE001 - the step's own errors become its failure event
            print(f"step {step_context.step.key} ended abnormally", sys.exc_info()[1], file=sys.stderr)
        finally:
            events.put(_StepEnded(step_context.step.key))


# Executing a run in this process with the job's own executor: ``execute_in_process`` always
# swaps in Dagster's one-step-at-a-time executor, and ``execute_job`` needs a job another
# process could import again; a job built here from a task file is neither.
from dagster._core.definitions.job_base import InMemoryJob  # noqa: E402
from dagster._core.execution.api import create_execution_plan, execute_run  # noqa: E402


def run_here(job_def: dg.JobDefinition, instance: dg.DagsterInstance, run_config: dict, tags: dict[str, str]) -> str:
    """Create a run of ``job_def`` and execute it in this process with the job's executor; its id."""
    plan = create_execution_plan(job_def, run_config, tags=tags)
    run = instance.create_run_for_job(job_def=job_def, execution_plan=plan, run_config=run_config,
                                      tags={**job_def.run_tags, **tags})
    execute_run(InMemoryJob(job_def), run, instance)
    return run.run_id
