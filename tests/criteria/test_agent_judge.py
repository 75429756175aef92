"""agent_judge against the fake Messages API: the isolated sandbox copy and its security
floor, read-only tools confined to the copy, the tool-use loop ending in submit_verdict."""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from criteria_helpers import context, write
from fakes.messages_api import _message, error_reply, text_reply, tool_use_reply
from judge_helpers import judge_config, verdict

from agentenv_dagster.criteria import JudgeInfrastructureError, parse_criterion
from agentenv_dagster.criteria.judge_agent import (
    ReadOnlyTools,
    ToolRefused,
    copy_for_judge,
    offered_tools,
)
from agentenv_dagster.criteria.judges import SECURITY_IGNORE_FLOOR

FLOOR = list(SECURITY_IGNORE_FLOOR)


def agent_judge(**fields):
    return parse_criterion({"type": "agent_judge", "description": "review", "prompt": "Does greet() work?", **fields})


def grade(criterion, ctx):
    return asyncio.run(criterion.evaluate(ctx))


@pytest.fixture
def sandbox(tmp_path):
    return write(tmp_path / "sandbox", {
        "greet.py": "def greet(name):\n    return 'Hello, ' + name\n",
        "pkg/util.py": "def helper():\n    return 42  # TODO tidy\n",
        ".claude/settings.json": '{"hooks": "planted"}', ".mcp.json": '{"mcpServers": {}}',
        "_reference/solution.py": "planted by the agent", ".git/HEAD": "ref: main",
        "pkg/.claude/agents.md": "nested planted",
    })


@pytest.fixture
def reference(tmp_path):
    return write(tmp_path / "reference", {"solution.py": "def greet(name):\n    return f'Hello, {name}!'\n"})


