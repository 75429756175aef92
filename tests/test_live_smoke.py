"""The live smoke task (``tasks/live_smoke.yaml``, tagged ``integration``): against the real
Messages API when ANTHROPIC_API_KEY is set, skipped with the reason otherwise. The same task
runs against the fake Messages API every time, so the file itself never rots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from fakes.messages_api import text_reply, tool_use_reply
from projects import REPO, leaked_servers, make_project

from agentenv_dagster.spec.coder_eval.loader import load_coder_eval_task

TASK = REPO / "tasks" / "live_smoke.yaml"


def run(project, out, env):
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/live_smoke.yaml",
                           "--output-dir", str(out)], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)


def test_the_smoke_task_is_tagged_integration():
    assert "integration" in load_coder_eval_task(TASK).task.tags


def test_the_smoke_task_passes_against_a_scripted_messages_api(tmp_path, fake_messages_api):
    project = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url})
    shutil.copy(TASK, project / "tasks")
    fake_messages_api.enqueue(
        tool_use_reply("Write", {"file_path": "greeting.txt", "content": "hello from the live agent"}),
        tool_use_reply("Read", {"file_path": "greeting.txt"}),
        text_reply("done"),
    )
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    env.pop("ANTHROPIC_API_KEY", None)
    done = run(project, tmp_path / "out", env)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "out" / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"]) == (1, 1)
    assert leaked_servers(project / ".agentenv" / "state") == []


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"),
                    reason="live smoke test: set ANTHROPIC_API_KEY to run the integration task against the real API")
def test_the_smoke_task_passes_against_the_real_api(tmp_path):
    project = make_project(tmp_path / "p", tasks={})
    shutil.copy(TASK, project / "tasks")
    done = run(project, tmp_path / "out", {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert leaked_servers(project / ".agentenv" / "state") == []
