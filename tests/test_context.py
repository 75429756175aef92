"""TaskStepContext (reference agentenv.md §2): tolerant loading, lookups, the merge of ancestor
contexts, secret redaction; seed templating, structured output parsing and score aggregation
(§3 prompt_agent / rubrics_verifier)."""

from __future__ import annotations

import copy
import json

import pytest
from pydantic import ValidationError

from agentenv_dagster.context import (
    SECRET_KEYS,
    DeployedAgent,
    DeployedEnv,
    TaskStepContext,
    redact,
    redacted_json,
)
from agentenv_dagster.steps import BUILTIN_STEPS
from agentenv_dagster.steps.execution import apply_seed, parse_structured_output
from agentenv_dagster.steps.scoring import aggregate, row_score, verification_passed

EMPTY = {"deployed_envs": [], "deployed_agents": [], "deployed_sandboxes": [], "prompt_responses": [],
         "metadata": {}}
UPSTREAM_SECRETS = ["litellm_api_key", "judge_litellm_api_key", "usersim_api_key", "remote_tokens",
                    "cf_access_client_secret"]


def ctx(**data) -> TaskStepContext:
    return TaskStepContext.from_dict(data)


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [None, {}])
def test_from_dict_tolerates_missing_keys(data):
    context = TaskStepContext.from_dict(data)
    assert context.to_dict() == EMPTY
    assert (context.agent_model, context.default_agent_model, context.instance_id) == (None, None, None)


def test_from_dict_keeps_unknown_keys_at_every_level():
    data = {
        "deployed_envs": [{"env_id": "email", "env_version": "1", "gateway_url": "http://g", "sandbox_ids": {"a": "1"}}],
        "deployed_agents": [{"agent_name": "default-agent", "api_url": "http://a", "network_policy": "open"}],
        "deployed_sandboxes": [{"sandbox_name": "box", "sandbox_mode": "vm", "tunnel_urls": {"8000": "http://t"}}],
        "prompt_responses": [{"prompt_id": "q", "response": "ok", "compact_trajectory_s3_uri": "s3://x"}],
        "metadata": {"run_group_id": "abc"},
        "agent_model": "m",
        "some_future_field": {"x": 1},
    }
    context = TaskStepContext.from_dict(data)
    out = context.to_dict()
    assert out["some_future_field"] == {"x": 1}
    assert out["deployed_envs"][0]["gateway_url"] == "http://g"
    assert out["deployed_envs"][0]["sandbox_ids"] == {"a": "1"}
    assert out["deployed_agents"][0]["network_policy"] == "open"
    assert out["deployed_sandboxes"][0]["tunnel_urls"] == {"8000": "http://t"}
    assert out["prompt_responses"][0]["compact_trajectory_s3_uri"] == "s3://x"
    assert TaskStepContext.from_dict(out).to_dict() == out


def test_to_dict_drops_unset_scalars_but_keeps_none_inside_metadata():
    context = ctx(metadata={"verifications": {"v": {"score": None, "rows": [None, 1]}}})
    out = context.to_dict()
    assert "agent_model" not in out
    assert out["metadata"] == {"verifications": {"v": {"score": None, "rows": [None, 1]}}}


def test_records_need_their_required_fields():
    with pytest.raises(ValidationError):
        ctx(deployed_envs=[{"env_version": "1"}])
    with pytest.raises(ValidationError):
        ctx(deployed_agents=[{"agent_name": "a"}])


# -- lookups ---------------------------------------------------------------------------------


def test_lookups_return_the_first_match_or_none():
    context = ctx(
        deployed_envs=[{"env_id": "email", "mcp_url": "http://1"}, {"env_id": "email", "mcp_url": "http://2"},
                       {"env_id": "crm"}],
        deployed_agents=[{"agent_name": "a", "api_url": "http://a1"}, {"agent_name": "a", "api_url": "http://a2"}],
        deployed_sandboxes=[{"sandbox_name": "box", "sandbox_mode": "vm", "sandbox_id": "s1"}],
        prompt_responses=[{"prompt_id": "q", "response": "first"}, {"prompt_id": "q", "response": "second"}],
    )
    assert context.find_env("email").mcp_url == "http://1"
    assert context.find_env("crm").env_id == "crm"
    assert context.find_env("nope") is None
    assert context.find_agent("a").api_url == "http://a1"
    assert context.find_agent("b") is None
    assert context.find_sandbox("box").sandbox_id == "s1"
    assert context.find_sandbox("other") is None
    assert context.find_prompt_response("q").response == "first"
    assert context.find_prompt_response("r") is None


