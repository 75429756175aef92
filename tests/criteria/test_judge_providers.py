"""The Coder Eval judges on a model of the ``openai`` protocol (the fake Chat Completions API):
llm_judge's forced function call and its priced usage, and agent_judge's tool loop."""

from __future__ import annotations

import asyncio
import json

import pytest
from criteria_helpers import context, write
from fakes.chat_completions_api import chat_text_reply, chat_tool_call

from agentenv_dagster.config import AgentEnvConfig, ModelConfig
from agentenv_dagster.criteria import parse_criterion


@pytest.fixture
def sandbox(tmp_path):
    return write(tmp_path / "sandbox", {"greet.py": "def greet(name):\n    return 'Hello, ' + name\n"})


def config(api, model="openai-compatible/judge-test") -> AgentEnvConfig:
    return AgentEnvConfig(model=ModelConfig(
        default=model, providers={"openai-compatible": {"base_url": api.base_url, "api_key": "sk-chat"}},
        prices={model: {"input": 1.0, "output": 4.0}}))


def grade(criterion, ctx):
    return asyncio.run(parse_criterion({"description": "greeting", "prompt": "Is greet() right?", **criterion}).evaluate(ctx))


def test_llm_judge_scores_a_forced_function_call_and_prices_its_usage(sandbox, fake_chat_api):
    fake_chat_api.enqueue(chat_tool_call("submit_verdict", {"score": 0.8, "rationale": "Close.", "findings": ["no !"]},
                                         usage=(1000, 100, 400)))
    result = grade({"type": "llm_judge", "files": ["greet.py"]}, context(sandbox, [], config=config(fake_chat_api)))
    assert (result.score, result.details, result.findings) == (0.8, "rationale: Close.", ["no !"])
    usage = result.token_usage
    assert (usage["uncached_input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (600, 400, 100)
    assert usage["model"] == "openai-compatible/judge-test"
    assert usage["total_cost_usd"] == pytest.approx((1000 * 1.0 + 100 * 4.0) / 1e6)
    (request,) = fake_chat_api.requests
    assert request.body["model"] == "judge-test"
    assert request.body["tool_choice"] == {"type": "function", "function": {"name": "submit_verdict"}}
    assert request.body["messages"][0]["role"] == "system" and "submit_verdict" in request.body["messages"][0]["content"]
    assert result.transcript["verdict"][0]["name"] == "submit_verdict"


def test_agent_judge_inspects_the_copy_through_function_calls(sandbox, fake_chat_api):
    fake_chat_api.enqueue(
        chat_tool_call("read_file", {"path": "greet.py"}),
        chat_text_reply("It returns without the '!'."),  # stops talking: one forced call follows
        chat_tool_call("submit_verdict", {"score": 0.3, "rationale": "Missing '!'."}),
    )
    result = grade({"type": "agent_judge"}, context(sandbox, [], config=config(fake_chat_api)))
    assert (result.score, result.details) == (0.3, "rationale: Missing '!'.")
    first, second, third = (r.body for r in fake_chat_api.requests)
    assert {t["function"]["name"] for t in first["tools"]} == {"read_file", "list_files", "grep", "submit_verdict"}
    assert first["tool_choice"] == "auto"
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and "return 'Hello, ' + name" in tool_message["content"]
    assert third["tool_choice"] == {"type": "function", "function": {"name": "submit_verdict"}}
    assert json.dumps(third["messages"]).count("Stop inspecting now") == 1
