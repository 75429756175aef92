"""The live tool-use agent (agent kind ``anthropic``) on a model of the ``openai`` protocol:
its tool loop over MCP through Chat Completions, against the fake Chat Completions API."""

from __future__ import annotations

import json

import pytest
from fakes.chat_completions_api import chat_error, chat_text_reply, chat_tool_call
from test_agents import SAVE_NOTE, a2a, notes_env, register, start_agent  # noqa: F401 (fixtures)

pytestmark = pytest.mark.anyio


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
                          "usage": {"input_tokens": 20 + 40, "output_tokens": 12}}  # cached prompt tokens apart
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