def test_metadata_map_and_list_are_created_once_and_shared():
    context = ctx(metadata={"verifications": {"v": {"score": 1.0}}})
    verifications = context.metadata_map("verifications")
    assert verifications == {"v": {"score": 1.0}}
    verifications["w"] = {"score": 0.0}
    assert context.metadata["verifications"]["w"] == {"score": 0.0}
    failed = context.metadata_list("failed_steps")
    assert failed == [] and context.metadata["failed_steps"] is failed
    failed.append({"step_id": "x"})
    assert context.metadata_list("failed_steps") == [{"step_id": "x"}]
    assert context.metadata_map("collected_artifacts") is context.metadata["collected_artifacts"]


# -- merge -----------------------------------------------------------------------------------


def test_merge_deduplicates_list_items_by_value_in_order():
    shared_env = {"env_id": "email", "env_version": "1", "mcp_url": "http://e"}
    left = ctx(deployed_envs=[shared_env],
               deployed_agents=[{"agent_name": "a", "api_url": "http://a"}])
    right = ctx(deployed_envs=[dict(reversed(list(shared_env.items()))), {"env_id": "crm", "env_version": "2"}],
                deployed_agents=[{"agent_name": "a", "api_url": "http://other"}])
    merged = TaskStepContext.merge([left, right])
    assert [(e.env_id, e.env_version) for e in merged.deployed_envs] == [("email", "1"), ("crm", "2")]
    # same name, different value: both kept (value identity, not name identity)
    assert [a.api_url for a in merged.deployed_agents] == ["http://a", "http://other"]
    assert isinstance(merged.deployed_envs[0], DeployedEnv)
    assert isinstance(merged.deployed_agents[1], DeployedAgent)


def test_merging_stored_contexts_changes_none_of_them():
    first = {"metadata": {"nested": {"deeper": {"x": 1, "l": [1]}}, "failed_steps": [{"step_id": "a"}]}}
    second = {"metadata": {"nested": {"deeper": {"y": 2, "l": [2]}}, "failed_steps": [{"step_id": "b"}]}}
    before = json.dumps([first, second], sort_keys=True)
    merged = TaskStepContext.merge_dicts([first, second]).metadata
    assert merged["nested"] == {"deeper": {"x": 1, "l": [1, 2], "y": 2}}
    assert merged["failed_steps"] == [{"step_id": "a"}, {"step_id": "b"}]
    assert json.dumps([first, second], sort_keys=True) == before


def test_merge_deep_merges_metadata():
    left = ctx(metadata={
        "verifications": {"v1": {"score": 1.0}},
        "failed_steps": [{"step_id": "a"}],
        "seed": {"name": "Ann"},
        "run_group_id": "left",
        "nested": {"deeper": {"x": 1, "l": [1, 2]}},
    })
    right = ctx(metadata={
        "verifications": {"v2": {"score": 0.0}, "v1": {"score": 0.5, "judge": "m"}},
        "failed_steps": [{"step_id": "a"}, {"step_id": "b"}],
        "seed": {"name": "Bob", "n": 2},
        "run_group_id": "right",
        "nested": {"deeper": {"y": 2, "l": [2, 3]}},
        "only_right": True,
    })
    merged = TaskStepContext.merge([left, right]).metadata
    assert merged == {
        "verifications": {"v1": {"score": 1.0, "judge": "m"}, "v2": {"score": 0.0}},
        "failed_steps": [{"step_id": "a"}, {"step_id": "b"}],
        "seed": {"name": "Ann", "n": 2},
        "run_group_id": "left",
        "nested": {"deeper": {"x": 1, "l": [1, 2, 3], "y": 2}},
        "only_right": True,
    }
    assert list(merged["verifications"]) == ["v1", "v2"]


