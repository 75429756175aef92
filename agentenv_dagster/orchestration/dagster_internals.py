"""The one module that uses Dagster's private API, each use with why no public one does.

Everything else (package, tests, benchmarks) imports public ``dagster`` names only, as
``tests/orchestration/test_dagster_internals.py`` checks: a Dagster change is ported here.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from contextlib import AbstractContextManager, ExitStack, suppress
from dataclasses import dataclass
from typing import Callable, Iterator

import dagster as dg
from dagster import DagsterEvent

# A concurrent in-process executor: Dagster ships an in-process executor that runs one step at a time and a
# multiprocess one that starts a process per step; running a job's streamed ops side by side in one process
# needs the plan-execution loop both are built from, which is not public.
from dagster._core.events import EngineEventData
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.compute_logs import create_compute_log_file_key
from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.plan.execute_plan import dagster_event_sequence_for_step
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode
from dagster._core.execution.step_dependency_config import StepDependencyConfig


STOP_GRACE_SECONDS = 30  # how long an interrupted run waits for its steps to stop


class ThreadedExecutor(dg.Executor):
    """Runs each step in a thread of the run's process as soon as the outputs it reads exist
    (``require_upstream_step_success: false``), so streamed ops (``streams.py``) run side by
    side. ``in_step_thread`` runs first in each step's thread."""

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
            event_specific_data=EngineEventData.in_process(os.getpid(), execution_plan.step_keys_to_execute))
        yield from iter(ExecuteRunWithPlanIterable(
            execution_plan=plan_context.execution_plan,
            iterator=self._steps_in_threads,
            execution_context_manager=PlanExecutionContextManager(
                job=plan_context.job, retry_mode=plan_context.retry_mode,
                execution_plan=plan_context.execution_plan, run_config=plan_context.run_config,
                dagster_run=plan_context.dagster_run, instance=plan_context.instance,
                raise_on_error=plan_context.raise_on_error, output_capture=plan_context.output_capture,
                step_dependency_config=self.step_dependency_config)))

    def _steps_in_threads(self, job_context: PlanExecutionContext,
                          execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        """In-process execution (``inner_plan_execution_iterator``), each step in a thread."""
        events: queue.Queue[DagsterEvent | str] = queue.Queue()  # a step key: that step's thread ended
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
            interrupted = None  # when the run was interrupted
            while not active.is_complete:
                if interrupted is None and active.check_for_interrupts():
                    interrupted = time.monotonic()
                    active.mark_interrupted()
                    self._on_interrupt(job_context.run_id)
                    yield DagsterEvent.engine_event(job_context, "Interrupted: the running steps are stopping",
                                                    EngineEventData.interrupted(list(running)))
                elif interrupted is not None and time.monotonic() > interrupted + STOP_GRACE_SECONDS:
                    yield DagsterEvent.engine_event(  # their threads end with the process; so do the servers
                        job_context, f"Steps still running {STOP_GRACE_SECONDS} s after the interrupt end with "
                        f"the run: {', '.join(sorted(running))}", EngineEventData.interrupted(list(running)))
                    break
                if interrupted is None:
                    for step in active.get_steps_to_execute():
                        step_context = job_context.for_step(step, active.get_known_state())
                        running[step.key] = thread = threading.Thread(
                            target=self._run_step, args=(step_context, events), name=f"step {step.key}", daemon=True)
                        thread.start()
                yield from active.concurrency_event_iterator(job_context)
                if not running:
                    if interrupted is not None:
                        break
                    active.sleep_til_ready()
                    continue
                with suppress(queue.Empty):  # the next event, then any others already there
                    item = events.get(timeout=0.1)
                    while True:
                        if isinstance(item, str):
                            running.pop(item).join()
                            active.verify_complete(job_context, item)
                            yield from active.plan_events_iterator(job_context)
                        else:
                            yield item
                            active.handle_event(item)
                        item = events.get_nowait()

    def _run_step(self, step_context, events: queue.Queue) -> None:
        try:
            self._in_step_thread()
            for event in dagster_event_sequence_for_step(step_context):
                events.put(event)
        except BaseException:  # noqa: BLE001 - the step's own errors become its failure event
            print(f"step {step_context.step.key} ended abnormally", sys.exc_info()[1], file=sys.stderr)
        finally:
            events.put(step_context.step.key)


# Executing a run in this process with the job's own executor: ``execute_in_process`` always swaps in Dagster's
# one-step-at-a-time executor, and ``execute_job`` needs a job another process could import again; a job built
# here from a task file is neither. And a run of the code location's job carries the location's origin, as a
# launch from the UI does, so the UI lists it under its job and can re-execute it: Dagster makes those origins
# from a workspace file only inside its workspace loading, which starts a code server.
from dagster._core.definitions.job_base import InMemoryJob  # noqa: E402
from dagster._core.definitions.reconstruct import ReconstructableRepository  # noqa: E402
from dagster._core.execution.api import create_execution_plan, execute_run  # noqa: E402
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin  # noqa: E402
from dagster._core.workspace.load import location_origins_from_yaml_paths  # noqa: E402


@dataclass(frozen=True)
class LocationJob:
    """A job of a code location, loaded in this process, with the origins a run of it carries."""

    job_def: dg.JobDefinition
    repository: ReconstructableRepository
    remote_origin: RemoteJobOrigin


def location_job(workspace: str, job_name: str) -> LocationJob | None:
    """The job ``job_name`` of the workspace file's code locations, loaded here as a code server loads them."""
    from dagster._grpc.utils import get_loadable_targets  # the code server's autodiscovery (imports its gRPC)

    for origin in location_origins_from_yaml_paths([workspace]):
        target = getattr(origin, "loadable_target_origin", None)
        if target is None or not (target.python_file or target.module_name):
            continue  # a gRPC server of its own: not loadable here
        for loadable in get_loadable_targets(
                python_file=target.python_file, module_name=target.module_name, package_name=None,
                autoload_defs_module_name=None, working_directory=target.working_directory,
                attribute=target.attribute, resolve_lazy_defs=False):
            load = ReconstructableRepository.for_file if target.python_file else ReconstructableRepository.for_module
            repository = load(target.python_file or target.module_name, loadable.attribute, target.working_directory)
            definition = repository.get_definition()
            if definition.has_job(job_name):
                origins = RemoteRepositoryOrigin(code_location_origin=origin, repository_name=definition.name)
                return LocationJob(definition.get_job(job_name), repository, RemoteJobOrigin(origins, job_name))
    return None


def run_here(job_def: dg.JobDefinition, instance: dg.DagsterInstance, run_config: dict, tags: dict[str, str],
             location: LocationJob | None = None, run_id: str | None = None) -> str:
    """Create a run of ``job_def`` (``location``'s job, with its origins, when given) and execute it
    in this process with the job's executor; its id."""
    plan = create_execution_plan(job_def, run_config, tags=tags)
    origins = {} if location is None else {
        "remote_job_origin": location.remote_origin,
        "job_code_origin": location.repository.get_reconstructable_job(job_def.name).get_python_origin()}
    run = instance.create_run_for_job(job_def=job_def, execution_plan=plan, run_config=run_config, run_id=run_id,
                                      tags={**job_def.run_tags, **tags}, **origins)
    execute_here(job_def, run, instance)
    return run.run_id


def execute_here(job_def: dg.JobDefinition, run: dg.DagsterRun, instance: dg.DagsterInstance) -> None:
    """Execute the created ``run`` of ``job_def`` in this process, with the job's executor."""
    execute_run(InMemoryJob(job_def), run, instance)


# A partition's check evaluation names the materialization it judged (else Dagster does not count it as that
# materialization's check); a run over a range of partitions cannot use ``AssetCheckResult``, which resolves
# only the step's own single partition.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (  # noqa: E402
    AssetCheckEvaluationTargetMaterializationData,
)


