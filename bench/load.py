"""Loading a code location of N tasks, against N equivalent hand-built Dagster jobs.

For each size N (default 100 and 1,000) it writes N copies of tasks/reply_to_dana.json
(distinct ids) to a temporary project and measures, each in a fresh Python process, in the
same run:

- **agentenv (lazy)**: ``build_repository(tasks/)``, what the root ``definitions.py`` does;
- **agentenv (eager)**: ``build_definitions(tasks/)``, the ``Definitions`` of the Python API;
- **op per type**: the lazy location with one op definition per step type shared by every
  node of that type (aliases), instead of one per step (``<graph>__<node>``, carrying the
  step's description): what the per-step ops cost;
- **hand-built**: N ``@dg.job`` jobs, a distinct ``@dg.op`` per step wired as the task's
  ``depends_on`` says, with the same default op config (the step fields), in a
  ``dg.Definitions``. They declare no assets, checks, sensors or resources: agentenv's
  location does, so its snapshot carries more per task;
- **hand, no config**: the same jobs without config: Dagster's own floor for a job per task.

Columns:

- ``run load s``: import to one job ready — what every run worker (and every step process of
  a multiprocess run) pays, as each re-imports the code location; the lazy location builds
  that one job only;
- ``loaded s``: what the code server does as ``dagster dev`` loads the location: everything
  built, the repository snapshot serialized (each job by name and snapshot id), then every
  job's snapshot (a ``JobDataSnap``) serialized twice: Dagster 1.13's webserver and daemon
  each fetch every job's snapshot as they load a location (``ExternalJob``);
- ``repo MB``: the repository message (one gRPC message, limit 100 MB unless
  ``DAGSTER_GRPC_MAX_RX_BYTES`` / ``DAGSTER_GRPC_MAX_SEND_BYTES`` raise it);
- ``jobs MB``: all job snapshots (one message each); ratios are against hand-built.

Times are CPU seconds of the measuring process (steadier than wall time on a shared machine).

    python bench/load.py [--sizes 100,1000] [--modes lazy,eager,pertype,hand,bare] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, copy_project  # noqa: E402

TASK = ROOT / "tasks" / "reply_to_dana.json"
MODES = {"lazy": "agentenv (lazy)", "eager": "agentenv (eager)", "pertype": "op per type",
         "hand": "hand-built", "bare": "hand, no config"}


def make_project(root: Path, n: int) -> Path:
    """A project like this checkout whose tasks/ holds n copies of the example task, ids
    task_00000…"""
    tasks = copy_project(root, tasks=[])
    steps = json.loads(TASK.read_text())
    for i in range(n):
        task_id = f"task_{i:05d}"
        (tasks / f"{task_id}.json").write_text(json.dumps({"id": task_id, "type": "task", "version": 1, "steps": steps}))
    return tasks


# -- measured in a child process -------------------------------------------------------------

def hand_built_definitions(n: int, with_config: bool = True):
    """n jobs written the usual Dagster way: an op per step, wired in a @job body.

    Without config they show Dagster's own per-job floor: what any location with a job per
    task pays, whatever it compiles from.
    """
    import dagster as dg

    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.rows import step_config

    plan = load_plan(TASK, load_config(ROOT))
    steps = plan.steps
    sinks = set(plan.sinks)

    def one_job(i: int) -> dg.JobDefinition:
        ops = {}
        for step in steps:
            @dg.op(name=f"t{i}_{step.id}", ins={"upstream": dg.In(list, default_value=[])},
                   config_schema={"step": dg.Field(dg.Permissive())})
            def _op(context, upstream):
                return [context.op_config["step"]["id"]]

            ops[step.id] = _op

        @dg.op(name=f"t{i}_teardown_run", ins={"upstream": dg.In(list, default_value=[])})
        def _teardown(context, upstream):
            return upstream

        config = {"ops": {f"t{i}_{s.id}": {"config": {"step": step_config(s)}} for s in steps}}
        @dg.job(name=f"task_{i:05d}", config=config if with_config else None)
        def _job():
            outputs = {}
            for step in steps:
                outputs[step.id] = ops[step.id](upstream=[outputs[d] for d in plan.edges[step.id]])
            _teardown(upstream=[outputs[s.id] for s in steps if s.id in sinks])

        return _job

    return dg.Definitions(jobs=[one_job(i) for i in range(n)])


def share_an_op_per_step_type() -> None:
    """The counterfactual of ``op per type``: every node of a step type invokes that type's
    one op definition, under its alias, instead of an op definition of its own."""
    from agentenv_dagster.orchestration import ops, task_job

    class Shared:
        def __init__(self, op_def):
            self.op_def = op_def

        def with_replaced_properties(self, **_):
            return self.op_def

    task_job.step_op = lambda step_type: Shared(ops.step_op(step_type))


def measure(mode: str, tasks_dir: Path, n: int) -> dict:
    started = time.process_time()
    if mode in ("lazy", "pertype"):
        from agentenv_dagster import build_repository

        if mode == "pertype":
            share_an_op_per_step_type()
        repo = build_repository(tasks_dir)
    elif mode == "eager":
        from agentenv_dagster import build_definitions

        repo = build_definitions(tasks_dir).get_repository_def()
    else:
        repo = hand_built_definitions(n, with_config=mode == "hand").get_repository_def()
    repo.get_job("task_00000")
    run_load = time.process_time() - started

    from agentenv_dagster.orchestration.dagster_internals import (
        grpc_message_limit,
        job_snapshot_bytes,
        repository_snapshot_bytes,
    )

    repo.load_all_definitions()  # as the code server does when it starts
    repo_bytes = repository_snapshot_bytes(repo)
    for _fetched_by in ("webserver", "daemon"):
        job_bytes = [job_snapshot_bytes(job) for job in repo.get_all_jobs()]
    return {
        "run_load": run_load, "loaded": time.process_time() - started,
        "repo_bytes": repo_bytes, "jobs_bytes": sum(job_bytes), "largest_job": max(job_bytes),
        "jobs": len(job_bytes), "limit": grpc_message_limit(),
    }


# -- the parent ----------------------------------------------------------------------------------

def run_child(mode: str, tasks_dir: Path, n: int, timeout: float) -> dict:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "--child", mode, str(tasks_dir), str(n)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"failed: {last[:120]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def mb(n: int) -> str:
    return f"{n / 1e6:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000", help="comma-separated task counts")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "TASKS_DIR", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, tasks_dir, n = args.child
        print(json.dumps(measure(mode, Path(tasks_dir), int(n))))
        return
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}; "
          "CPU seconds; ratios vs hand-built")
    header = (f"{'tasks':>6}  {'location':<18}{'run load s':>11}{'ratio':>7}{'loaded s':>10}{'ratio':>7}"
              f"{'repo MB':>9}{'jobs MB':>9}{'ratio':>7}  gRPC")
    print(header)
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            tasks_dir = make_project(Path(tmp), n)
            results = {mode: run_child(mode, tasks_dir, n, args.timeout) for mode in modes}
        base = results.get("hand", {})
        for mode in modes:
            r = results[mode]
            if "error" in r:
                print(f"{n:>6}  {MODES[mode]:<18}{r['error']}")
                continue

            def ratio(key: str) -> str:
                return f"{r[key] / base[key]:.2f}" if base.get(key) else "-"

            size = r["repo_bytes"] + r["jobs_bytes"]
            base_size = (base.get("repo_bytes") or 0) + (base.get("jobs_bytes") or 0)
            fits = "ok" if max(r["repo_bytes"], r["largest_job"]) < r["limit"] else f"exceeds {mb(r['limit'])} MB"
            print(f"{n:>6}  {MODES[mode]:<18}{r['run_load']:>11.2f}{ratio('run_load'):>7}"
                  f"{r['loaded']:>10.2f}{ratio('loaded'):>7}"
                  f"{mb(r['repo_bytes']):>9}{mb(r['jobs_bytes']):>9}"
                  f"{(f'{size / base_size:.2f}' if base_size else '-'):>7}  {fits}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