def test_merge_scalars_first_set_wins_and_order_matters():
    a = ctx(agent_model="model-a", metadata={"k": None})
    b = ctx(agent_model="model-b", default_agent_model="default-b", instance_id="i-b", metadata={"k": 2})
    ab = TaskStepContext.merge([a, b])
    assert (ab.agent_model, ab.default_agent_model, ab.instance_id) == ("model-a", "default-b", "i-b")
    assert ab.metadata == {"k": 2}  # an unset (None) value is filled by a later context
    ba = TaskStepContext.merge([b, a])
    assert ba.agent_model == "model-b"


def test_merge_of_nothing_and_of_one():
    assert TaskStepContext.merge([]).to_dict() == EMPTY
    one = ctx(metadata={"a": [1]}, agent_model="m")
    assert TaskStepContext.merge([one]).to_dict() == one.to_dict()


def test_merge_does_not_touch_its_inputs():
    left = ctx(metadata={"nested": {"l": [1]}})
    right = ctx(metadata={"nested": {"l": [2], "x": 1}})
    before = (copy.deepcopy(left.to_dict()), copy.deepcopy(right.to_dict()))
    merged = TaskStepContext.merge([left, right])
    merged.metadata["nested"]["l"].append(99)
    assert (left.to_dict(), right.to_dict()) == before


# -- redaction -------------------------------------------------------------------------------


def test_the_upstream_secret_keys_are_redacted():
    assert set(UPSTREAM_SECRETS) <= SECRET_KEYS


def test_to_safe_dict_strips_every_secret_at_any_depth():
    context = ctx(
        deployed_agents=[{"agent_name": "a", "api_url": "http://a", "cf_access_client_secret": "s1",
                          "a2a_card": {"auth": {"remote_tokens": ["t"], "scheme": "bearer"}}}],
        metadata={
            "user_overrides": {"litellm_api_key": "k1", "judge_litellm_api_key": "k2", "judge_model": "m"},
            "rows": [{"usersim_api_key": "u", "keep": 1}, [{"remote_tokens": {"x": "y"}, "keep": 2}]],
            "deep": {"a": {"b": {"c": {"cf_access_client_secret": "s2", "litellm_api_key": "k3", "ok": True}}}},
        },
        judge_litellm_api_key="top",
    )
    safe = context.to_safe_dict()
    text = json.dumps(safe)
    for key in UPSTREAM_SECRETS:
        assert key not in text
    for secret in ["s1", "k1", "k2", "k3", "s2", '"u"', '"top"', '"t"']:
        assert secret not in text
    assert safe["metadata"] == {
        "user_overrides": {"judge_model": "m"},
        "rows": [{"keep": 1}, [{"keep": 2}]],
        "deep": {"a": {"b": {"c": {"ok": True}}}},
    }
    assert safe["deployed_agents"][0]["a2a_card"] == {"auth": {"scheme": "bearer"}}
    assert "judge_litellm_api_key" not in safe
    # the live context keeps them (they are re-grafted, never persisted)
    assert context.to_dict()["metadata"]["user_overrides"]["litellm_api_key"] == "k1"


def test_rows_are_written_as_to_safe_dict_has_them_from_their_dicts_or_the_contexts_themselves(tmp_path):
    """What the IO manager stores for an op's rows (their ``to_dict``), and what a dataset run's
    context.json holds (the contexts, serialized by pydantic from their fields): each row as
    ``to_safe_dict`` has it, unset fields left out, text kept as it was."""
    from agentenv_dagster.orchestration.io_manager import TaskContextIOManager

    secretive = ctx(
        deployed_agents=[{"agent_name": "a", "api_url": "http://a", "cf_access_client_secret": "s1"}],
        prompt_responses=[{"prompt_id": "p", "response": "naïve ✓ — 読む", "model": None}],
        metadata={"user_overrides": {"litellm_api_key": "k1", "judge_model": "m"}, "score": None, "nan": 1.5},
        judge_litellm_api_key="top",
    )
    plain = ctx(metadata={"seed": {"row.text": "ünïcode"}}, agent_model="replay")
    rows = {"r1": secretive, "r2": plain}
    expected = {"r1": secretive.to_safe_dict(), "r2": plain.to_dict()}
    assert b"s1" not in redacted_json(rows) and b"k1" not in redacted_json(rows)
    assert json.loads(redacted_json(rows)) == expected
    assert json.loads(redacted_json({k: c.to_dict() for k, c in rows.items()})) == expected  # dicts alike
    assert expected["r1"]["metadata"]["score"] is None  # a None in free-form metadata stays
    assert "model" not in expected["r1"]["prompt_responses"][0]  # an unset field does not

    manager = TaskContextIOManager(base_dir=str(tmp_path))  # an op's stream: a record a row
    manager.start_stream("run-1", "prompt")
    manager.append_records("run-1", "prompt", [{"row": k, "context": c.to_dict()} for k, c in rows.items()])
    assert b"s1" not in (tmp_path / "run-1" / "context" / "prompt.jsonl").read_bytes()
    assert {k: r["context"] for k, r in manager.rows("run-1", "prompt").items()} == expected


