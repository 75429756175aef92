"""``dagster dev`` on a project of N tasks, end to end: what a user waits for in the UI.

It writes N copies of tasks/reply_to_dana.json (as bench/load.py does), starts
``dagster dev`` on 127.0.0.1 with the project's own ``definitions.py`` and ``workspace.yaml``,
and asks the webserver's GraphQL API, as the UI does:

- **loaded**: seconds until the code location's status is LOADED, and how many jobs it lists;
- **one job**: seconds to open the last task's job (its ops); the webserver already holds
  its snapshot (Dagster 1.13's webserver fetches every job's snapshot as it loads a location);
- **reloaded**: seconds for the UI's "Reload" of the location (a new code server, which
  builds the whole location again), and to open that job again.

Then it stops ``dagster dev`` (its whole process group) and removes the project. Wall seconds.
Past about 10,000 tasks the repository message nears Dagster's 100 MB gRPC limit and the code
server's load its default 180 s timeouts, so both are raised here, as docs/production.md
tells users to.

    python bench/dev_load.py [--tasks 300] [--port 3377] [--timeout 3600]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import graphql, start_group, stop_group, wait_loaded  # noqa: E402
from load import make_project  # noqa: E402

JOB = """query ($selector: PipelineSelector!) { pipelineOrError(params: $selector) {
  __typename ... on Pipeline { name solids { name } } ... on PythonError { message } } }"""
RELOAD = """mutation ($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) {
  __typename ... on PythonError { message } } }"""


def start_dev(project: Path, port: int, timeout: float):
    home = project / ".dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(
        f"code_servers:\n  local_startup_timeout: {timeout:.0f}\ntelemetry:\n  enabled: false\n")
    env = {"DAGSTER_HOME": str(home), "PYTHONWARNINGS": "ignore",
           "DAGSTER_GRPC_MAX_RX_BYTES": "400000000", "DAGSTER_GRPC_MAX_SEND_BYTES": "400000000",
           "DAGSTER_REPOSITORY_GRPC_TIMEOUT_SECONDS": f"{timeout:.0f}"}
    return start_group(
        [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port), "-h", "127.0.0.1"],
        project, env, project / "dev.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--port", type=int, default=3377)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the location to load")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        make_project(project, args.tasks)
        started = time.monotonic()
        proc = start_dev(project, args.port, args.timeout)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=args.timeout) as client:
                (location,) = wait_loaded(client, proc, args.timeout)
                loaded = time.monotonic() - started
                (repo,) = location["repositories"]
                jobs = [job["name"] for job in repo["jobs"]]
                last = f"task_{args.tasks - 1:05d}"
                opened = time.monotonic()
                selector = {"pipelineName": last, "repositoryName": repo["name"],
                            "repositoryLocationName": location["name"]}
                job = open_job(client, selector)
                one_job = time.monotonic() - opened
                reloading = time.monotonic()
                graphql(client, RELOAD, name=location["name"])
                wait_loaded(client, proc, args.timeout)
                reloaded = time.monotonic() - reloading
                opened = time.monotonic()
                open_job(client, selector)
                one_job_again = time.monotonic() - opened
        except Exception:
            print((project / "dev.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            stop_group(proc)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; wall seconds")
    print(f"{args.tasks} tasks: loaded in {loaded:.0f} s with {len(jobs)} jobs "
          f"({sum(name.startswith('task_') for name in jobs)} task jobs); "
          f"{last} opened in {one_job:.2f} s ({len(job['solids'])} ops); "
          f"reloaded in {reloaded:.0f} s, {last} opened again in {one_job_again:.2f} s")


def open_job(client: httpx.Client, selector: dict) -> dict:
    job = graphql(client, JOB, selector=selector)["pipelineOrError"]
    if job["__typename"] != "Pipeline":
        raise RuntimeError(f"{selector['pipelineName']}: {job}")
    return job


if __name__ == "__main__":
    main()
