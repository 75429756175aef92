"""The six core steps against real servers, with the plain asyncio walker."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from fakes.messages_api import text_reply, tool_use_reply

from agentenv_dagster.runtime.artifacts import ObjectStore
from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

EMAIL = {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []}
INBOX = {"id": "inbox", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox", "depends_on": ["email"]}
REPLAY = """
[agents.registry.scribe]
kind = "replay"
episodes = [{match = "note", reply = "noted", actions = [{write_file = "/app/artifact/notes/a.txt", content = "A"}]},
            {match = "nothing", reply = "ok"}]
"""


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", extra_config=REPLAY)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_the_anthropic_agent_uses_the_env_tools_skills_and_system_prompt(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", model={
        "api_key": "sk-test", "base_url": fake_messages_api.base_url, "default": "claude-test",
    }, extra_config='[agents.registry.live]\nkind = "anthropic"\n')
    fake_messages_api.enqueue(
        tool_use_reply("mcp__email__email_search", {"sender": "dana"}),
        tool_use_reply("mcp__email__send", {"to": "dana@example.com", "subject": "Re: Q3 numbers",
                                            "body": "Hi Dana, Q3 is reconciled.\n\nBest regards,\nA"}),
        text_reply("Done: I replied to Dana."),
    )
    context = run_steps(root, [
        EMAIL, INBOX,
        {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "a2a_agent_id": "live", "agent_name": "a",
         "system_prompt": "You are Dana's assistant.", "depends_on": ["email"],
         "skills": [{"name": "tone", "description": "Write politely", "skill_md": "Always sign emails."}]},
        {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": "p", "prompt": "Reply to Dana.",
         "depends_on": ["inbox", "agent"]},
        {"id": "sent", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "dana_reply_check",
         "verifier_id": "sent", "score_aggregator": "weighted_average", "depends_on": ["ask"]},
    ])
    response = context.find_prompt_response("p")
    assert response.response == "Done: I replied to Dana." and response.tool_call_count == 2
    assert response.model == "claude-test" and context.default_agent_model == "claude-test"
    assert context.metadata["verifications"]["sent"]["score"] == 1.0
    first = fake_messages_api.requests[0].body
    assert "You are Dana's assistant." in str(first["system"]) and "Always sign emails." in str(first["system"])
    assert {"mcp__email__email_search", "mcp__email__send"} <= {t["name"] for t in first["tools"]}
    # the search result went back to the model as a tool_result of the inbox loaded via the data plane
    assert "Q3 numbers" in str(fake_messages_api.requests[1].body["messages"])
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_an_env_is_deployed_once_per_run(project):
    with pytest.raises(StepFailed, match=r"Env 'email' is already deployed"):
        run_steps(project, [EMAIL, {**EMAIL, "id": "again", "depends_on": ["email"]}])


def test_an_agent_name_is_deployed_once_per_run(project):
    agent = {"id": "a1", "type": "deploy_agent", "a2a_agent_id": "scribe", "agent_name": "s", "depends_on": []}
    with pytest.raises(StepFailed, match=r"Agent with name 's' is already deployed"):
        run_steps(project, [agent, {**agent, "id": "a2", "depends_on": ["a1"]}])


def test_an_environment_artifact_must_match_the_env(project):
    (project / "artifacts" / "items").mkdir()
    (project / "artifacts" / "items" / "artifact.json").write_text('{"type": "environment", "environment_name": "item-store"}')
    (project / "artifacts" / "items" / "items.json").write_text('{"items": ["a"]}')
    with pytest.raises(StepFailed, match=r"Artifact 'items' is for environment 'item-store', not 'email'"):
        run_steps(project, [EMAIL, {**INBOX, "artifact_id": "items"}])


def test_collect_with_no_files_collects_nothing_and_named_unreadable_files_fail(project):
    agent = {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "scribe", "agent_name": "s", "depends_on": []}
    context = run_steps(project, [agent, {"id": "collect", "type": "collect_artifacts", "agent_name": "s"}])
    assert context.metadata["collected_artifacts"]["collect"] == {"artifacts": {}, "file_artifact_universe": None}

    with pytest.raises(StepFailed, match=r"collect: resolved 1 artifact path\(s\) but produced no file_artifact_universe"):
        run_steps(project, [agent, {"id": "collect", "type": "collect_artifacts", "agent_name": "s",
                                    "artifact_paths": ["missing.txt"]}])


def test_collect_lists_base_path_recursively_and_hands_files_on(project):
    context = run_steps(project, [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "scribe", "agent_name": "s", "depends_on": []},
        {"id": "ask", "type": "prompt_agent", "agent_name": "s", "prompt_id": "p", "prompt": "take a note"},
        {"id": "collect", "type": "collect_artifacts", "agent_name": "s"},
    ])
    entry = context.metadata["collected_artifacts"]["collect"]
    assert list(entry["artifacts"]) == ["notes/a.txt"]
    assert entry["file_artifact_universe"]["version"] == 1


def test_teardown_sandboxes_stops_the_named_agent_and_is_best_effort(project):
    context = run_steps(project, [
        EMAIL,
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "scribe", "agent_name": "s", "depends_on": []},
        {"id": "stop", "type": "teardown_sandboxes", "agent_names": ["s"], "env_ids": ["email"]},
        {"id": "ask", "type": "prompt_agent", "agent_name": "s", "prompt": "nothing", "fail_task_on_error": False},
    ])
    torn = context.metadata["torn_down_sandbox_ids"]
    assert sorted(torn) == sorted([context.deployed_agents[0].instance_id, context.deployed_envs[0].instance_id])
    # the record stays (lists are append-only) but the agent is gone: the prompt fails, tolerated
    assert context.find_agent("s") is not None
    assert [f["step_id"] for f in context.metadata["failed_steps"]] == ["ask"]


def test_seed_templating_substitutes_every_string(project):
    context = run_steps(project, [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "<agent>", "agent_name": "s", "depends_on": []},
        {"id": "ask", "type": "prompt_agent", "agent_name": "s", "prompt_id": "p", "prompt": "<verb> please"},
    ], context={"metadata": {"seed": {"agent": "scribe", "verb": "nothing"}}})
    assert context.find_prompt_response("p").response == "ok"
    assert context.find_prompt_response("p").prompt_text == "nothing please"


def test_env_outcome_scripts_run_outside_the_process_with_a_timeout(project):
    for name, body in {"slow_check": "import time\nasync def verify(url):\n    time.sleep(30)\n",
                       "bad_check": "async def verify(url):\n    raise ValueError('env unreachable')\n"}.items():
        (project / "artifacts" / name).mkdir()
        (project / "artifacts" / name / "artifact.json").write_text('{"type": "file"}')
        (project / "artifacts" / name / "verify.py").write_text(body)
    context = run_steps(project, [
        EMAIL,
        {"id": "slow", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "slow_check",
         "timeout_seconds": 1, "fail_task_on_error": False, "depends_on": ["email"]},
        {"id": "bad", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "bad_check",
         "fail_task_on_error": False, "depends_on": ["email"]},
    ])
    errors = {f["step_id"]: f["error"] for f in context.metadata["failed_steps"]}
    assert errors == {"slow": "verify.py: verify() did not finish within 1s",
                      "bad": "verify.py: verify() failed: ValueError: env unreachable"}


def test_an_env_outcome_script_gets_no_secrets_and_may_print(project, monkeypatch):
    """The script is task data: it runs in a scratch folder, sees none of the op's secrets,
    and what it prints is its own business (the rows travel apart from stdout)."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-must-not-leak")
    checks = {
        "nosy_check": {"verify.py": textwrap.dedent("""\
            import os
            async def verify(url):
                print("looking around", os.getcwd())
                return [{"id": "env", "result": True, "score": 1.0,
                         "key": os.environ.get("ANTHROPIC_API_KEY"), "cwd": os.getcwd(),
                         "sees_config": os.path.exists(".agentenv/config.toml")}]
            """), "helpers.py": "X = 1\n"},
        "two_check": {"a.py": "async def verify(url):\n    return []\n", "b.py": "async def verify(url):\n    return []\n"},
    }
    for name, files in checks.items():
        (project / "artifacts" / name).mkdir()
        (project / "artifacts" / name / "artifact.json").write_text('{"type": "file"}')
        for filename, body in files.items():
            (project / "artifacts" / name / filename).write_text(body)
    context = run_steps(project, [
        EMAIL,
        {"id": "nosy", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "nosy_check",
         "depends_on": ["email"]},
        {"id": "two", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "two_check",
         "fail_task_on_error": False, "depends_on": ["email"]},
    ])
    (row,) = context.metadata["verifications"]["nosy"]["results"]
    assert row["key"] is None and row["sees_config"] is False
    assert not Path(row["cwd"]).exists() and Path(row["cwd"]) != project  # a scratch folder, removed
    assert context.metadata["verifications"]["nosy"]["score"] == 1.0
    (failure,) = context.metadata["failed_steps"]
    assert failure["error"] == "Artifact 'two_check' holds 2 Python scripts (a.py, b.py); name the one to run verify.py"


