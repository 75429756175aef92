"""llm_judge and agent_judge: their task-file models load; with no judge key, not graded."""

from __future__ import annotations

import re

import pytest
from criteria_helpers import context, grade
from pydantic import ValidationError

from agentenv_dagster.criteria import parse_criterion, task_passed, weighted_score


def judge(kind="llm_judge", **fields):
    return parse_criterion({"type": kind, "description": "d", "prompt": "Grade it.", **fields})


def test_llm_judge_defaults():
    model = judge()
    assert (model.enabled, model.files, model.include_reference, model.include_agent_output, model.include_tool_calls,
            model.include_dialog) == (True, [], True, False, False, False)
    assert (model.model, model.temperature, model.max_tokens, model.max_file_chars, model.max_dialog_chars) == (
        "anthropic.claude-sonnet-4-6", 0.0, 2000, 20000, 80000)
    assert (model.capture_transcript, model.max_transcript_chars, model.pass_threshold) == (True, 100000, 0.7)


def test_corpus_llm_judge_loads():
    model = judge(files=["main.py", "$TASK_DIR/../shared/rubric.md", "$REFERENCE_DIR/solution.py"],
                  include_agent_output=True, include_dialog=True, max_tokens=1000, model="anthropic.claude-haiku",
                  temperature=0.2, weight=2.0, pass_threshold=0.8)
    assert model.files[1] == "$TASK_DIR/../shared/rubric.md"


@pytest.mark.parametrize("fields, message", [
    ({"verdict_channel": "text"}, "'verdict_channel' was removed"),
    ({"temperature": 2.5}, "less than or equal to 2"),
    ({"max_tokens": 0}, "greater than 0"),
    ({"files": ["/etc/passwd"]}, "is absolute"),
    ({"files": ["../outside.py"]}, "escapes the sandbox"),
    ({"prompt": None}, "prompt\n  Input should be a valid string"),
])
def test_llm_judge_validation(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        judge(**fields)


def test_a_disabled_judge_scores_one_without_a_call(tmp_path):
    result = grade(judge(enabled=False), context(tmp_path, []))
    assert (result.score, result.details, result.result_kind) == (1.0, "(skipped: enabled=false)", "judge")


@pytest.mark.parametrize("kind", ["llm_judge", "agent_judge"])
def test_an_enabled_judge_without_a_key_is_not_graded(tmp_path, kind, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("AGENT_ENV_CONFIG", raising=False)
    result = grade(judge(kind), context(tmp_path, []))
    assert (result.score, result.evaluation_status, result.error) == (None, "not_evaluated", None)
    assert result.details == ("not graded: no judge configured: set [model] api_key in .agentenv/config.toml "
                              "or ANTHROPIC_API_KEY")
    assert task_passed([result]) is None and weighted_score([result]) is None


def test_agent_judge_defaults_and_security_floor():
    model = judge("agent_judge")
    assert (model.max_turns, model.turn_timeout, model.include_reference, model.pass_threshold) == (50, 300, True, 0.7)
    agent = model.agent
    assert (agent.type, agent.model, agent.permission_mode) == ("claude-code", "claude-sonnet-4-6", "bypassPermissions")
    assert model.agent.allowed_tools == ["Bash", "Read", "Glob", "Grep"]
    assert model.agent.ignore_patterns == [
        ".git", "node_modules", "__pycache__", ".venv", ".claude", ".mcp.json", "_reference"]
    narrowed = judge("agent_judge", agent={"model": "claude-opus-4-6", "ignore_patterns": ["build"],
                                           "sdk_options": {"effort": "low"}})
    assert narrowed.agent.ignore_patterns == ["build", ".claude", ".mcp.json", "_reference"]


def test_agent_judge_legacy_keys_move_under_agent():
    legacy = judge("agent_judge", model="claude-haiku-4-5-20251001", max_turns=8, allowed_tools=[],
                   files=["greet.py"], pass_threshold=0.8)
    assert (legacy.agent.model, legacy.agent.allowed_tools, legacy.max_turns) == ("claude-haiku-4-5-20251001", [], 8)
    with pytest.raises(ValidationError, match="'model' is set both on the criterion and under 'agent'"):
        judge("agent_judge", model="a", agent={"model": "b"})


@pytest.mark.parametrize("fields, message", [
    ({"turn_timeout": 5}, "greater than or equal to 10"),
    ({"agent": {"type": "codex"}}, "Input should be 'claude-code'"),
    ({"agent": {"tools": []}}, "tools\n  Extra inputs are not permitted"),
    ({"max_turns": 0}, "greater than 0"),
])
def test_agent_judge_validation(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        judge("agent_judge", **fields)