def evaluation_target(record: dg.EventLogRecord) -> AssetCheckEvaluationTargetMaterializationData:
    """What a check evaluation of a partition names as the materialization it judged."""
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp)


# The rows a step stopped will never reach the assets after it: reported as planned materializations (and planned check
# evaluations), which open source storage then shows as failed partitions, the way it shows a step that failed before
# materializing. Dagster's run planning reports those events; no public API reports them from a running op.
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationPlanned  # noqa: E402
from dagster._core.events import AssetMaterializationPlannedData  # noqa: E402


def report_planned(context: dg.OpExecutionContext, assets: list[tuple[dg.AssetKey, list[str]]],
                   rows: list[str | None], partitions: dg.PartitionsDefinition | None) -> None:
    """Report ``rows`` (None: the whole asset) of each of ``assets`` as planned materializations and
    their checks as planned evaluations, leaving out those the run's planning reported already (the
    storage holds one planned evaluation of a partition a run)."""
    step_key = str(context.op_handle)
    planned = _planned_checks(context) if any(checks for _, checks in assets) else {}
    events = []
    for asset_key, checks in assets:
        events += [DagsterEvent.build_asset_materialization_planned_event(
            context.job_name, step_key, AssetMaterializationPlannedData(asset_key, partition=row)) for row in rows]
        for check in checks:
            already = planned.get((asset_key, check), set())
            left = [] if already is None else [row for row in rows if row not in already]
            if not left:
                continue
            subset = partitions.subset_with_partition_keys(left) if partitions is not None else None
            events.append(DagsterEvent(
                event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED.value, job_name=context.job_name,
                message=f"{context.job_name} intends to execute asset check {check} on asset {asset_key.to_string()}",
                event_specific_data=AssetCheckEvaluationPlanned(asset_key=asset_key, check_name=check,
                                                                partitions_subset=subset),
                step_key=step_key))
    for event in events:
        context.instance.report_dagster_event(event, run_id=context.run_id, log_level=logging.DEBUG)