@pytest.mark.parametrize("key", UPSTREAM_SECRETS)
def test_redact_each_secret_key_in_dicts_and_lists(key):
    value = {"outer": [{key: "secret", "n": 1}, [{key: ["secret"]}]], key: {"nested": "secret"}, "ok": "fine"}
    original = copy.deepcopy(value)
    assert redact(value) == {"outer": [{"n": 1}, [{}]], "ok": "fine"}
    assert value == original  # redact returns a copy


def test_redact_leaves_scalars_and_other_keys_alone():
    assert redact("litellm_api_key") == "litellm_api_key"
    assert redact([1, "a", None]) == [1, "a", None]
    assert redact({"litellm_base_url": "http://x", "usage": {"input_tokens": 3}}) == {
        "litellm_base_url": "http://x", "usage": {"input_tokens": 3},
    }


# -- seed templating -------------------------------------------------------------------------


def _prompt_step(**fields):
    return BUILTIN_STEPS.get("prompt_agent").model_validate(
        {"id": "p", "type": "prompt_agent", **fields}
    )


def test_apply_seed_replaces_placeholders_in_every_string():
    step = _prompt_step(prompt="Hi <name>, file <n> of <n> for <name>", system_prompt="You help <name>.",
                        model_params={"tags": ["<name>", 3]}, timeout_seconds=30, depends_on=["a"])
    seeded = apply_seed(step, {"name": "Bob", "n": 3})
    assert type(seeded) is type(step)
    assert seeded.prompt == "Hi Bob, file 3 of 3 for Bob"
    assert seeded.system_prompt == "You help Bob."
    assert seeded.model_params == {"tags": ["Bob", 3]}
    assert (seeded.timeout_seconds, seeded.depends_on) == (30, ["a"])
    assert step.prompt == "Hi <name>, file <n> of <n> for <name>"  # the original is untouched


def test_apply_seed_leaves_unknown_placeholders_and_non_strings():
    step = _prompt_step(prompt="<known> <unknown> <>", max_turns=5)
    seeded = apply_seed(step, {"known": None})
    assert seeded.prompt == "None <unknown> <>"
    assert seeded.max_turns == 5


@pytest.mark.parametrize("seed", [None, {}, "name=Bob", ["name"]])
def test_apply_seed_without_a_seed_dict_is_the_identity(seed):
    step = _prompt_step(prompt="Hi <name>")
    assert apply_seed(step, seed) is step


def test_apply_seed_keeps_a_step_without_tokens():
    """A dataset's row seed meets the same step every row: no token, no new step."""
    step = _prompt_step(prompt="Classify: <3 and >2>", model_params={"tags": ["a", 3]})
    assert apply_seed(step, {"name": "Bob"}) is step
    assert apply_seed(step, {"3 and >2": "x"}).prompt == "Classify: x"


def test_apply_seed_revalidates_the_step():
    step = BUILTIN_STEPS.get("load_artifact").model_validate(
        {"id": "l", "type": "load_artifact", "artifact_id": "<artifact>", "env_id": "<env>",
         "retry_config": {"go_to_step_id": "l", "max_retries": 2}}
    )
    seeded = apply_seed(step, {"artifact": "inbox-v2", "env": "email"})
    assert (seeded.artifact_id, seeded.env_id) == ("inbox-v2", "email")
    assert (seeded.retry_config.retry_from_step_id, seeded.retry_config.max_retries) == ("l", 2)


