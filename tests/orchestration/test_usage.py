"""Token and cost metadata on verification assets: the agent's, a simulated user's, the judge's."""

from __future__ import annotations

import pytest

from agentenv_dagster.context import PromptResponse, TaskStepContext
from agentenv_dagster.orchestration.usage import usage_metadata

PRICES = {"claude-agent": {"input": 3.0, "output": 15.0}, "claude-judge": {"input": 1.0, "output": 5.0}}


def values(metadata: dict) -> dict:
    return {k: v.value for k, v in metadata.items()}


def test_each_bucket_is_summed_and_priced_where_the_model_has_a_price():
    ctx = TaskStepContext(prompt_responses=[
        PromptResponse(prompt_id="p", response="a", model="claude-agent",
                       usage={"input_tokens": 1000, "output_tokens": 200},
                       user_usage={"input_tokens": 50, "output_tokens": 5}),
        PromptResponse(prompt_id="q", response="b", model="claude-agent", usage={"input_tokens": 1000, "output_tokens": 0}),
    ])
    entry = {"judge": {"model": "claude-judge", "usage": {"input_tokens": 400, "output_tokens": 40}},
             "results": [{"id": "c1", "token_usage": {"uncached_input_tokens": 100, "output_tokens": 10,
                                                      "total_cost_usd": 0.001}}]}
    got = values(usage_metadata(ctx, entry, PRICES))
    assert (got["agent_input_tokens"], got["agent_output_tokens"]) == (2000, 200)
    assert got["agent_cost_usd"] == pytest.approx((2000 * 3 + 200 * 15) / 1e6)
    assert (got["user_input_tokens"], got["user_output_tokens"]) == (50, 5)
    assert "user_cost_usd" not in got  # the simulator's model has no price: tokens, no invented cost
    assert (got["judge_input_tokens"], got["judge_output_tokens"]) == (500, 50)
    assert got["judge_cost_usd"] == pytest.approx(0.001 + (400 * 1 + 40 * 5) / 1e6)


def test_an_agent_s_cache_reads_and_writes_are_counted_and_billed_at_their_price_else_the_input_s():
    ctx = TaskStepContext(prompt_responses=[PromptResponse(
        prompt_id="p", response="a", model="claude-agent",
        usage={"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 900})])
    got = values(usage_metadata(ctx, {}, PRICES))
    assert (got["agent_input_tokens"], got["agent_output_tokens"]) == (1030, 10)
    assert got["agent_cost_usd"] == pytest.approx((1030 * 3 + 10 * 15) / 1e6)  # no cache prices: never below what was spent
    cache_priced = {**PRICES, "claude-agent": {**PRICES["claude-agent"], "cache_write": 3.75, "cache_read": 0.3}}
    got = values(usage_metadata(ctx, {}, cache_priced))
    assert got["agent_cost_usd"] == pytest.approx((100 * 3 + 30 * 3.75 + 900 * 0.3 + 10 * 15) / 1e6, abs=1e-6)  # metadata keeps 6 decimals


def test_a_verifier_of_one_prompt_counts_that_prompt_only():
    ctx = TaskStepContext(prompt_responses=[
        PromptResponse(prompt_id="p", response="a", model="claude-agent", usage={"input_tokens": 1000, "output_tokens": 0}),
        PromptResponse(prompt_id="q", response="b", model="claude-agent", usage={"input_tokens": 7, "output_tokens": 0}),
    ])
    assert values(usage_metadata(ctx, {}, PRICES, prompt_id="q"))["agent_input_tokens"] == 7
    assert values(usage_metadata(ctx, {}, PRICES))["agent_input_tokens"] == 1007  # an env's end state: every prompt


def test_nothing_spent_says_nothing():
    ctx = TaskStepContext(prompt_responses=[PromptResponse(prompt_id="p", response="a", model="replay",
                                                           usage={"input_tokens": 0, "output_tokens": 0})])
    assert usage_metadata(ctx, {"results": [{"id": "x"}]}, PRICES) == {}
