"""The embedded agents, started for real as subprocesses, against a tiny in-thread MCP env (the
tool-use agent on the fake Messages API, and on the fake Chat Completions API for a model of the
``openai`` protocol)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

import httpx
import pytest
from fakes.chat_completions_api import chat_error, chat_text_reply, chat_tool_call
from fakes.messages_api import ThreadedServer, error_reply, text_reply, tool_use_reply
from mcp.server.mcpserver import MCPServer

from agentenv_dagster.runtime.a2a_client import (
    AGENT_CONFIG_URI,
    MCP_CONFIG_URI,
    SKILL_CONFIG_URI,
    TRAJECTORY_URI,
    A2AClient,
)
from agentenv_dagster.runtime.processes import ServerStartError, is_running, spawn_server, terminate

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
SAVE_NOTE = "mcp__notes__save_note"
TOKEN = secrets.token_urlsafe(32)  # the agents' run token: every request to them carries it
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class NotesEnv:
    """A one-tool MCP env; every call the agent makes lands in ``notes``, the headers of
    every HTTP request in ``headers``."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.headers: list[dict[str, str]] = []
        server = MCPServer("notes")

        @server.tool()
        def save_note(text: str) -> str:
            """Save a note."""
            self.notes.append(text)
            return f"saved note {len(self.notes)}"

        mcp_app = server.streamable_http_app(stateless_http=True, json_response=True)

        async def app(scope, receive, send):
            if scope["type"] == "http":
                self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
            await mcp_app(scope, receive, send)

        self.app = app
        self.url = ""


@pytest.fixture
def notes_env():
    env = NotesEnv()
    with ThreadedServer(env.app) as server:
        env.url = server.url + "/mcp"
        yield env


@pytest.fixture
def start_agent(tmp_path):
    """Start agents with ``start(kind, config, env)`` -> (url, sandbox dir); all are ended
    afterwards, and the test fails if one survives."""
    pids: list[int] = []
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    def start(kind: str, config: dict, env: dict | None = None) -> tuple[str, Path]:
        n = len(pids)
        config_file = tmp_path / f"agent{n}.json"
        config_file.write_text(json.dumps(config))
        sandbox = tmp_path / f"sandbox{n}"
        proc = spawn_server(
            "agentenv_dagster.builtin.agents",
            [kind, "--sandbox", str(sandbox), "--config-file", str(config_file)],
            workdir=tmp_path / f"agent{n}", ttl_seconds=120,
            env={"PYTHONPATH": pythonpath, **(env or {})}, token=TOKEN,
        )
        pids.append(proc.pid)
        return proc.url, sandbox

    yield start
    for pid in pids:
        terminate(pid)
    assert not [pid for pid in pids if is_running(pid)]


@pytest.fixture
async def a2a():
    async with httpx.AsyncClient(timeout=30, headers=AUTH) as http:
        yield A2AClient(http)


async def register(a2a: A2AClient, url: str, mcp_url: str, name: str | None = "notes",
                   **extra) -> dict:
    card = await a2a.get_card(url)
    body = {"url": mcp_url, **extra} | ({"name": name} if name else {})
    await a2a.post_extension(url, card, MCP_CONFIG_URI, body)
    return card


async def test_card_declares_the_agentenv_extensions(start_agent, a2a):
    url, _ = start_agent("replay", {"name": "scripted", "episodes": []})
    card = await a2a.get_card(url)
    assert httpx.get(url + "/.well-known/agent.json", headers=AUTH).json() == card
    assert card["name"] == "scripted"
    assert card["supportedInterfaces"][0]["url"] == url + "/"
    params = {e["uri"]: e["params"] for e in card["capabilities"]["extensions"]}
    assert params[MCP_CONFIG_URI]["endpoint"] == "/ext/mcp-config"
    assert "name" in params[MCP_CONFIG_URI]["methods"]["add"]["request"]["optional"]
    assert set(params[AGENT_CONFIG_URI]["methods"]["set"]["request"]["supported"]) == {
        "model", "system_prompt", "max_turns", "timeout_seconds", "task_id", "model_params",
        "name", "description", "role", "stop_early"}
    assert params[SKILL_CONFIG_URI]["endpoint"] == "/ext/skill-config"
    assert params[TRAJECTORY_URI]["endpoint"] == "/ext/trajectory"


