"""Builders shared by the judge tests: a config pointing at the fake Messages API, verdict replies."""

from __future__ import annotations

from fakes.messages_api import tool_use_reply

from agentenv_dagster.config import AgentEnvConfig, ModelConfig

PRICES = {"claude-test": {"input": 3.0, "output": 15.0}}


def judge_config(api, **model) -> AgentEnvConfig:
    """[model] for the fake API: key, base_url, judge role ``claude-test`` (priced)."""
    fields = {"api_key": "sk-test-judge", "base_url": api.base_url, "default": "claude-test", "prices": PRICES, **model}
    return AgentEnvConfig(model=ModelConfig(**fields))


def verdict(score=0.9, rationale="Meets the prompt.", findings=("greet() returns the greeting",), **reply):
    return tool_use_reply("submit_verdict", {"score": score, "rationale": rationale, "findings": list(findings)}, **reply)
