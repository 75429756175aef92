"""A dataset run by the CLI and backfilled through the instance, on one project, in one invocation.

The realistic dataset of ``bench/realistic.py`` (each row's agent at its own heavy-tailed
latency, each row graded by a test command) in a project whose code location has the task
(``definitions.py``, ``workspace.yaml``), with ``dagster dev`` (webserver and daemon) started
on it before anything is timed:

(a) ``agentenv-dagster run realistic.yaml --rows-in-flight N``: one run of the location's job,
    in the CLI's own process;
(b) a backfill of every row, submitted as the UI's *Launch backfill* sends it (GraphQL
    ``launchPartitionBackfill``) — ``--via asset``: from the asset graph, an asset backfill of
    the task's assets, all partitions, which Dagster runs as its implicit asset job; ``--via
    job``: from the job's page, the job's partition set — and timed from submit until the
    backfill is completed. The daemon creates one run for every row (the single-run backfill
    policy), the run queue launches it, the run worker executes it.

Both land in the project's instance. It prints both wall times and their ratio (the target:
at most 1.5), the busy CPU seconds of the machine during each, the most rows that held their
sandbox and agent at once in each run (from each row's step timings: from its first step to
its teardown; the bound is ``max_sandboxes``, by default twice ``--in-flight``), and where the
backfill's time went: submit -> run created (the backfill daemon's next iteration), created
-> launched (the run queue's next dequeue), launched -> started (the run worker's start), the
run itself, run end -> backfill completed (the daemon's next iteration again). Dagster's
backfill daemon iterates every 30 s (a constant of Dagster's, not a ``dagster.yaml`` setting),
so a backfill waits 0-30 s for its run and 0-30 s after it; the run queue dequeues every
``run_queue: dequeue_interval_seconds`` (Dagster's default 5; ``--dequeue-interval`` sets it in
the instance's ``dagster.yaml``). Needs ``pip install -e '.[bench]'``.

    python bench/backfill.py [--rows 240] [--in-flight 32] [--grade 0.5] [--via asset|job] [--dequeue-interval S]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import dagster as dg
import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import busy_cpu_seconds, list_schedule, timed  # noqa: E402
from realistic import agentenv_project, latencies  # noqa: E402

from agentenv_dagster.orchestration.execute import dagster_yaml  # noqa: E402
from agentenv_dagster.orchestration.io_manager import final_contexts  # noqa: E402
from agentenv_dagster.runtime.processes import terminate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
JOB, LOCATION = "realistic", {"repositoryLocationName": "agentenv_tasks", "repositoryName": "__repository__"}
ASSETS = [{"path": ["verifications", JOB, "success_criteria"]}, {"path": ["results", JOB]}]
DAEMONS = "{ instance { daemonHealth { allDaemonStatuses { daemonType healthy } } } }"
JOBS = "{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }"
PARTITIONS = """{ pipelineOrError(params: {repositoryLocationName: "agentenv_tasks",
  repositoryName: "__repository__", pipelineName: "realistic"}) {
  ... on Pipeline { partitionKeysOrError { ... on PartitionKeys { partitionKeys } } } } }"""
RUNS = """{ runsOrError(filter: {pipelineName: "realistic"}) {
  ... on Runs { results { runId startTime endTime } } } }"""
UNFINISHED = """{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED, CANCELING]}) {
  ... on Runs { results { runId } } } }"""
LAUNCH = """mutation ($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL = """query ($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  status endTimestamp runs(limit: 10) { runId jobName status creationTime startTime endTime } } } }"""


class Dagster:
    """``dagster dev`` on the project, and its GraphQL API."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = (root / "dagster-dev.log").open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(self.port)],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, text: str, variables: dict | None = None) -> dict:
        answer = httpx.post(f"http://127.0.0.1:{self.port}/graphql", json={"query": text, "variables": variables or {}},
                            timeout=30).json()
        if "errors" in answer:
            raise RuntimeError(answer["errors"])
        return answer["data"]

    def wait_until_ready(self, timeout: float = 300) -> None:
        """The webserver answers, the code location has the job, the backfill daemon and the
        run queue beat."""
        def ready() -> bool:
            try:
                jobs = {j["name"] for n in self.query(JOBS)["repositoriesOrError"].get("nodes", []) for j in n["jobs"]}
                healthy = {d["daemonType"] for d in self.query(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
                           if d["healthy"]}
            except (httpx.HTTPError, RuntimeError, ValueError):
                return False
            return JOB in jobs and {"BACKFILL", "QUEUED_RUN_COORDINATOR"} <= healthy

        wait(ready, timeout, "dagster dev (webserver, code location, daemon)")

    def stop(self) -> None:
        terminate(self.process.pid, grace_seconds=20)  # the whole group: webserver, daemon, code servers
        self.process.wait(timeout=30)
        self.log.close()


def wait(predicate, timeout: float, what: str, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    sys.exit(f"timed out after {timeout:.0f} s waiting for {what}")


def backfill_params(dagster: Dagster, via: str, root: Path, in_flight: int) -> dict:
    """What the UI sends: the assets and every partition, with the launchpad's resource config."""
    params = {"assetSelection": ASSETS, "tags": [], "runConfigData": {
        "resources": {"agentenv": {"config": {"project_dir": str(root), "rows_in_flight": in_flight}}}}}
    if via == "asset":
        return {**params, "allPartitions": True}
    keys = dagster.query(PARTITIONS)["pipelineOrError"]["partitionKeysOrError"]["partitionKeys"]
    return {**params, "partitionNames": keys, "fromFailure": False,
            "selector": {"partitionSetName": f"{JOB}_partition_set", "repositorySelector": LOCATION}}


def backfill(dagster: Dagster, params: dict) -> tuple[float, dict, float]:
    """Submit, then poll until the backfill completes: its wall time, its one run, and when it
    was submitted (epoch seconds)."""
    submitted = time.time()
    started = time.perf_counter()
    launched = dagster.query(LAUNCH, {"params": params})["launchPartitionBackfill"]
    if launched["__typename"] != "LaunchBackfillSuccess":
        sys.exit(f"the backfill was refused: {launched}")
    done = wait(lambda: (b := dagster.query(BACKFILL, {"id": launched["backfillId"]})["partitionBackfillOrError"])[
        "status"] not in ("REQUESTED", "CANCELING", "FAILING") and b, 3600, "the backfill")
    elapsed = time.perf_counter() - started
    if len(done["runs"]) != 1:
        sys.exit(f"the backfill made {len(done['runs'])} runs, not one: {done}")
    run = {**done["runs"][0], "status_of_backfill": done["status"], "completed": done["endTimestamp"]}
    return elapsed, run, submitted


def launched_at(home: Path, run_id: str) -> float:
    """When the run queue launched the run (its RUN_STARTING event)."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (starting,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_STARTING)
    return starting.timestamp


def holding_sandboxes(contexts: dict[str, dict]) -> int:
    """The most rows that held their sandbox and agent at once: each from its first step's
    start to its teardown's start (it lets the next row in only after its teardown)."""
    edges = []
    for context in contexts.values():
        timings = context["metadata"]["step_timings"]
        start, end = (datetime.fromisoformat(timings[step]["started_at_utc"]).timestamp()
                      for step in ("sandbox", "teardown_run"))
        edges += [(start, 1), (end, -1)]
    running = peak = 0
    for _, change in sorted(edges):  # an end sorts before a start at the same instant
        running += change
        peak = max(peak, running)
    return peak


def passed(contexts: dict[str, dict]) -> int:
    return sum(1 for c in contexts.values()
               if ((c["metadata"].get("verifications") or {}).get("success_criteria") or {}).get("passed"))


def project(root: Path, rows: int, grade: float, dequeue_interval: int | None) -> Path:
    """The realistic dataset's project, with a code location that has the task and an instance."""
    task = agentenv_project(root, latencies(rows), grade)
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(REPO / name, root / name)
    home = root / ".dagster_home"
    home.mkdir()
    settings = yaml.safe_load(dagster_yaml(home))  # the project's own, as its first run writes it
    if dequeue_interval:
        settings["run_queue"] = {**settings.get("run_queue", {}), "dequeue_interval_seconds": dequeue_interval}
    (home / "dagster.yaml").write_text(yaml.safe_dump(settings))
    return task


def row_contexts(root: Path, run_id: str) -> dict[str, dict]:
    """Each row's final context in the run ``run_id``."""
    runs = root / ".agentenv" / "state" / "runs"
    return {key: context.to_dict() for key, context in final_contexts(runs, run_id).items()}


def run_cli(dagster: Dagster, root: Path, task: Path, args: argparse.Namespace, ideal: float) -> float:
    """(a): the CLI as a user runs it; its wall time."""
    command = [shutil.which("agentenv-dagster") or "agentenv-dagster", "run", str(task),
               "--rows-in-flight", str(args.in_flight), "--output-dir", str(root / "out")]
    elapsed, busy, _output = timed(command, root, {"DAGSTER_HOME": str(root / ".dagster_home")})
    (run,) = dagster.query(RUNS)["runsOrError"]["results"]
    contexts = row_contexts(root, run["runId"])
    print(f"  (a) agentenv-dagster run   {elapsed:7.2f} s ({elapsed / ideal:.2f}x ideal)  {busy or 0:6.1f} s CPU  "
          f"{passed(contexts)}/{args.rows} rows passed, at most {holding_sandboxes(contexts)} holding a sandbox and "
          f"agent; its run {run['endTime'] - run['startTime']:.2f} s; load average {os.getloadavg()[0]:.2f}", flush=True)
    return elapsed


def run_backfill(dagster: Dagster, root: Path, args: argparse.Namespace, ideal: float) -> tuple[float, float]:
    """(b): a backfill of every row, once the instance is idle; its wall time, and to its run's end."""
    wait(lambda: not dagster.query(UNFINISHED)["runsOrError"]["results"], 600, "the instance to be idle", 1)
    busy = busy_cpu_seconds()
    elapsed, run, submitted = backfill(dagster, backfill_params(dagster, args.via, root, args.in_flight))
    busy = busy_cpu_seconds() - busy if busy is not None else None
    contexts = row_contexts(root, run["runId"])
    print(f"  (b) backfill ({args.via:5})       {elapsed:7.2f} s ({elapsed / ideal:.2f}x ideal)  {busy or 0:6.1f} s CPU  "
          f"{passed(contexts)}/{args.rows} rows passed, at most {holding_sandboxes(contexts)} holding a sandbox and "
          f"agent; one run of "
          f"{run['jobName']}, {run['status']}; backfill {run['status_of_backfill']}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    launched = launched_at(root / ".dagster_home", run["runId"])
    steps = [
        ("submit -> run created", run["creationTime"] - submitted, "the backfill daemon's next iteration, every 30 s"),
        ("created -> launched", launched - run["creationTime"],
         f"the run queue's next dequeue, every {args.dequeue_interval or 5} s"),
        ("launched -> started", run["startTime"] - launched, "the run worker's start: a process loads the location"),
        ("the run", run["endTime"] - run["startTime"], "as the CLI's"),
        ("run end -> completed", run["completed"] - run["endTime"], "the backfill daemon's next iteration"),
    ]
    for name, seconds, why in steps:
        print(f"      {name:<22}{seconds:7.2f} s  ({why})")
    return elapsed, run["endTime"] - submitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--grade", type=float, default=0.5, help="seconds each row's test command works")
    parser.add_argument("--via", choices=["asset", "job"], default="asset",
                        help="the backfill as the asset graph launches it, or as the job's page does")
    parser.add_argument("--dequeue-interval", type=int, help="the run queue's dequeue interval in seconds "
                        "(dagster.yaml run_queue: dequeue_interval_seconds; Dagster's default 5)")
    args = parser.parse_args()
    lat = latencies(args.rows)
    ideal = list_schedule([value + args.grade for value in lat], args.in_flight)
    print(f"{args.rows} rows (latency mean {sum(lat) / len(lat):.2f} s, max {max(lat):.2f} s), a {args.grade} s "
          f"test command each, {args.in_flight} in flight (at most {2 * args.in_flight} holding a sandbox and agent): "
          f"row-major ideal {ideal:.2f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="backfill-") as tmp:
        root = Path(tmp) / "project"
        task = project(root, args.rows, args.grade, args.dequeue_interval)
        dagster = Dagster(root, {**os.environ, "DAGSTER_HOME": str(root / ".dagster_home")})
        try:
            dagster.wait_until_ready()
            print(f"  dagster dev up; load average {os.getloadavg()[0]:.2f}", flush=True)
            cli = run_cli(dagster, root, task, args, ideal)
            elapsed, to_run_end = run_backfill(dagster, root, args, ideal)
        finally:
            dagster.stop()
    print(f"  backfill / CLI = {elapsed / cli:.2f} (to the run's end: {to_run_end / cli:.2f}; target <= 1.5)")


if __name__ == "__main__":
    main()