def test_a_stop_early_config_is_checked_when_it_is_set(start_agent):
    url, _ = start_agent("replay", {"episodes": []})
    unarmed = {"criteria": [{"type": "file_exists", "path": "a", "description": "d"}]}
    refused = httpx.post(url + "/ext/agent-config", json={"stop_early": unarmed}, headers=AUTH)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith("stop_early: a watcher needs criteria that each carry a stop_early block")
    armed = {"criteria": [{"type": "command_executed", "description": "d", "stop_early": {}}], "gate_threshold": 0.5}
    assert httpx.post(url + "/ext/agent-config", json={"stop_early": armed}, headers=AUTH).json()["config"]["stop_early"] == armed


async def test_config_extensions_store_and_list(start_agent, a2a, notes_env):
    url, _ = start_agent("replay", {"episodes": []})
    card = await register(a2a, url, notes_env.url)
    await register(a2a, url, notes_env.url, name=None)
    listed = await a2a.get_extension(url, card, MCP_CONFIG_URI)
    assert listed == {"mcp_servers": [{"name": "notes", "url": notes_env.url},
                                      {"name": "env2", "url": notes_env.url}]}
    config = {"system_prompt": "Be brief.", "role": "solver"}
    await a2a.post_extension(url, card, AGENT_CONFIG_URI, config)
    assert (await a2a.get_extension(url, card, AGENT_CONFIG_URI))["config"] == config
    skill = {"name": "triage", "description": "Sort mail", "skill_md": "# Triage"}
    assert (await a2a.post_extension(url, card, SKILL_CONFIG_URI, skill))["skills"] == [skill]


async def test_replay_plays_the_matching_episode(start_agent, a2a, notes_env):
    config = {"episodes": [
        {"match": "never", "reply": "wrong episode"},
        {"match": r"refund #\d+", "reply": "Refund noted.", "actions": [
            {"tool": SAVE_NOTE, "arguments": {"text": "refund 42"}},
            {"write_file": "/app/artifact/summary.txt", "content": "refund 42 done"},
            {"tool": "save_note", "arguments": {"text": "bare name"}},
        ]},
    ]}
    url, sandbox = start_agent("replay", config)
    card = await register(a2a, url, notes_env.url, headers={"X-Env-Token": "t0k"})

    reply = await a2a.send_and_wait(url, "Please handle refund #42", timeout_seconds=20)

    assert (reply.state, reply.text) == ("completed", "Refund noted.")
    assert reply.data == {"tool_call_count": 2, "model": "replay",
                          "usage": {"input_tokens": 0, "output_tokens": 0}}
    assert notes_env.notes == ["refund 42", "bare name"]
    assert {h.get("x-env-token") for h in notes_env.headers} == {"t0k"}
    assert (sandbox / "app/artifact/summary.txt").read_text() == "refund 42 done"
    events = await a2a.get_trajectory(url, card, reply.task_id)
    assert [e["type"] for e in events] == [
        "message", "tool_call", "file_write", "tool_call", "message"]
    call = events[1]
    assert call["name"] == SAVE_NOTE and call["arguments"] == {"text": "refund 42"}
    assert (call["is_error"], call["result"]) == (False, "saved note 1")
    assert call["duration_seconds"] >= 0 and call["started_at"]
    assert events[-1] == {"type": "message", "role": "assistant", "text": "Refund noted."}


async def test_replay_without_a_matching_episode_fails(start_agent, a2a):
    url, _ = start_agent("replay", {"episodes": [{"match": "refund", "reply": "ok"}]})
    reply = await a2a.send_and_wait(url, "What is the weather?", timeout_seconds=20)
    assert reply.state == "failed"
    assert reply.data["error_type"] == "NoScriptedReply"
    assert "What is the weather?" in reply.data["error_message"]


async def test_replay_honours_its_delay(start_agent, a2a):
    url, _ = start_agent("replay", {"delay_seconds": 0.6,
                                    "episodes": [{"match": "", "reply": "late"}]})
    started = time.monotonic()
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=20, poll_interval=0.05)
    assert reply.text == "late" and time.monotonic() - started >= 0.6


