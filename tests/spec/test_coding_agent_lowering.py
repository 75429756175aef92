"""A Coder Eval claude-code / codex ``agent:`` block reaches the deployed agent whole."""

from __future__ import annotations

import json
import textwrap

from agentenv_dagster.config import AgentEntry
from agentenv_dagster.spec.coder_eval import load_coder_eval_task
from agentenv_dagster.spec.coder_eval.lowering import lower_task

TASK = """
task_id: coding
description: Write hello.py
initial_prompt: Write hello.py.
agent:
  type: claude-code
  model: claude-opus-4-1
  permission_mode: bypassPermissions
  allowed_tools: [Bash, Write]
  disallowed_tools: [WebSearch]
  system_prompt: Be careful.
  system_prompt_mode: replace
  setting_sources: [project, local]
  claude_settings: {permissions: {deny: ["Read(./.env)"]}}
  plugins: [{type: local, path: plugins/mine}]
  sdk_options: {max_thinking_tokens: 2000}
sandbox: {python: null}
run_limits: {max_turns: 7}
success_criteria:
  - {type: file_exists, path: hello.py, description: the script exists}
"""


def steps_of(tmp_path, text: str) -> dict[str, dict]:
    path = tmp_path / "task.yaml"
    path.write_text(textwrap.dedent(text))
    return {s["id"]: s for s in lower_task(load_coder_eval_task(path))}


def test_claude_code_fields_become_the_agents_registry_overrides(tmp_path):
    steps = steps_of(tmp_path, TASK)
    deploy, prompt = steps["agent"], steps["prompt"]
    assert deploy["a2a_agent_id"] == "claude-code" and deploy["system_prompt"] == "Be careful."
    overrides = deploy["agent_config"]
    assert overrides == {
        "model": "claude-opus-4-1", "permission_mode": "bypassPermissions", "allowed_tools": ["Bash", "Write"],
        "disallowed_tools": ["WebSearch"], "system_prompt_mode": "replace", "setting_sources": ["project", "local"],
        "sdk_options": {"max_thinking_tokens": 2000},
        "settings": json.dumps({"permissions": {"deny": ["Read(./.env)"]}}),
        "plugins": [{"type": "local", "path": str(tmp_path.resolve() / "plugins" / "mine")}],
    }
    AgentEntry.model_validate({"kind": "claude-code", **overrides})  # what deploy_agent does with them
    assert prompt["max_turns"] == 7  # run_limits reach the agent by agent-config


def test_codex_takes_the_shared_fields_and_a_settings_file_stays_a_path(tmp_path):
    text = TASK.replace("type: claude-code", "type: codex").split("  system_prompt_mode")[0] + textwrap.dedent("""
        sandbox: {python: null}
        success_criteria:
          - {type: file_exists, path: hello.py, description: the script exists}
        """)
    overrides = steps_of(tmp_path, text)["agent"]["agent_config"]
    assert overrides == {"model": "claude-opus-4-1", "permission_mode": "bypassPermissions",
                         "allowed_tools": ["Bash", "Write"], "disallowed_tools": ["WebSearch"]}
    settings_file = TASK.replace('claude_settings: {permissions: {deny: ["Read(./.env)"]}}', "claude_settings: settings.json")
    assert steps_of(tmp_path, settings_file)["agent"]["agent_config"]["settings"] == str(tmp_path.resolve() / "settings.json")
