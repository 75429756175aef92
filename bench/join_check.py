"""The static join check of a long task, against loading the same task, in the same run.

For each size N (default 1,000, 5,000 and 10,000 steps) it writes two agent-env documents:

- **chain**: each step depends on the one before (``depends_on: [previous]``);
- **bare**: no step names its dependencies, so each waits for every earlier step (the
  agent-env default, and the worst case for ancestry: N x N / 2 edges);

where even steps deploy an env and odd steps reset the env deployed just before, so every
odd step reads a name an ancestor writes. Then it measures:

- ``load s``: reading, parsing and validating the file (``load_task_file``: JSON, every
  step's fields, the DAG and retry checks) — the baseline, linear in the file's size;
- ``join s``: ``TaskPlan.join_errors()``, the check that every read has an ancestor writing it;
- ``join/load``: how the join check compares with the baseline (it stays flat as N grows
  when the check is linear in steps x names read);
- ``join us/step``: the same per step.

Times are CPU seconds of this process (steadier than wall time on a shared machine).

    python bench/join_check.py [--sizes 1000,5000,10000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agentenv_dagster.plan import TaskPlan
from agentenv_dagster.spec.loader import load_task_file
from agentenv_dagster.steps import BUILTIN_STEPS


def task_steps(size: int, shape: str) -> list[dict]:
    steps = []
    for i in range(size):
        step = ({"id": f"s{i}", "type": "deploy_env", "env_id": f"e{i}"} if i % 2 == 0
                else {"id": f"s{i}", "type": "reset_env", "env_id": f"e{i - 1}"})
        if shape == "chain":
            step["depends_on"] = [f"s{i - 1}"] if i else []
        steps.append(step)
    return steps


def measure(path: Path) -> tuple[float, float, int]:
    start = time.process_time()
    document = load_task_file(path, BUILTIN_STEPS)
    loaded = time.process_time()
    errors = TaskPlan(document).join_errors()
    return loaded - start, time.process_time() - loaded, len(errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,10000", help="comma-separated step counts")
    sizes = [int(size) for size in parser.parse_args().sizes.split(",")]
    print(f"{'shape':<6} {'steps':>7} {'load s':>8} {'join s':>8} {'join/load':>10} {'join us/step':>13}")
    with tempfile.TemporaryDirectory() as folder:
        for shape in ("chain", "bare"):
            for size in sizes:
                path = Path(folder) / f"{shape}-{size}.json"
                path.write_text(json.dumps(task_steps(size, shape)))
                load, join, errors = measure(path)
                assert errors == 0, f"{path.name}: {errors} join errors"
                print(f"{shape:<6} {size:>7,} {load:>8.3f} {join:>8.3f} {join / load:>10.2f} {join / size * 1e6:>13.1f}")


if __name__ == "__main__":
    main()
