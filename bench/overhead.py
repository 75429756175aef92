"""What a user waits for to run one task through Dagster, against the plain asyncio walker.

In one invocation, on a copy of this checkout's project (its tasks/, config, agents,
artifacts, ``definitions.py`` and ``workspace.yaml``; default task tasks/reply_to_dana.json,
7 steps + teardown, real env and agent servers), it times ``--repeat`` times each, taking
turns:

(a) **walker**: the asyncio walker (``agentenv_dagster.runner.run_plan``) in this process,
    the baseline: the same step code with no Dagster at all;
(b) **CLI**: ``agentenv-dagster run TASK`` as a subprocess, from its start to its exit (what
    a CLI user waits for: imports, the code location, the run, the reports);
(c) **UI**: a launch as the launchpad makes it: ``dagster-webserver -w workspace.yaml``
    (started once, before any timing, with the instance settings the project's
    ``.dagster_home`` gets, plus the ``DefaultRunCoordinator``, so no daemon is needed) is
    sent the job through ``DagsterGraphQLClient.submit_job_execution`` and polled until the
    run succeeds; the project's run launcher forks the run's worker from a warm process;
(c') **UI, Dagster's launcher**: the same, from a second webserver whose instance keeps
    Dagster's default run launcher (the code server spawns a new Python for the run);
(d) **UI whole**: the same launch from a second code location of the same tasks whose
    ``definitions.py`` is ``build_definitions(tasks/)``: its run worker builds every task's
    job, not just the one it runs (what ``build_repository``'s one-job build saves a run);
(e) **UI floor**: the same launch of a job of Dagster alone, from a third code location of
    that webserver: the task's graph (a node per step and the teardown, the same edges) of
    ops that do nothing, on the in-process executor. What any Dagster launch of that shape
    costs, so (c) - (e) - (a) is what agentenv_dagster adds.

Each run starts once every process the one before started (servers, a run worker) has
ended. It prints each median against the walker's, wall time and CPU seconds (of every process of
that way: this one, the CLI, the webserver and code servers, the run worker and the
servers each started; steadier than wall time on a busy machine), then where the time of (b)-(e) goes, from
the timestamps of each run's event log (medians): ``to launch`` (UI: submit to the run's
RUN_STARTING: the webserver asks the code server for the job and its plan, creates the run),
``to worker`` (RUN_STARTING to the run worker's "Started process for run": the worker's
process started, ``import dagster``, the instance), ``to RUN_START`` (the code location imported and the job
built, the execution plan), ``to 1st step`` (the executor and the resources), ``steps`` (first
step started to last step ended), ``to success`` and ``after`` (RUN_SUCCESS to the CLI's exit,
or to the poll that sees it). It also says which executor the task's job gets.

``--extra-tasks N`` adds N copies of the task (other ids) to the project's tasks/, as a
project of many tasks is: what building the code location costs a run then shows.

    python bench/overhead.py [--task tasks/reply_to_dana.json] [--repeat 3] [--extra-tasks 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
import httpx
from dagster_graphql import DagsterGraphQLClient

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    ROOT, copy_project, cpu_seconds, free_port, settle, start_group, steady_descendants, stop_group, wait_loaded)

from agentenv_dagster.compiler import load_plan  # noqa: E402
from agentenv_dagster.config import load_config  # noqa: E402
from agentenv_dagster.orchestration.execute import dagster_yaml  # noqa: E402
from agentenv_dagster.orchestration.executors import job_executor, runs_as_chain  # noqa: E402
from agentenv_dagster.orchestration.translator import TaskTranslator  # noqa: E402
from agentenv_dagster.runner import run_plan  # noqa: E402

# The launchpad's instance with no daemon: runs go straight to the run launcher.
NO_QUEUE = """run_coordinator:
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
"""
DAGSTER_LAUNCHER = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"  # Dagster's default run launcher
TASKS_LOCATION = "agentenv_tasks"  # as workspace.yaml names it
WHOLE_LOCATION = "agentenv_whole"
WHOLE_DEFINITIONS = """from pathlib import Path

from agentenv_dagster import build_definitions

defs = build_definitions(Path(__file__).parent / "tasks")
"""
FLOOR_LOCATION = "dagster_floor"
FLOOR_JOB = "floor"
FLOOR_DEFINITIONS = """import dagster as dg

EDGES = {edges!r}


@dg.op(ins={{"after": dg.In(dg.Nothing)}})
def step() -> None:
    pass


floor = dg.GraphDefinition(name="floor", node_defs=[step], dependencies={{
    dg.NodeInvocation("step", alias=node): {{"after": dg.MultiDependencyDefinition(
        [dg.DependencyDefinition(d) for d in upstream])}} if upstream else {{}}
    for node, upstream in EDGES.items()}}).to_job(executor_def=dg.in_process_executor)
