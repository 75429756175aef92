"""Agent pools: a limit on an agent's pool holds across runs (a shared rate limit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.orchestration.execute import dagster_yaml
from projects import REPO, leaked_servers, make_project, node_of

SLOW_AGENT = """
[agents.registry.slow]
kind = "replay"
delay_seconds = 1.5
episodes = [{match = ".", reply = "done"}]
"""


def task(name: str) -> list[dict]:
    return [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "slow", "agent_name": "a", "depends_on": []},
        {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": name, "prompt": f"go {name}"},
    ]


def step_window(instance, run_id: str, step_key: str) -> tuple[float, float]:
    events = [e for e in instance.all_logs(run_id) if node_of(e.step_key) == step_key and e.is_dagster_event]
    start = next(e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_START)
    end = next(e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_SUCCESS)
    return start, end


@pytest.mark.slow
def test_a_pool_limit_on_an_agent_serializes_its_prompts_across_runs(tmp_path):
    root = make_project(tmp_path / "p", extra_config=SLOW_AGENT, tasks={"one.json": task("one"), "two.json": task("two")})
    shutil.copy(REPO / "definitions.py", root / "definitions.py")
    defs = build_definitions(root / "tasks")
    (steps,) = defs.resolve_job_def("one").graph.nodes  # the task's graph
    assert steps.definition.node_named("ask").tags["dagster/concurrency_key"] == "agentenv_agent_slow"
    home = root / ".dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home) + "concurrency:\n  pools:\n    default_limit: 1\n")  # the project's instance
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    dg.DagsterInstance.from_config(str(home)).dispose()  # create the storage once, not in both runs at a time
    runs = [
        subprocess.Popen([sys.executable, "-m", "dagster", "job", "execute", "-f", "definitions.py", "-j", name],
                         cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for name in ("one", "two")
    ]
    assert [run.wait(timeout=240) for run in runs] == [0, 0], [run.stderr.read()[-2000:] for run in runs]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run_ids = [r.run_id for r in instance.get_runs()]
        (a_start, a_end), (b_start, b_end) = (step_window(instance, run_id, "ask") for run_id in run_ids)
    assert a_end <= b_start or b_end <= a_start, "the two prompts held the agent's pool at once"
    assert leaked_servers(root / ".agentenv" / "state") == []