def _planned_checks(context: dg.OpExecutionContext) -> dict[tuple[dg.AssetKey, str], set[str | None] | None]:
    """The partitions of each check the run has planned so far (None: the whole asset)."""
    planned: dict[tuple[dg.AssetKey, str], set[str | None] | None] = {}
    for record in context.instance.get_records_for_run(
            context.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED).records:
        data = record.event_log_entry.dagster_event.event_specific_data
        key = (data.asset_key, data.check_name)
        if data.partitions_subset is None:
            planned[key] = None
        elif planned.get(key, set()) is not None:
            planned.setdefault(key, set()).update(data.partitions_subset.get_partition_keys())
    return planned


# A retry_config retry is a re-execution of the failed run's span, created by the run-failure sensor and handed to the
# run queue, or executed by the CLI in its process. Dagster's public re-execution (``ReexecutionOptions`` with
# ``execute_job``) executes at once and needs a job another process can import again, and
# ``instance.create_reexecuted_run`` needs a code location loaded from a workspace. The tags a child run drops from its
# parent's, and those naming the sensor that launched a run (the UI reads them), are Dagster's storage constants.
from dagster._core.execution.plan.state import KnownExecutionState  # noqa: E402
from dagster._core.storage.tags import RUN_KEY_TAG, SENSOR_NAME_TAG, TAGS_TO_MAYBE_OMIT_ON_RETRY  # noqa: E402, F401


def create_reexecution(instance: dg.DagsterInstance, job_def: dg.JobDefinition, parent: dg.DagsterRun,
                       step_keys: list[str], tags: dict[str, str]) -> dg.DagsterRun:
    """A child run of ``parent`` that executes ``step_keys`` and reads every other step's outputs from the
    parent chain, as ``ReexecutionOptions(parent, step_selection)`` makes it."""
    plan = create_execution_plan(job_def, parent.run_config, step_keys_to_execute=step_keys, tags=tags, known_state=(
        KnownExecutionState.build_for_reexecution(instance, parent).update_for_step_selection(step_keys)))
    return instance.create_run_for_job(
        job_def=job_def, execution_plan=plan, run_config=parent.run_config, tags=tags,
        root_run_id=parent.root_run_id or parent.run_id, parent_run_id=parent.run_id,
        remote_job_origin=parent.remote_job_origin, job_code_origin=parent.job_code_origin)


# What a code server sends the webserver and the daemon for a repository: its snapshot, then each job's, each
# under gRPC's message limit (the tests and bench/load.py watch their size). Dagster builds and serializes them
# only inside its code server. (Imported when asked: a run worker never needs them.)

def repository_snapshot_bytes(repo: dg.RepositoryDefinition) -> int:
    """The size of the repository's snapshot, its jobs' deferred, as a code server sends it."""
    from dagster._core.remote_representation.external_data import RepositorySnap

    return len(dg.serialize_value(RepositorySnap.from_def(repo, defer_snapshots=True)))


def job_snapshot_bytes(job_def: dg.JobDefinition) -> int:
    """The size of a job's snapshot, as a code server sends it."""
    from dagster._core.remote_representation.external_data import JobDataSnap

    return len(dg.serialize_value(JobDataSnap.from_job_def(job_def, include_parent_snapshot=True)))


