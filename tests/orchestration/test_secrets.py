"""No secret reaches the IO manager's files, the event log, or context.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fakes.messages_api import tool_use_reply

import pytest

from projects import REPO, leaked_servers, make_project

JUDGE_KEY = "sk-ant-judge-SECRET-4f1c"
OVERRIDE_KEY = "sk-litellm-SECRET-9b2e"


@pytest.mark.slow
def test_secrets_never_reach_run_storage_event_log_or_context(tmp_path, fake_messages_api):
    steps = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())
    next(s for s in steps if s["id"] == "tone")["use_agent_judge"] = False
    project = make_project(tmp_path / "p", tasks={"reply_to_dana.json": steps}, model={
        "api_key": "env:JUDGE_KEY", "base_url": fake_messages_api.base_url,
    })
    fake_messages_api.enqueue(tool_use_reply("submit_verdict", {"results": [
        {"id": "c1", "score": 1, "justification": "polite"}, {"id": "c2", "score": 1, "justification": "explains"},
    ]}))
    out = tmp_path / "out"
    env = {**os.environ, "JUDGE_KEY": JUDGE_KEY, "DAGSTER_HOME": str(project / ".dagster_home")}
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/reply_to_dana.json", "--output-dir", str(out),
         "-D", f"metadata.user_overrides.litellm_api_key={OVERRIDE_KEY}",
         "-D", f'metadata.remote_tokens={{"github": "{OVERRIDE_KEY}"}}'],
        cwd=project, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verification tone: 1.000" in done.stdout  # the judge really ran, with the key
    assert fake_messages_api.requests[0].headers["authorization"] == f"Bearer {JUDGE_KEY}"

    scanned = 0
    for folder in (project / ".agentenv" / "state", project / ".dagster_home", out):
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                scanned += 1
                assert JUDGE_KEY.encode() not in data, path
                assert OVERRIDE_KEY.encode() not in data, path
    assert scanned > 10
    assert list((project / ".dagster_home").rglob("*.db")), "the event log was not scanned"
    context = json.loads((out / "context.json").read_text())
    assert "remote_tokens" not in context["metadata"]
    assert leaked_servers(project / ".agentenv" / "state") == []


ENV_KEY = "sk-ant-api03-ENVIRON-" + "5" * 24  # ours: in the CLI's environment
OPENAI_KEY = "sk-proj-ENVIRON-" + "6" * 24
PASSWORD = "hunter2-correct-horse"
SEED_TOKEN = "tok-seed-" + "7" * 16
LEAKY_TASK = """
task_id: leaky
description: The agent prints its environment; the criteria read what it wrote.
initial_prompt: Show me your environment.
agent:
  type: replay
  episodes:
    - match: environment
      actions:
        - tool: Bash
          arguments: {command: "env > bash_env.txt; env"}
      reply: Wrote bash_env.txt.
sandbox: {driver: tempdir, python: null}
pre_run:
  - {command: env}
post_run:
  - {command: "cat bash_env.txt"}
success_criteria:
  - {type: file_contains, path: bash_env.txt, includes: ["PATH="], description: the agent printed its environment}
  - {type: run_command, command: "cat bash_env.txt; env", description: the criteria read it back}
"""


def scan(*folders: Path, secrets: list[str]) -> int:
    """How many files were read; fails on the first that holds one of ``secrets``."""
    scanned = 0
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                scanned += 1
                for secret in secrets:
                    assert secret.encode() not in data, (path, secret)
    return scanned


def test_an_agent_that_prints_its_environment_finds_no_key_and_no_record_holds_one(tmp_path):
    project = make_project(tmp_path / "p", tasks={"leaky.yaml": LEAKY_TASK})
    out = tmp_path / "out"
    env = {**os.environ, "ANTHROPIC_API_KEY": ENV_KEY, "OPENAI_API_KEY": OPENAI_KEY, "MY_SERVICE_TOKEN": PASSWORD,
           "DAGSTER_HOME": str(project / ".dagster_home")}
    done = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/leaky.yaml", "--output-dir",
                           str(out)], cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    printed = next((project / ".agentenv" / "state").rglob("bash_env.txt")).read_text()
    assert "PATH=" in printed  # the agent really printed its environment, and the criteria read it
    scanned = scan(project / ".agentenv" / "state", project / ".dagster_home", out,
                   secrets=[ENV_KEY, OPENAI_KEY, PASSWORD])
    assert scanned > 10 and list((project / ".dagster_home").rglob("*.db"))
    assert (out / "run.md").is_file() and (out / "task.html").is_file()
    assert ENV_KEY not in done.stdout + done.stderr


def test_secret_values_a_run_is_given_are_redacted_wherever_they_go(tmp_path):
    steps = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())
    next(s for s in steps if s["id"] == "tone")["use_agent_judge"] = False
    reply = next(s for s in steps if s["id"] == "reply")
    reply["prompt"] = "Reply to Dana. (reference <token>, password <password>)"  # echoed into the prompt
    project = make_project(tmp_path / "p", tasks={"reply_to_dana.json": steps})
    out = tmp_path / "out"
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    env.pop("ANTHROPIC_API_KEY", None)
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/reply_to_dana.json", "--output-dir", str(out),
         "-D", f"metadata.ANTHROPIC_API_KEY={ENV_KEY}", "-D", f"metadata.seed.token={SEED_TOKEN}",
         "-D", f"metadata.seed.password={PASSWORD}", "-D", f"metadata.password={PASSWORD}"],
        cwd=project, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verification sent: 1.000" in done.stdout  # the run used what it was given
    scan(project / ".agentenv" / "state", project / ".dagster_home", out, secrets=[ENV_KEY, SEED_TOKEN, PASSWORD])
    context = json.loads((out / "context.json").read_text())
    assert context["metadata"]["password"] == "***" and context["metadata"]["ANTHROPIC_API_KEY"] == "***"
    assert context["metadata"]["seed"]["token"] == "***"
    assert context["prompt_responses"][0]["prompt_text"] == "Reply to Dana. (reference ***, password ***)"