async def test_timeouts_and_unreachable_envs_fail_the_task(start_agent, a2a):
    url, _ = start_agent("replay", {"episodes": [
        {"match": "", "reply": "x", "actions": [{"sleep": 10}]}]})
    card = await a2a.get_card(url)
    await a2a.post_extension(url, card, AGENT_CONFIG_URI, {"timeout_seconds": 0.3})
    slow = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert slow.state == "failed"
    assert (slow.data["error_type"], slow.data["error_message"]) == (
        "AgentTimeout", "no reply within timeout_seconds=0.3")

    await a2a.post_extension(url, card, AGENT_CONFIG_URI, {"timeout_seconds": None})
    await register(a2a, url, "http://127.0.0.1:9/mcp", name="gone")
    broken = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert broken.data["error_type"] == "MCPConnectionError"
    assert broken.data["error_message"].startswith("MCP server 'gone' at http://127.0.0.1:9/mcp: ")


def test_a_broken_replay_script_fails_at_start(start_agent):
    with pytest.raises(ServerStartError, match="replay episode 0: 'match' must be a regular"):
        start_agent("replay", {"episodes": [{"match": "(", "reply": "x"}]})


def anthropic_config(fake) -> dict:
    return {"model": "claude-test", "base_url": fake.base_url, "max_tokens": 256}


async def test_anthropic_agent_runs_a_tool_loop(start_agent, a2a, notes_env, fake_messages_api):
    fake_messages_api.enqueue(
        tool_use_reply(SAVE_NOTE, {"text": "from the model"}, text="Saving."),
        text_reply("All saved."),
    )
    url, _ = start_agent("anthropic", anthropic_config(fake_messages_api),
                         env={"ANTHROPIC_API_KEY": "sk-test"})
    card = await register(a2a, url, notes_env.url)
    await a2a.post_extension(url, card, AGENT_CONFIG_URI, {"system_prompt": "Be brief."})

    reply = await a2a.send_and_wait(url, "Save a note", timeout_seconds=20)

    assert (reply.state, reply.text) == ("completed", "All saved.")
    assert reply.data == {"tool_call_count": 1, "model": "claude-test",
                          "usage": {"input_tokens": 20, "output_tokens": 10,
                                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
    assert notes_env.notes == ["from the model"]
    first, second = fake_messages_api.requests
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body["system"] == "Be brief." and first.body["model"] == "claude-test"
    assert [t["name"] for t in first.body["tools"]] == [SAVE_NOTE]
    assert first.body["tools"][0]["input_schema"]["required"] == ["text"]
    tool_use_id = second.body["messages"][1]["content"][-1]["id"]
    assert second.body["messages"][2]["content"] == [{
        "type": "tool_result", "tool_use_id": tool_use_id, "content": "saved note 1",
        "is_error": False}]
    events = await a2a.get_trajectory(url, card, reply.task_id)
    assert [e.get("role") or e["name"] for e in events] == [
        "user", "assistant", SAVE_NOTE, "assistant"]


async def test_anthropic_agent_retries_rate_limits(start_agent, a2a, fake_messages_api):
    fake_messages_api.enqueue(
        error_reply(429, "slow down", retry_after_seconds=0.05), text_reply("ok"))
    url, _ = start_agent("anthropic", anthropic_config(fake_messages_api),
                         env={"ANTHROPIC_API_KEY": "sk-test"})
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert (reply.state, reply.text) == ("completed", "ok")
    assert len(fake_messages_api.requests) == 2


@pytest.mark.parametrize("status, requests, message", [
    (529, 3, "Messages API error 529 (overloaded_error): scripted error"),  # 1 call + the SDK's 2 retries
    (400, 1, "Messages API error 400 (invalid_request_error): scripted error"),  # refused: never retried
])
async def test_anthropic_agent_fails_clearly_on_what_the_sdk_gives_up(
    start_agent, a2a, fake_messages_api, status, requests, message
):
    fake_messages_api.enqueue(*[error_reply(status, retry_after_seconds=0.01)] * 3)
    url, _ = start_agent("anthropic", anthropic_config(fake_messages_api), env={"ANTHROPIC_API_KEY": "sk-test"})
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=30)
    assert reply.state == "failed"
    assert (reply.data["error_type"], reply.data["error_message"]) == ("ModelAPIError", message)
    assert len(fake_messages_api.requests) == requests


async def test_anthropic_agent_past_its_turn_timeout_fails_as_a_timeout(start_agent, a2a, fake_messages_api):
    fake_messages_api.enqueue(text_reply("too late", delay_seconds=5))
    url, _ = start_agent("anthropic", anthropic_config(fake_messages_api), env={"ANTHROPIC_API_KEY": "sk-test"})
    card = await a2a.get_card(url)
    await a2a.post_extension(url, card, AGENT_CONFIG_URI, {"timeout_seconds": 1})
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=30)
    assert reply.state == "failed"
    assert (reply.data["error_type"], reply.data["error_message"]) == ("AgentTimeout", "no reply within timeout_seconds=1")


