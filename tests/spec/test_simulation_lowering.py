"""A Coder Eval ``simulation`` lowers to a simulator deploy and a multi-turn prompt_agent."""

from __future__ import annotations

import textwrap

import pytest

from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.spec.coder_eval import load_coder_eval_task
from agentenv_dagster.spec.coder_eval.lowering import lower_task

TASK = """
task_id: dialog
description: Build a greeting script with the user
initial_prompt: Write hello.py for me.
agent: {type: replay, episodes: [{match: ".", reply: ok}]}
sandbox: {python: null}
reference: {directory: solution}
simulation:
  enabled: true
  persona: A hurried data analyst.
  goal: hello.py prints "hello, world".
  constraints: [Never write code yourself.]
  max_turns: 4
  max_total_tokens: 5000
  stop_on_criteria_pass: true
  check_criteria: every_turn
  simulator:
    type: replay
    episodes: [{match: ".", reply: {message: "thanks <<<END>>>", done: false}}]
success_criteria:
  - {type: file_exists, path: hello.py, description: the script exists}
"""


def lowered(tmp_path, text: str) -> dict[str, dict]:
    (tmp_path / "solution").mkdir(exist_ok=True)
    (tmp_path / "solution" / "hello.py").write_text("print('the secret reference')\n")
    path = tmp_path / "task.yaml"
    path.write_text(textwrap.dedent(text))
    return {s["id"]: s for s in lower_task(load_coder_eval_task(path))}


def test_the_simulator_is_a_tool_less_agent_whose_system_prompt_is_the_persona(tmp_path):
    steps = lowered(tmp_path, TASK)
    assert list(steps) == ["sandbox", "workspace", "agent", "simulator", "prompt", "criteria"]
    simulator = steps["simulator"]
    assert simulator["a2a_agent_id"] == "replay" and simulator["agent_name"] == "simulator"
    assert "sandbox_name" not in simulator and "env_ids" not in simulator  # no tools, no workspace
    assert simulator["agent_config"]["episodes"][0]["reply"] == {"message": "thanks <<<END>>>", "done": False}
    prompt = simulator["system_prompt"]
    for text in ("A hurried data analyst.", 'hello.py prints "hello, world".', "- Never write code yourself.",
                 "<<<END>>>", "Build a greeting script with the user", "Write hello.py for me."):
        assert text in prompt
    assert "secret reference" not in str(simulator) and "solution" not in prompt  # never the reference


def test_the_prompt_is_a_dialog_with_the_simulation_limits(tmp_path):
    prompt = lowered(tmp_path, TASK)["prompt"]
    assert prompt["prompt"] == "Write hello.py for me." and "user_opens_conversation" not in prompt
    assert (prompt["max_conversation_turns"], prompt["user_agent_name"], prompt["user_stop_token"],
            prompt["max_total_tokens"]) == (4, "simulator", "<<<END>>>", 5000)
    criteria = prompt["turn_criteria"]
    assert (criteria["sandbox_name"], criteria["stop_on_pass"]) == ("workspace", True)
    assert [(c["type"], c["path"]) for c in criteria["criteria"]] == [("file_exists", "hello.py")]


def test_without_an_initial_prompt_the_simulator_opens(tmp_path):
    text = TASK.replace("initial_prompt: Write hello.py for me.\n", "").replace(
        "  stop_on_criteria_pass: true\n  check_criteria: every_turn\n", "").replace(
        "  simulator:\n    type: replay\n    episodes: [{match: \".\", reply: {message: \"thanks <<<END>>>\", done: false}}]\n",
        "")
    steps = lowered(tmp_path, text)
    prompt = steps["prompt"]
    assert "prompt" not in prompt and prompt["user_opens_conversation"] is True and "turn_criteria" not in prompt
    assert "You open the conversation" in steps["simulator"]["system_prompt"]
    # no simulator block: the anthropic agent on the configured model plays the user
    assert steps["simulator"]["a2a_agent_id"] == "anthropic" and steps["simulator"]["agent_config"] == {}


def test_a_disabled_simulation_is_a_single_prompt(tmp_path):
    steps = lowered(tmp_path, TASK.replace("enabled: true", "enabled: false"))
    assert "simulator" not in steps and "max_conversation_turns" not in steps["prompt"]


def test_simulation_blocks_are_strict(tmp_path):
    with pytest.raises(TaskLoadError, match=r"simulation.parallel_trials"):
        lowered(tmp_path, TASK.replace("  max_turns: 4\n", "  max_turns: 4\n  parallel_trials: 2\n"))
    with pytest.raises(TaskLoadError, match=r"stop_on_criteria_pass=True requires check_criteria='every_turn' or 'both'"):
        lowered(tmp_path, TASK.replace("check_criteria: every_turn", "check_criteria: end_of_dialog"))
