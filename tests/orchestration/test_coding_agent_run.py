"""A Coder Eval task run by the real Claude Code (claude-agent-sdk's CLI against the fake
Messages API), through the ``agentenv-dagster run`` CLI: its tool calls are graded."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
from fakes.messages_api import text_reply, tool_use_reply

from projects import leaked_servers, make_project

TASK = """
task_id: hello_cc
description: Write hello.py
initial_prompt: Write hello.py that prints hello.
# Bash is granted by allowed_tools: under acceptEdits alone Claude Code denies this command
agent: {type: claude-code, allowed_tools: [Bash], disallowed_tools: [WebSearch]}
run_limits: {max_turns: 4}
success_criteria:
  - {type: file_contains, path: hello.py, includes: ["print(42)"], description: the script}
  - {type: command_executed, tool_name: Bash, command_pattern: 'python3 -c', require_success: true,
     description: written by the shell}
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("claude_agent_sdk") is None,
                    reason="claude-agent-sdk is not installed (pip install 'agentenv-dagster[agents]')")
def test_a_claude_code_task_is_graded_on_what_claude_code_did(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "project", tasks={"hello_cc.yaml": textwrap.dedent(TASK)},
                        model={"base_url": fake_messages_api.base_url, "api_key": "sk-test",
                               "default": "claude-sonnet-4-6"})
    config = root / ".agentenv" / "config.toml"
    text = config.read_text()
    stand_in = 'kind = "replay"\nscript = "agents/reply_to_dana.replay.json"'
    assert stand_in in text  # this checkout's claude-code is the offline stand-in; here it is the real one
    config.write_text(text.replace(stand_in, 'kind = "claude-code"'))
    fake_messages_api.enqueue(
        tool_use_reply("Bash", {"command": "python3 -c \"open('hello.py', 'w').write('print(42)')\""}),
        text_reply("hello.py is written."),
    )
    out = tmp_path / "out"
    env = {**os.environ, "DAGSTER_HOME": str(root / ".dagster_home")}
    done = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/hello_cc.yaml",
                           "--output-dir", str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "+ hello_cc: SUCCESS (score 1.000)" in done.stdout
    result = json.loads((out / "default" / "hello_cc" / "00" / "task.json").read_text())
    commands = result["iterations"][0]["commands"]
    assert [(c["tool_name"], c["result_status"]) for c in commands] == [("Bash", "success")]
    assert [r["score"] for r in result["success_criteria_results"]] == [1.0, 1.0]
    tools = {t["name"] for t in fake_messages_api.requests[0].body["tools"]}
    assert "Bash" in tools and "WebSearch" not in tools
    assert leaked_servers(root / ".agentenv" / "state") == []
