"""A simulated-user Coder Eval task end to end: a dialog, graded, in task.json."""

from __future__ import annotations

import textwrap

import dagster as dg
import pytest
from fakes.chat_completions_api import chat_text_reply
from fakes.messages_api import text_reply

from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from projects import leaked_servers, make_project

TASK = """
task_id: dialog
description: Write two files, as the user asks
initial_prompt: Write a.txt
agent:
  type: replay
  episodes:
    - {match: "^Write a", reply: "wrote a", actions: [{tool: Write, arguments: {file_path: a.txt, content: A}}]}
    - {match: "^Now b", reply: "wrote b", actions: [{tool: Write, arguments: {file_path: b.txt, content: B}}]}
    - {match: "^Thanks", reply: "you are welcome"}
sandbox: {python: null}
simulation:
  enabled: true
  persona: A terse user.
  goal: a.txt and b.txt exist.
  max_turns: 5
  n_trials: 2
  simulator:
    type: replay
    episodes:
      - {match: "wrote a", reply: "Now b please"}
      - {match: "wrote b", reply: "Thanks <<<END>>>"}
success_criteria:
  - {type: file_exists, path: a.txt, description: a}
  - {type: file_exists, path: b.txt, description: b}
"""


def run(root, text: str, tmp_path):
    path = root / "tasks" / "dialog.yaml"
    path.write_text(textwrap.dedent(text))
    with dg.instance_for_test() as instance:
        return run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance)


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", tasks={})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_each_trial_is_a_dialog_that_ends_on_the_stop_token(project, tmp_path):
    done = run(project, TASK, tmp_path)
    assert [r.replicate_index for r in done.results] == [0, 1] and done.exit_code == 0
    result = done.results[1]
    assert result.final_status.value == "SUCCESS" and result.weighted_score == 1.0
    assert [(t.iteration, t.user_input, t.agent_output) for t in result.iterations] == [
        (1, "Write a.txt", "wrote a"), (2, "Now b please", "wrote b"), (3, "Thanks", "you are welcome")]
    assert [[c.tool_name for c in t.commands] for t in result.iterations] == [["Write"], ["Write"], []]
    assert result.simulation == {
        "n_trials": 2, "replicate_index": 1, "stop_reason": "stop_token", "simulator_input_tokens": 0,
        "simulator_output_tokens": 0, "simulator_failures": 0, "total_turns": 3, "simulator_model": "replay",
        "simulator_cost_usd": None,
    }
    row = done.summary.task_results[1]
    assert (row["iteration_count"], row["total_turns"], row["visible_turns"], row["has_final_reply"]) == (3, 3, 3, True)
    saved = (tmp_path / "out" / "default" / "dialog" / "01" / "task.json").read_text()
    assert '"stop_reason": "stop_token"' in saved and '"user_input": "Now b please"' in saved


@pytest.mark.slow
def test_max_turns_and_stop_on_criteria_pass_end_the_dialog(project, tmp_path):
    capped = run(project, TASK.replace("max_turns: 5", "max_turns: 1").replace("n_trials: 2", "n_trials: 1"), tmp_path)
    (result,) = capped.results
    assert result.simulation["stop_reason"] == "max_turns" and result.iteration_count == 1
    assert result.final_status.value == "FAILURE"  # b.txt was never asked for

    early = TASK.replace("n_trials: 2", "n_trials: 1\n  stop_on_criteria_pass: true\n  check_criteria: every_turn")
    early = early.replace("- {type: file_exists, path: b.txt, description: b}\n", "")
    (result,) = run(project, early, tmp_path / "2").results
    assert result.simulation["stop_reason"] == "criteria_passed" and result.iteration_count == 1
    assert result.final_status.value == "SUCCESS"