def tool_results(request) -> list[dict]:
    """The tool_result blocks of the last user message of a recorded request."""
    content = request.body["messages"][-1]["content"]
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def files_under(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


def test_the_copy_keeps_the_security_floor_and_mounts_only_the_real_reference(sandbox, reference, tmp_path):
    patterns = agent_judge().agent.ignore_patterns
    copied = copy_for_judge(sandbox, tmp_path / "copy", patterns, reference)
    assert files_under(copied) == ["_reference/solution.py", "greet.py", "pkg/util.py"]
    assert (copied / "_reference" / "solution.py").read_text().startswith("def greet")  # not the planted one
    bare = copy_for_judge(sandbox, tmp_path / "bare", patterns, None)
    assert files_under(bare) == ["greet.py", "pkg/util.py"]
    # the floor holds even when the task narrows the ignore list
    narrowed = agent_judge(agent={"ignore_patterns": ["*.md"]}).agent.ignore_patterns
    assert files_under(copy_for_judge(sandbox, tmp_path / "narrow", narrowed, None)) == [
        ".git/HEAD", "greet.py", "pkg/util.py"]


def test_tools_refuse_paths_outside_the_copy(sandbox, tmp_path):
    secret = write(tmp_path / "host", {"secret.txt": "TOP SECRET"})
    os.symlink(secret / "secret.txt", sandbox / "link.txt")
    os.symlink(secret, sandbox / "linkdir")
    copied = copy_for_judge(sandbox, tmp_path / "copy", FLOOR, None)
    tools = ReadOnlyTools(copied)
    for path in ("../host/secret.txt", str(secret / "secret.txt"), "/etc/passwd", "link.txt", "linkdir", "linkdir/secret.txt"):
        with pytest.raises(ToolRefused, match=re.escape(f"path '{path}' is outside the workspace copy")):
            tools.run("read_file", {"path": path})
    with pytest.raises(ToolRefused, match="is outside the workspace copy"):
        tools.run("list_files", {"path": ".."})
    with pytest.raises(ToolRefused, match="is outside the workspace copy"):
        tools.run("grep", {"pattern": "SECRET", "path": "linkdir"})
    assert tools.run("grep", {"pattern": "SECRET"}) == "(no matches)"  # links out are not followed
    assert "TOP SECRET" not in tools.run("list_files", {"recursive": True})
    with pytest.raises(ToolRefused, match="unknown tool 'write_file'"):
        tools.run("write_file", {"path": "x", "content": "y"})


def test_tools_read_list_and_grep_the_copy(sandbox, tmp_path):
    tools = ReadOnlyTools(copy_for_judge(sandbox, tmp_path / "copy", FLOOR, None))
    assert tools.run("read_file", {"path": "greet.py"}) == "     1\tdef greet(name):\n     2\t    return 'Hello, ' + name"
    assert tools.run("read_file", {"path": "greet.py", "offset": 2, "limit": 1}) == "     2\t    return 'Hello, ' + name"
    assert tools.run("list_files", {}).splitlines() == [".git/", "greet.py", "pkg/"]
    assert tools.run("grep", {"pattern": r"TODO|Hello", "glob": "*.py"}) == (
        "greet.py:2:     return 'Hello, ' + name\npkg/util.py:2:     return 42  # TODO tidy")
    with pytest.raises(ToolRefused, match="invalid regular expression"):
        tools.run("grep", {"pattern": "("})
    assert offered_tools(["Bash", "Read", "Glob", "Grep"], None) == ("read_file", "list_files", "grep")
    assert offered_tools(["Read", "Grep", "Write"], ["Grep"]) == ("read_file",)


def test_the_judge_inspects_the_copy_then_submits_its_verdict(sandbox, reference, fake_messages_api):
    api = fake_messages_api
    api.enqueue(
        tool_use_reply("list_files", {"path": ".", "recursive": True}, usage=(100, 10)),
        tool_use_reply("read_file", {"path": "_reference/solution.py"}, usage=(200, 10)),
        tool_use_reply("read_file", {"path": "/etc/passwd"}, usage=(300, 10)),
        verdict(0.4, "greet() lacks the '!'.", ["greet.py:2 no exclamation mark"], usage=(400, 20)),
    )
    result = grade(agent_judge(files=["greet.py"]), context(sandbox, [], reference_dir=reference,
                                                           config=judge_config(api)))
    assert (result.score, result.passed, result.error) == (0.4, False, None)
    assert result.details == "rationale: greet() lacks the '!'." and result.findings == ["greet.py:2 no exclamation mark"]
    assert (result.token_usage["uncached_input_tokens"], result.token_usage["output_tokens"]) == (1000, 50)
    assert result.token_usage["total_cost_usd"] == pytest.approx((1000 * 3 + 50 * 15) / 1e6)
    first = api.requests[0].body
    assert {t["name"] for t in first["tools"]} == {"read_file", "list_files", "grep", "submit_verdict"}
    assert first["tool_choice"] == {"type": "auto"} and "read-only copy" in first["system"]
    prompt = first["messages"][0]["content"]
    assert "mounted read-only at _reference/" in prompt and "return f'Hello" not in prompt  # mounted, not inlined
    assert "--- FILE: greet.py ---" in prompt
    (listing,) = tool_results(api.requests[1])
    assert listing["content"].splitlines() == ["_reference/solution.py", "greet.py", "pkg/util.py"]
    (read,) = tool_results(api.requests[2])
    assert "return f'Hello, {name}!'" in read["content"]
    (refused,) = tool_results(api.requests[3])
    assert refused == {"type": "tool_result", "tool_use_id": refused["tool_use_id"], "is_error": True,
                       "content": "Error: path '/etc/passwd' is outside the workspace copy"}
    assert len(api.requests) == 4
    assert result.transcript["turns"] == 4 and [c["ok"] for c in result.transcript["tool_calls"]] == [True, True, False]
    assert "return f'Hello, {name}!'" not in str(result.to_dict())  # the reference is scrubbed from the transcript


def test_a_judge_that_stops_talking_is_forced_to_submit(sandbox, fake_messages_api):
    api = fake_messages_api
    api.enqueue(text_reply("It looks fine to me."), verdict(0.8))
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(api)))
    assert (result.score, result.error) == (0.8, None)
    forced = api.requests[1].body
    assert forced["tool_choice"] == {"type": "tool", "name": "submit_verdict"}
    assert forced["messages"][-1] == {"role": "user", "content": "Stop inspecting now and call submit_verdict with your verdict."}


def test_out_of_turns_the_verdict_is_forced(sandbox, fake_messages_api):
    api = fake_messages_api
    api.enqueue(tool_use_reply("grep", {"pattern": "def"}), tool_use_reply("grep", {"pattern": "return"}), verdict(1.0))
    result = grade(agent_judge(max_turns=2), context(sandbox, [], config=judge_config(api)))
    assert result.score == 1.0 and len(api.requests) == 3
    assert api.requests[2].body["tool_choice"] == {"type": "tool", "name": "submit_verdict"}
    last = api.requests[2].body["messages"][-1]["content"]
    assert last[0]["type"] == "tool_result" and last[-1]["type"] == "text"


def test_a_judge_that_never_submits_scores_zero(sandbox, fake_messages_api):
    fake_messages_api.enqueue(text_reply("Fine."), text_reply("Still fine."))
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(fake_messages_api)))
    assert (result.score, result.error) == (0.0, "Judge did not call submit_verdict")