async def test_anthropic_agent_without_a_key_fails_clearly(
    start_agent, a2a, fake_messages_api, monkeypatch
):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    url, _ = start_agent("anthropic", anthropic_config(fake_messages_api))
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert reply.state == "failed"
    assert reply.data["error_type"] == "MissingAPIKey"
    assert "ANTHROPIC_API_KEY is not set" in reply.data["error_message"]
    assert fake_messages_api.requests == []


# -- the tool-use agent on a model of the openai protocol (Chat Completions) -------------------
def chat_agent_config(api) -> dict:
    """A host config as the local provider writes it: the providers, each key in a variable."""
    return {"model": "openai-compatible/qwen-test", "max_tokens": 256, "providers": {
        "openai-compatible": {"protocol": "openai", "base_url": api.base_url,
                              "api_key": "env:AGENTENV_OPENAI_COMPATIBLE_API_KEY"}}}


async def test_the_agent_runs_its_tool_loop_through_chat_completions(start_agent, a2a, notes_env, fake_chat_api):
    fake_chat_api.enqueue(
        chat_tool_call(SAVE_NOTE, {"text": "from the model"}, text="Saving.", usage=(30, 8, 10)),
        chat_text_reply("All saved.", usage=(40, 4, 0)),
    )
    url, _ = start_agent("anthropic", chat_agent_config(fake_chat_api),
                         env={"AGENTENV_OPENAI_COMPATIBLE_API_KEY": "sk-chat"})
    card = await register(a2a, url, notes_env.url)
    await a2a.post_extension(url, card, "urn:agentenv:agent-config/v1", {"system_prompt": "Be brief."})

    reply = await a2a.send_and_wait(url, "Save a note", timeout_seconds=20)

    assert (reply.state, reply.text) == ("completed", "All saved.")
    assert reply.data == {"tool_call_count": 1, "model": "openai-compatible/qwen-test",
                          "usage": {"input_tokens": 20 + 40, "output_tokens": 12,  # cached prompt tokens apart
                                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 10}}
    assert notes_env.notes == ["from the model"]
    first, second = fake_chat_api.requests
    assert first.headers["authorization"] == "Bearer sk-chat"
    assert first.body["model"] == "qwen-test" and first.body["max_tokens"] == 256
    assert first.body["messages"] == [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "Save a note"}]
    (tool,) = first.body["tools"]
    assert tool["type"] == "function" and tool["function"]["name"] == SAVE_NOTE
    assert tool["function"]["parameters"]["required"] == ["text"]
    call = second.body["messages"][2]
    assert call["role"] == "assistant" and call["content"] == "Saving."
    assert json.loads(call["tool_calls"][0]["function"]["arguments"]) == {"text": "from the model"}
    assert second.body["messages"][3] == {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                                          "content": "saved note 1"}


async def test_an_api_refusal_fails_the_task_with_the_apis_words(start_agent, a2a, fake_chat_api):
    fake_chat_api.enqueue(chat_error(400, "model 'qwen-test' not found"))
    url, _ = start_agent("anthropic", chat_agent_config(fake_chat_api),
                         env={"AGENTENV_OPENAI_COMPATIBLE_API_KEY": "sk-chat"})
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert reply.state == "failed"
    assert (reply.data["error_type"], reply.data["error_message"]) == (
        "ModelAPIError", "Chat Completions API error 400 (invalid_request_error): model 'qwen-test' not found")


async def test_an_openai_model_without_its_key_fails_clearly(start_agent, a2a, fake_chat_api, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url, _ = start_agent("anthropic", {"model": "openai/gpt-test", "providers": {
        "openai": {"protocol": "openai", "base_url": fake_chat_api.base_url, "api_key": "env:OPENAI_API_KEY"}}})
    reply = await a2a.send_and_wait(url, "hi", timeout_seconds=20)
    assert reply.state == "failed" and reply.data["error_type"] == "MissingAPIKey"
    assert reply.data["error_message"].startswith("OPENAI_API_KEY is not set in the agent's environment")
    assert fake_chat_api.requests == []
