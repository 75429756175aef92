"""A folder of many tasks of the project's own, for the tests of a code location's job
snapshots: variants of the example tasks (their ids, prompts and criteria changed), datasets
among them, so that each kind of job appears many times."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from projects import REPO

CRITERIA = [
    {"type": "file_exists", "path": "hello.py", "description": "hello.py exists"},
    {"type": "file_contains", "path": "hello.py", "includes": ["print"], "description": "it prints"},
    {"type": "run_command", "command": "python hello.py", "expected_stdout": "Hello", "description": "it runs"},
    {"type": "command_executed", "tool_name": "Bash", "command_pattern": "python", "description": "ran it"},
    {"type": "commands_efficiency", "expected_commands": 2, "description": "few calls", "weight": 0},
]


def write_task_variants(tasks_dir: Path, count: int = 24) -> list[Path]:
    """``count`` Coder Eval tasks (a third of them datasets) and a few agent-env documents,
    written into ``tasks_dir`` beside what is there; their paths."""
    hello = yaml.safe_load((REPO / "tasks" / "hello_python.yaml").read_text())
    triage = yaml.safe_load((REPO / "tasks" / "triage_tickets.yaml").read_text())
    dana = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())
    written = []
    for i in range(count):
        if i % 3 == 2:
            task = {**triage, "task_id": f"triage-{i}",
                    "dataset": {"rows": triage["dataset"]["rows"][: 2 + i % 5]}}
        else:
            task = {**hello, "task_id": f"hello-{i}", "initial_prompt": f"Create hello.py, variant {i}.",
                    "success_criteria": CRITERIA[: 1 + i % len(CRITERIA)]}
        path = tasks_dir / f"variant_{i:02d}.yaml"
        path.write_text(yaml.safe_dump(task, sort_keys=False))
        written.append(path)
    for i in range(3):
        steps = [{**step, "prompt": f"{step['prompt']} (variant {i})"} if "prompt" in step else step for step in dana]
        path = tasks_dir / f"dana_variant_{i}.json"
        path.write_text(json.dumps(steps))
        written.append(path)
    return written