@pytest.mark.slow
def test_an_anthropic_simulator_with_a_token_budget(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url,
                                                        "default": "claude-sim"},
                        extra_config='[model.prices.claude-sim]\ninput = 1.0\noutput = 5.0\n')
    text = TASK.replace("  simulator:\n    type: replay\n    episodes:\n"
                        "      - {match: \"wrote a\", reply: \"Now b please\"}\n"
                        "      - {match: \"wrote b\", reply: \"Thanks <<<END>>>\"}\n", "")
    text = text.replace("n_trials: 2", "n_trials: 1\n  max_total_tokens: 100").replace(
        "initial_prompt: Write a.txt\n", "")
    fake_messages_api.enqueue(
        text_reply("Write a.txt now", usage=(40, 10)),   # the opener
        text_reply("Now b please", usage=(45, 10)),       # after "wrote a": 105 tokens >= 100 after turn 2
    )
    (result,) = run(root, text, tmp_path).results
    assert [t.user_input for t in result.iterations] == ["Write a.txt now", "Now b please"]
    assert result.final_status.value == "SUCCESS"
    assert {k: result.simulation[k] for k in ("stop_reason", "simulator_input_tokens", "simulator_output_tokens",
                                              "simulator_model", "total_turns")} == {
        "stop_reason": "budget", "simulator_input_tokens": 85, "simulator_output_tokens": 20,
        "simulator_model": "claude-sim", "total_turns": 2}
    assert result.simulation["simulator_cost_usd"] == pytest.approx((85 * 1.0 + 20 * 5.0) / 1_000_000)
    first = fake_messages_api.requests[0].body
    assert "A terse user." in first["system"] and "a.txt and b.txt exist." in first["system"]
    assert "You open the conversation" in first["system"] and "tools" not in first
    assert first["messages"][0]["content"].startswith("Start the conversation")
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_chat_completions_simulator_opens_the_dialog_and_is_priced(tmp_path, fake_chat_api):
    """A simulator on an ``openai``-protocol model speaks Chat Completions: same dialog, same cost."""
    root = make_project(tmp_path / "p", tasks={}, model={"default": "openai/gpt-sim"},
                        extra_config=f'[model.providers.openai]\nbase_url = "{fake_chat_api.base_url}"\n'
                                     'api_key = "sk-sim"\n[model.prices."openai/gpt-sim"]\ninput = 2.0\noutput = 8.0\n')
    text = TASK.replace("    type: replay\n    episodes:\n      - {match: \"wrote a\", reply: \"Now b please\"}\n"
                        "      - {match: \"wrote b\", reply: \"Thanks <<<END>>>\"}\n",
                        "    {type: anthropic, model: openai/gpt-sim}\n")
    text = text.replace("n_trials: 2", "n_trials: 1").replace("initial_prompt: Write a.txt\n", "")
    fake_chat_api.enqueue(chat_text_reply("Write a.txt now", usage=(40, 5, 0)),
                          chat_text_reply("Now b please", usage=(50, 5, 0)),
                          chat_text_reply("Thanks <<<END>>>", usage=(60, 5, 10)))
    (result,) = run(root, text, tmp_path).results
    assert [t.user_input for t in result.iterations] == ["Write a.txt now", "Now b please", "Thanks"]
    assert (result.final_status.value, result.simulation["stop_reason"]) == ("SUCCESS", "stop_token")
    assert {k: result.simulation[k] for k in ("simulator_input_tokens", "simulator_output_tokens", "simulator_model")} == {
        "simulator_input_tokens": 140, "simulator_output_tokens": 15, "simulator_model": "openai/gpt-sim"}
    assert result.simulation["simulator_cost_usd"] == pytest.approx((140 * 2.0 + 15 * 8.0) / 1_000_000)
    first = fake_chat_api.requests[0]
    assert first.headers["authorization"] == "Bearer sk-sim" and first.body["model"] == "gpt-sim"
    assert first.body["messages"][0]["role"] == "system" and "A terse user." in first.body["messages"][0]["content"]
    assert "tools" not in first.body
    assert leaked_servers(root / ".agentenv" / "state") == []
