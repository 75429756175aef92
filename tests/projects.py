"""Throwaway copies of this checkout's project layout, for tests that run tasks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.runtime.processes import is_running

REPO = Path(__file__).resolve().parents[1]
SHARED = (REPO.parent / "shared").resolve()


def make_project(
    root: Path, *, extra_config: str = "", tasks: dict[str, object] | None = None,
    model: dict[str, str] | None = None,
) -> Path:
    """A project folder: the repo's artifacts, agents and config (+ ``extra_config``, and
    ``[model]`` settings replaced by ``model``), and ``tasks/`` holding the repo's tasks or
    the given ``{filename: document}``."""
    root.mkdir(parents=True, exist_ok=True)
    for folder in ("artifacts", "agents"):
        shutil.copytree(REPO / folder, root / folder)
    (root / ".agentenv").mkdir()
    config = (REPO / ".agentenv" / "config.toml").read_text()
    if model is not None:
        start, end = config.index("[model]"), config.index("[agents.registry.claude-code]")
        config = config[:start] + "[model]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in model.items()) + "\n" + config[end:]
    (root / ".agentenv" / "config.toml").write_text(config + "\n" + extra_config)
    tasks_dir = root / "tasks"
    if tasks is None:
        shutil.copytree(REPO / "tasks", tasks_dir)
    else:
        tasks_dir.mkdir()
        for name, document in tasks.items():
            text = document if isinstance(document, str) else json.dumps(document)
            (tasks_dir / name).write_text(text)
    return root


def leaked_servers(state_dir: Path) -> list[str]:
    """Instances recorded by any run under ``state_dir`` whose process still runs."""
    leaked = []
    for run_dir in (state_dir / "runs").glob("*"):
        for instance_id, entry in Ledger.of_run(run_dir).entries().items():
            if entry.get("pid") and is_running(entry["pid"]):
                leaked.append(f"{run_dir.name}/{instance_id} (pid {entry['pid']})")
    return leaked


def run_steps(root: Path, steps: list[dict], *, context: dict | None = None):
    """Run ``steps`` with the plain asyncio walker in project ``root``; returns the context
    (or raises the first fatal failure)."""
    import asyncio

    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config
    from agentenv_dagster.context import TaskStepContext
    from agentenv_dagster.runner import run_plan

    path = root / "tasks" / "under_test.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(steps))
    config = load_config(root)
    plan = load_plan(path, config)
    return asyncio.run(run_plan(plan, config, context=TaskStepContext.from_dict(context or {})))