defs = dg.Definitions(jobs=[floor])
"""
DAGSTER_UI = "UI, Dagster's launcher"
PHASES = ("to launch", "to worker", "to RUN_START", "to 1st step", "steps", "to success", "after")
STEP_END = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)


def time_walker(plan, config) -> float:
    started = time.perf_counter()
    asyncio.run(run_plan(plan, config))
    return time.perf_counter() - started


def phases(instance: dg.DagsterInstance, run_id: str, started: float, ended: float) -> dict[str, float]:
    """Where a run's time went, from its event log's timestamps (``started`` and ``ended``:
    wall clock when it was asked for and when its end was seen). A CLI run has no run
    worker: its ``to launch`` and ``to worker`` are zero and its start up to RUN_START is
    ``to RUN_START``."""
    records = instance.all_logs(run_id)
    first: dict[dg.DagsterEventType, float] = {}
    for record in records:
        if record.dagster_event is not None:
            first.setdefault(record.dagster_event.event_type, record.timestamp)
    worker = next((r.timestamp for r in records if r.dagster_event and r.dagster_event.event_type
                   == dg.DagsterEventType.ENGINE_EVENT and "Started process for run" in r.message), started)
    steps_ended = max(r.timestamp for r in records if r.dagster_event and r.dagster_event.event_type in STEP_END)
    launch = first.get(dg.DagsterEventType.RUN_STARTING, started)
    run_start = first[dg.DagsterEventType.RUN_START]
    step_start = first[dg.DagsterEventType.STEP_START]
    success = first[dg.DagsterEventType.RUN_SUCCESS]
    return dict(zip(PHASES, (launch - started, worker - launch, run_start - worker, step_start - run_start,
                             steps_ended - step_start, success - steps_ended, ended - success)))


def time_cli(project: Path, task: Path, home: Path, instance: dg.DagsterInstance) -> tuple[float, dict]:
    command = [shutil.which("agentenv-dagster") or "agentenv-dagster", "run", str(task),
               "--output-dir", str(project / "out")]
    started_at = time.time()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, env={**os.environ, "DAGSTER_HOME": str(home)},
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    (run,) = instance.get_runs(limit=1)
    return elapsed, phases(instance, run.run_id, started_at, started_at + elapsed)


def add_location(project: Path, name: str, source: str) -> None:
    """``<name>.py`` holding ``source``, a code location of the project's workspace."""
    (project / f"{name}.py").write_text(source)
    with open(project / "workspace.yaml", "a") as workspace:
        workspace.write(f"  - python_file:\n      relative_path: {name}.py\n      working_directory: .\n"
                        f"      location_name: {name}\n")


def floor_definitions(plan) -> str:
    """A location of one job: the task's graph of ops that do nothing."""
    node = TaskTranslator().get_node_name
    edges = {node(step): [node(plan.step_by_id[d]) for d in plan.edges[step.id]] for step in plan.steps}
    edges["teardown_run"] = [node(plan.step_by_id[s]) for s in plan.sinks]
    return FLOOR_DEFINITIONS.format(edges=edges)


def serve_ui(project: Path, home: Path, log: Path, started: list) -> tuple[tuple, dg.DagsterInstance]:
    """A ``dagster-webserver`` of the project's workspace on ``home``'s instance, once its
    locations are loaded (added to ``started``): (its client, its locations by name), the instance."""
    port = free_port()
    webserver = start_group([shutil.which("dagster-webserver") or "dagster-webserver", "-w", "workspace.yaml",
                             "-h", "127.0.0.1", "-p", str(port)], project, {"DAGSTER_HOME": str(home)}, log)
    started.append(webserver)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as http:
        locations = {location["name"]: location for location in wait_loaded(http, webserver, timeout=300)}
    return (DagsterGraphQLClient("127.0.0.1", port_number=port), locations), dg.DagsterInstance.from_config(str(home))


