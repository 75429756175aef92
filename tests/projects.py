"""Throwaway copies of this checkout's project layout, for tests that run tasks."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.runtime.processes import is_running, terminate

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
NO_CORPUS = ("the upstream task corpus is not here (it belongs to the upstream projects, not to this "
             "repository): set AGENTENV_UPSTREAM_CORPUS or put it at ../shared/corpus")


def upstream_corpus() -> Path | None:
    """The upstream projects' real task files (``agentenv/``, ``coder_eval/``), when this machine
    has them: ``AGENTENV_UPSTREAM_CORPUS``, else ``../shared/corpus`` beside the checkout. A fresh
    clone has neither, and the tests that read it skip (``NO_CORPUS``)."""
    named = os.environ.get("AGENTENV_UPSTREAM_CORPUS")
    folder = Path(named) if named else REPO.parent / "shared" / "corpus"
    return folder.resolve() if folder.is_dir() else None


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


def make_dg_project(root: Path, **options) -> Path:
    """``make_project`` as this checkout is a ``dg`` project: its ``evals/`` package (the task
    folder component in ``evals/defs/tasks/defs.yaml``), the ``[tool.dg]`` of its
    ``pyproject.toml``, and its ``definitions.py`` and ``workspace.yaml``."""
    make_project(root, **options)
    shutil.copytree(REPO / "evals", root / "evals", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(REPO / name, root / name)
    dg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["dg"]
    project = "".join(f"{key} = {json.dumps(value)}\n" for key, value in dg["project"].items())
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "evals"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "{dg["directory_type"]}"\n\n'
        f"[tool.dg.project]\n{project}")
    return root


def leaked_servers(state_dir: Path) -> list[str]:
    """Instances recorded by any run under ``state_dir`` whose process still runs."""
    leaked = []
    for run_dir in (state_dir / "runs").glob("*"):
        for instance_id, entry in Ledger.of_run(run_dir).entries().items():
            if entry.get("pid") and is_running(entry["pid"]):
                leaked.append(f"{run_dir.name}/{instance_id} (pid {entry['pid']})")
    return leaked


def servers_left_after_their_owner(state_dir: Path, seconds: float = 10.0) -> list[str]:
    """:func:`leaked_servers` once the servers have had ``seconds`` to notice that their
    owner (the run's worker) has ended: each ends itself then, within its end grace."""
    deadline = time.monotonic() + seconds
    while (leaked := leaked_servers(state_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return leaked


def graph_config(run_config: dict) -> dict:
    """The task graph's config in a task job's run config (``steps`` by node, ``rows``)."""
    (graph,) = run_config["ops"].values()
    return graph["config"]


def default_steps(job) -> dict:
    """A task job's default step fields, by node (what the launchpad opens with)."""
    (graph,) = job.run_config_schema.config_type.fields["ops"].config_type.fields.values()
    return graph.config_type.fields["config"].config_type.fields["steps"].default_value


def node_of(step_key: str | None) -> str | None:
    """A step key's node: a task's steps are nodes of its graph (``<task>.<step>``)."""
    return step_key.rsplit(".", 1)[-1] if step_key else step_key


def stream_rows(run_dir: Path, step_key: str) -> dict[str, dict]:
    """A run's stream of one step (``<state>/runs/<run_id>``, the step's node name): each
    row's context as the step passed it on (or as the row stopped)."""
    from agentenv_dagster.orchestration.io_manager import TaskContextIOManager

    io = TaskContextIOManager(base_dir=str(run_dir.parent))
    rows = io.rows(run_dir.name, io.step_stream(run_dir.name, step_key))
    return {key: record["context"] for key, record in rows.items()}


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


def run_direct(root: Path, step: dict, context):
    """One step's ``execute`` under a plain runtime, for records no deploy step can make
    (an agent served by the test itself); returns ``context``."""
    import asyncio

    from agentenv_dagster.config import load_config
    from agentenv_dagster.runtime.base import RunInfo, StepRuntime
    from agentenv_dagster.steps import BUILTIN_STEPS

    async def go():
        run = RunInfo(run_id="direct", task_id="direct", run_dir=root / ".agentenv" / "direct")
        async with StepRuntime(load_config(root), run) as rt:
            await BUILTIN_STEPS.get(step["type"]).model_validate(step).execute(context, rt)
        return context

    return asyncio.run(go())


def dagster_project(root: Path) -> Path:
    """Give a project this checkout's ``definitions.py`` and ``workspace.yaml`` and its own
    instance folder (the project's local storage); the instance folder."""
    from agentenv_dagster.orchestration.execute import dagster_yaml

    for name in ("definitions.py", "workspace.yaml"):
        (root / name).write_text((REPO / name).read_text())
    home = root / ".dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    return home


@contextlib.contextmanager
def dagster_daemon(root: Path, log_path: Path, env: dict[str, str] | None = None):
    """``dagster-daemon run`` on the project (sensors, schedules, the run queue), ended, and
    waited for, on the way out; its output goes to ``log_path`` for a failure's reader.
    ``env`` replaces the environment (an instance that reads its settings from it)."""
    with open(log_path, "a") as log:
        daemon = subprocess.Popen(
            [str(Path(sys.executable).with_name("dagster-daemon")), "run", "-w", "workspace.yaml"], cwd=root,
            env={**(env or os.environ), "DAGSTER_HOME": str(root / ".dagster_home"), "PYTHONPATH": str(root)},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            yield daemon
        finally:
            terminate(daemon.pid, grace_seconds=20)
            daemon.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # a code server it started may outlive it
                os.killpg(daemon.pid, signal.SIGKILL)