def grpc_message_limit() -> int:
    """The largest message a code server sends or receives."""
    from dagster._grpc.utils import max_rx_bytes, max_send_bytes

    return min(max_rx_bytes(), max_send_bytes())


# For the tests: a code location loaded in the test's own process, and a run launcher that executes a launched
# run there, so a test drives the run queue as the daemon does without a code server; Dagster ships both with
# its test utilities only.
IN_PROCESS_RUN_LAUNCHER = {"module": "dagster._core.launcher.sync_in_memory_run_launcher",
                           "class": "SyncInMemoryRunLauncher"}


def workspace_in_this_process(instance: dg.DagsterInstance, python_file: str, attribute: str,
                              working_directory: str) -> AbstractContextManager:
    """A workspace of the one code location ``attribute`` of ``python_file``, loaded here (a context manager)."""
    from dagster._core.test_utils import in_process_test_workspace
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    origin = LoadableTargetOrigin(executable_path=sys.executable, python_file=python_file, attribute=attribute,
                                  working_directory=working_directory)
    return in_process_test_workspace(instance, origin)


# Staleness. Dagster stamps the provenance of an asset (code version, the data version of each input, its own
# data version) on materializations of the outputs it stores, with tags whose names are not public; the ops log
# each row's materialization themselves, so they stamp it with the same tags (``provenance.py``). Reading
# staleness back goes through the resolver the UI's GraphQL ``staleStatus`` uses: no public API answers it,
# short of a sensor's ``RunRequest(stale_assets_only=True)``, which skips partitioned assets.
from dagster._core.definitions.data_version import (  # noqa: E402, F401 - re-exported
    CODE_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG, NULL_EVENT_POINTER,
    CachingStaleStatusResolver, StaleStatus, get_input_data_version_tag, get_input_event_pointer_tag,
)
from dagster._core.definitions.data_version import DEFAULT_DATA_VERSION as _DEFAULT_DATA_VERSION  # noqa: E402
# The resolver caches its reads in a loading context; Dagster's plain one outside a workspace is named for tests.
from dagster._core.loader import LoadingContextForTest  # noqa: E402

DEFAULT_DATA_VERSION = _DEFAULT_DATA_VERSION.value  # what Dagster assumes of an input it has no version of
MISSING, FRESH = StaleStatus.MISSING.value, StaleStatus.FRESH.value


class StaleStatuses:
    """Assets' stale status (``STALE``, ``MISSING``, ``FRESH``) and causes, as the UI shows them."""

    def __init__(self, instance: dg.DagsterInstance, asset_graph) -> None:
        self._resolver = CachingStaleStatusResolver(instance, asset_graph, LoadingContextForTest(instance))

    def status(self, key: dg.AssetKey, partition: str | None = None) -> str:
        return self._resolver.get_status(key, partition).value

    def causes(self, key: dg.AssetKey, partition: str | None = None) -> list[str]:
        return [cause.reason for cause in self._resolver.get_stale_root_causes(key, partition)]


# A run's check evaluations, for the CLI's summary of what regressed: the instance has no public reader of a
# run's events (``ExecuteInProcessResult`` has them for its own run only).
def run_check_evaluations(instance: dg.DagsterInstance, run_id: str) -> list[dg.AssetCheckEvaluation]:
    return [entry.dagster_event.event_specific_data
            for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
            if entry.dagster_event is not None]


# A run launcher that forks each run's worker from a warm process (orchestration/run_launcher.py): Dagster's
# ``RunLauncher`` base and ``ConfigurableClass`` (how dagster.yaml names a launcher) are not exported, and what
# a run worker does (``dagster api execute_run``: the run's engine events, its execution, its exit code) is the
# body of Dagster's internal CLI command.
from dagster._core.launcher import LaunchRunContext, RunLauncher  # noqa: E402, F401 - re-exported
from dagster._core.instance import InstanceRef  # noqa: E402, F401 - re-exported
from dagster._serdes import ConfigurableClass, ConfigurableClassData  # noqa: E402, F401 - re-exported

RUN_WORKER_MODULES = ("dagster", "dagster._cli.api", "dagster._utils.interrupts")  # what a run worker imports


def execute_launched_run(run_id: str, instance: dg.DagsterInstance) -> int:
    """Execute the launched run here as ``dagster api execute_run`` does; the worker's exit code."""
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.interrupts import capture_interrupts

    with capture_interrupts():
        return _execute_run_command_body(run_id, instance, lambda _event: None, set_exit_code_on_failure=False)