def test_an_agent_deployed_into_a_sandbox_works_there_with_workspace_tools(project):
    context = run_steps(project, [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm", "depends_on": []},
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "replay", "agent_name": "coder", "sandbox_name": "box",
         "agent_config": {"episodes": [{"match": "hello", "reply": "done", "actions": [
             {"tool": "Write", "arguments": {"file_path": "hello.py", "content": "print('hello')"}},
             {"tool": "Bash", "arguments": {"command": "python hello.py > out.txt"}},
             {"tool": "Bash", "arguments": {"command": "exit 3"}}]}]}},
        {"id": "ask", "type": "prompt_agent", "agent_name": "coder", "prompt_id": "p", "prompt": "write hello"},
        {"id": "check", "type": "verify_sandbox", "sandbox_name": "box", "base_dir": "/", "verifier_id": "v",
         "criteria": [{"type": "probe_file_contains", "paths": ["out.txt"], "expected": "^hello$"}]},
    ])
    assert context.find_prompt_response("p").tool_call_count == 3
    assert context.metadata["verifications"]["v"]["score"] == 1.0
    trajectory = json.loads(ObjectStore.read(context.find_prompt_response("p").agent_trajectory_object_url))
    calls = [(e["name"], e["is_error"]) for e in trajectory if e["type"] == "tool_call"]
    assert calls == [("Write", False), ("Bash", False), ("Bash", True)]
