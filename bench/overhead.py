"""Per-step overhead of running a task through Dagster, against the plain asyncio walker.

Runs the same task (default: tasks/reply_to_dana.json, 7 steps + teardown, real env and
agent servers) with (a) the asyncio walker that mirrors agent-env's Task.run, (b) Dagster
in-process with a persistent SQLite instance, (c) Dagster's multiprocess executor
(forkserver), and prints the median wall times, the per-step overhead and the ratios.

    python bench/overhead.py [--task tasks/reply_to_dana.json] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

from agentenv_dagster import build_repository
from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.naming import job_name
from agentenv_dagster.runner import run_plan

ROOT = Path(__file__).resolve().parents[1]
TASK = os.environ.get("BENCH_TASK", str(ROOT / "tasks" / "reply_to_dana.json"))


def reconstructable_job() -> dg.JobDefinition:
    """Module-level, so the multiprocess executor's children can rebuild the job; through the
    lazy location, as definitions.py loads it, so a step builds only this job."""
    return build_repository(Path(TASK).parent, project_dir=ROOT).get_job(job_name(Path(TASK).stem))


def time_walker(plan, config) -> float:
    started = time.perf_counter()
    asyncio.run(run_plan(plan, config))
    return time.perf_counter() - started


def time_in_process(instance: dg.DagsterInstance) -> float:
    job = reconstructable_job()
    started = time.perf_counter()
    result = job.execute_in_process(instance=instance)
    assert result.success
    return time.perf_counter() - started


def time_multiprocess(instance: dg.DagsterInstance) -> float:
    started = time.perf_counter()
    with dg.execute_job(dg.reconstructable(reconstructable_job), instance=instance) as result:
        assert result.success
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.chdir(ROOT)
    config = load_config(ROOT)
    plan = load_plan(TASK, config)
    steps = len(plan.steps)
    with tempfile.TemporaryDirectory() as home:
        with dg.DagsterInstance.from_config(home) as instance:
            time_walker(plan, config)  # warm caches (imports, first server start)
            runs = {
                "asyncio walker": [time_walker(plan, config) for _ in range(args.repeat)],
                "dagster in-process": [time_in_process(instance) for _ in range(args.repeat)],
                "dagster multiprocess": [time_multiprocess(instance) for _ in range(args.repeat)],
            }
    baseline = statistics.median(runs["asyncio walker"])
    print(f"task {plan.task_id}: {steps} steps, median of {args.repeat} runs, python {sys.version.split()[0]}")
    print(f"{'mode':<22}{'wall s':>9}{'ratio':>8}{'overhead/step s':>17}")
    for mode, times in runs.items():
        wall = statistics.median(times)
        print(f"{mode:<22}{wall:>9.2f}{wall / baseline:>8.2f}{(wall - baseline) / steps:>17.3f}")


if __name__ == "__main__":
    main()