# -- structured output -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"answer": 42, "items": [1, 2]}', {"answer": 42, "items": [1, 2]}),
        ('  {"a": {"b": [1, {"c": 2}]}}  ', {"a": {"b": [1, {"c": 2}]}}),
        ('```json\n{"done": true}\n```', {"done": True}),
        ('```\n{"done": false}\n```', {"done": False}),
        ('First {"a": 1}, then {"b": 2}. Done.', {"b": 2}),
        ('{"whole": {"nested": 1}} and trailing prose', {"whole": {"nested": 1}}),
        ('{not json} but {"ok": 1}', {"ok": 1}),
    ],
    ids=["pure", "nested-pure", "json-fence", "plain-fence", "last-embedded", "leading-object", "skips-bad"],
)
def test_parse_structured_output(text, expected):
    assert parse_structured_output(text) == expected


@pytest.mark.parametrize(
    "text",
    ["[1, 2, 3]", '```json\n["a", "b"]\n```', "The task is complete.", "", None, "{unbalanced", "   "],
    ids=["array", "fenced-array", "prose", "empty", "none", "broken", "blank"],
)
def test_parse_structured_output_none(text):
    assert parse_structured_output(text) is None


def test_parse_structured_output_embedded_nested_object():
    assert parse_structured_output('Result: {"a": {"b": 1}}') == {"a": {"b": 1}}


def test_parse_structured_output_array_of_objects():
    assert parse_structured_output('[{"a": 1}, {"a": 2}]') is None


# -- score aggregation -----------------------------------------------------------------------


@pytest.mark.parametrize("aggregator", ["all_pass", "any_pass", "weighted_average"])
def test_no_rows_score_zero(aggregator):
    assert aggregate([], aggregator) == 0.0


def test_all_pass_and_any_pass_read_result_only():
    passed, failed = {"result": True, "score": 0.0}, {"result": False, "score": 1.0}
    assert aggregate([passed, passed], "all_pass") == 1.0
    assert aggregate([passed, failed], "all_pass") == 0.0
    assert aggregate([{"score": 1.0}], "all_pass") == 0.0  # no result: not a pass
    assert aggregate([{"result": 1}], "all_pass") == 0.0  # `is True`, not truthiness
    assert aggregate([failed, passed], "any_pass") == 1.0
    assert aggregate([failed, failed], "any_pass") == 0.0


def test_weighted_average_weighs_scores():
    rows = [{"score": 1.0, "weight": 2}, {"score": 0.0, "weight": 1}, {"score": 0.5}]
    assert aggregate(rows, "weighted_average") == pytest.approx((2 + 0 + 0.5) / 4)


def test_weighted_average_score_defaults_from_result_and_weight_to_one():
    rows = [{"result": True}, {"result": False}, {"result": True, "weight": None}]
    assert aggregate(rows, "weighted_average") == pytest.approx(2 / 3)
    assert row_score({"result": True}) == 1.0
    assert row_score({"result": False, "score": 0.25}) == 0.25
    assert row_score({"score": True}) == 0.0  # a bool is not a score
    assert row_score({}) == 0.0


def test_weighted_average_negative_weight_subtracts_a_present_mistake():
    positive = [{"score": 1.0, "weight": 1}, {"score": 1.0, "weight": 1}]
    mistake_absent = {"score": 1.0, "weight": -1}
    mistake_present = {"score": 0.0, "weight": -1}
    half_present = {"score": 0.5, "weight": -2}
    assert aggregate([*positive, mistake_absent], "weighted_average") == 1.0
    assert aggregate([*positive, mistake_present], "weighted_average") == pytest.approx(0.5)
    assert aggregate([*positive, half_present], "weighted_average") == pytest.approx(0.5)


def test_weighted_average_clamps_and_needs_a_positive_weight():
    assert aggregate([{"score": 0.0, "weight": 1}, {"score": 0.0, "weight": -5}], "weighted_average") == 0.0
    assert aggregate([{"score": 3.0, "weight": 1}], "weighted_average") == 1.0
    assert aggregate([{"score": 1.0, "weight": -1}], "weighted_average") == 0.0
    assert aggregate([{"score": 1.0, "weight": 0}], "weighted_average") == 0.0


def test_verification_passed():
    assert verification_passed({"score": 1.0}) is True
    assert verification_passed({"score": 0.99}) is False
    assert verification_passed({"score": 0.5, "pass_threshold": 0.5}) is True
    assert verification_passed({"score": None, "graded": False}) is None
    assert verification_passed({}) is None