def test_an_invalid_verdict_is_answered_with_its_error_and_can_be_replaced(sandbox, fake_messages_api):
    api = fake_messages_api
    api.enqueue(tool_use_reply("submit_verdict", {"score": "great"}), verdict(0.7))
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(api)))
    assert (result.score, result.error) == (0.7, None)
    (answer,) = tool_results(api.requests[1])
    assert answer["is_error"] and answer["content"].startswith("Invalid verdict: score field is not a number: 'great'")


def test_an_invalid_call_after_a_valid_one_clears_it(sandbox, fake_messages_api):
    blocks = [{"type": "tool_use", "id": "toolu_a", "name": "submit_verdict", "input": {"score": 0.9}},
              {"type": "tool_use", "id": "toolu_b", "name": "submit_verdict", "input": {"rationale": "oops"}}]
    fake_messages_api.enqueue(_message(blocks, "tool_use", 0.0, (10, 5)), text_reply("no more"), text_reply("none"))
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(fake_messages_api)))
    assert (result.score, result.error) == (0.0, "Judge did not call submit_verdict")
    fake_messages_api.enqueue(_message(blocks, "tool_use", 0.0, (10, 5)), text_reply("done"),
                              tool_use_reply("submit_verdict", {}))  # the forced call is malformed too
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(fake_messages_api)))
    assert (result.score, result.error) == (0.0, "score field missing in judge verdict")


def test_no_tools_allowed_offers_only_the_verdict(sandbox, fake_messages_api):
    fake_messages_api.enqueue(verdict(0.9))
    grade(agent_judge(allowed_tools=[]), context(sandbox, [], config=judge_config(fake_messages_api)))
    assert [t["name"] for t in fake_messages_api.requests[0].body["tools"]] == ["submit_verdict"]


def test_a_judge_turn_timeout_scores_zero(sandbox, fake_messages_api):
    criterion = agent_judge(turn_timeout=10)
    object.__setattr__(criterion, "turn_timeout", 0.2)  # bypass ge=10 to keep the test fast
    fake_messages_api.enqueue(verdict(1.0, delay_seconds=2))
    result = grade(criterion, context(sandbox, [], config=judge_config(fake_messages_api)))
    assert (result.score, result.error) == (0.0, "judge turn 1 timed out after 0.2s")


def test_api_errors_fail_the_task_and_no_key_is_not_graded(sandbox, fake_messages_api, monkeypatch):
    fake_messages_api.enqueue(error_reply(401, "invalid x-api-key"))
    with pytest.raises(JudgeInfrastructureError, match=re.escape(
            "agent_judge 'review': judge API error 401 (authentication_error) for model 'claude-test': invalid x-api-key")):
        grade(agent_judge(), context(sandbox, [], config=judge_config(fake_messages_api)))
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    result = grade(agent_judge(), context(sandbox, [], config=judge_config(fake_messages_api, api_key="env:NO_SUCH_JUDGE_KEY")))
    assert (result.score, result.evaluation_status) == (None, "not_evaluated")
    assert result.details.startswith("not graded: no judge configured")
    assert len(fake_messages_api.requests) == 1


def test_the_agent_model_and_the_judge_role(sandbox, fake_messages_api):
    fake_messages_api.enqueue(verdict(), verdict())
    ctx = context(sandbox, [], config=judge_config(fake_messages_api))
    grade(agent_judge(), ctx)
    grade(agent_judge(model="claude-haiku-4-5"), ctx)  # the legacy key, moved under agent
    assert [r.body["model"] for r in fake_messages_api.requests] == ["claude-test", "claude-haiku-4-5"]


def test_reference_reads_are_left_out_of_the_transcript():
    from agentenv_dagster.criteria.judge_agent import without_reference_reads

    def turn(i, name, arguments, content):
        use = {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": name, "input": arguments}]}
        return [use, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": content}]}]

    messages = [*turn(1, "read_file", {"path": "./_reference/solution.py"}, "SECRET"),
                *turn(2, "grep", {"pattern": "def"}, "_reference/solution.py:1: SECRET\ngreet.py:1: def greet"),
                *turn(3, "read_file", {"path": "greet.py"}, "def greet")]
    results = [m["content"][0]["content"] for m in without_reference_reads(messages) if m["role"] == "user"]
    assert results == ["(reference content omitted from the transcript)",
                       "greet.py:1: def greet\n(1 reference line(s) omitted from the transcript)", "def greet"]