def time_ui(client: DagsterGraphQLClient, locations: dict, location_name: str, job: str,
            instance: dg.DagsterInstance) -> tuple[float, dict]:
    location = locations[location_name]
    (repository,) = location["repositories"]
    started_at = time.time()
    started = time.perf_counter()
    run_id = client.submit_job_execution(job, repository_location_name=location["name"],
                                         repository_name=repository["name"])
    while (status := client.get_run_status(run_id)) not in (
            dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED):
        time.sleep(0.05)
    elapsed = time.perf_counter() - started
    if status != dg.DagsterRunStatus.SUCCESS:
        errors = [r.message for r in instance.all_logs(run_id) if r.level >= 40]
        sys.exit(f"run {run_id} of {job}: {status.value}\n" + "\n".join(errors)[-3000:])
    return elapsed, phases(instance, run_id, started_at, started_at + elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", type=Path, default=ROOT / "tasks" / "reply_to_dana.json")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--extra-tasks", type=int, default=0, help="copies of the task added to tasks/")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="agentenv-overhead-") as tmp:
        project = Path(tmp) / "project"
        tasks_dir = copy_project(project)
        task = tasks_dir / args.task.name
        if not task.exists():
            shutil.copy(args.task, task)
        config = load_config(project)
        plan = load_plan(task, config)
        if args.extra_tasks and task.suffix != ".json":
            sys.exit("--extra-tasks copies an agent-env (JSON) task")
        document = json.loads(task.read_text()) if args.extra_tasks else []
        steps = document["steps"] if isinstance(document, dict) else document
        for i in range(args.extra_tasks):
            copy = {"id": f"copy_{i:05d}", "type": "task", "version": 1, "steps": steps}
            (tasks_dir / f"copy_{i:05d}.json").write_text(json.dumps(copy))
        task_files = len(list(tasks_dir.iterdir()))
        job = TaskTranslator().get_job_name(plan)
        add_location(project, WHOLE_LOCATION, WHOLE_DEFINITIONS)
        add_location(project, FLOOR_LOCATION, floor_definitions(plan))
        settings = {"cli": dagster_yaml(Path(tmp) / "home_cli"), "ui": dagster_yaml(Path(tmp) / "home_ui") + NO_QUEUE,
                    "ui_dagster": DAGSTER_LAUNCHER + NO_QUEUE}
        homes = {name: Path(tmp) / f"home_{name}" for name in settings}
        for name, home in homes.items():
            home.mkdir()
            (home / "dagster.yaml").write_text(settings[name])
        webservers = []
        try:
            ui, ui_instance = serve_ui(project, homes["ui"], Path(tmp) / "webserver.log", webservers)
            ui_dagster, ui_dagster_instance = serve_ui(project, homes["ui_dagster"], Path(tmp) / "webserver2.log",
                                                       webservers)
            with dg.DagsterInstance.from_config(str(homes["cli"])) as cli_instance, ui_instance, ui_dagster_instance:
                ways = {
                    "walker": lambda: (time_walker(plan, config), None),
                    "CLI": lambda: time_cli(project, task, homes["cli"], cli_instance),
                    "UI": lambda: time_ui(*ui, TASKS_LOCATION, job, ui_instance),
                    "UI whole": lambda: time_ui(*ui, WHOLE_LOCATION, job, ui_instance),
                    "UI floor": lambda: time_ui(*ui, FLOOR_LOCATION, FLOOR_JOB, ui_instance),
                    DAGSTER_UI: lambda: time_ui(*ui_dagster, TASKS_LOCATION, job, ui_dagster_instance),
                    "UI floor, Dagster's launcher": lambda: time_ui(*ui_dagster, FLOOR_LOCATION, FLOOR_JOB,
                                                                    ui_dagster_instance),
                }
                # warm: bytecode, the first server starts, the run launcher's warm process
                first = {name: way()[0] for name, way in ways.items()}
                baseline = steady_descendants()  # the webserver, its code servers and their helpers
                runs: dict[str, list[tuple[float, float, dict | None]]] = {name: [] for name in ways}
                for _ in range(args.repeat):
                    for name, way in ways.items():
                        cpu = sum(os.times()[:4]) + cpu_seconds(baseline)
                        wall, phases_of_run = way()
                        settle(baseline)  # each starts with nothing of the one before still ending
                        cpu = sum(os.times()[:4]) + cpu_seconds(baseline) - cpu
                        runs[name].append((wall, cpu, phases_of_run))
        except Exception:
            for log in ("webserver.log", "webserver2.log"):
                if (Path(tmp) / log).exists():
                    print((Path(tmp) / log).read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            for webserver in webservers:
                stop_group(webserver)
    load_after = os.getloadavg()
    executor = job_executor(config, plan).name
    print(f"task {plan.task_id}: {len(plan.steps)} steps + teardown, in a location of "
          f"{task_files} task files, "
          f"{'a chain' if runs_as_chain(plan) else 'not a chain'}: executor '{executor}'; "
          f"median of {args.repeat} runs; python {sys.version.split()[0]}, {os.cpu_count()} cpus; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    walker = statistics.median(wall for wall, _, _ in runs["walker"])
    walker_cpu = statistics.median(cpu for _, cpu, _ in runs["walker"])
    print(f"{'way':<30}{'wall s':>8}{'ratio':>7}{'overhead/step s':>17}{'CPU s':>8}{'ratio':>7}")
    for name, results in runs.items():
        wall = statistics.median(wall for wall, _, _ in results)
        cpu = statistics.median(cpu for _, cpu, _ in results)
        ratio = f"{wall / walker:>7.2f}{(wall - walker) / len(plan.steps):>17.3f}" if "floor" not in name else " " * 24
        print(f"{name:<30}{wall:>8.2f}{ratio}{cpu:>8.2f}{cpu / walker_cpu:>7.2f}")
    print(f"the first UI launch after the webserver started (the warm process starting too): {first['UI']:.2f} s, "
          f"with Dagster's launcher {first[DAGSTER_UI]:.2f} s")
    print("where the time goes (s, medians):")
    print(f"{'way':<30}" + "".join(f"{phase:>13}" for phase in PHASES))
    for name in runs:
        if name != "walker":
            medians = [statistics.median(p[phase] for _, _, p in runs[name]) for phase in PHASES]
            print(f"{name:<30}" + "".join(f"{m:>13.2f}" for m in medians))


if __name__ == "__main__":
    main()
