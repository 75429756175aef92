"""rubrics_verifier output formats against the fake Messages API: the judge prompt's sections,
criteria re-keyed c1..cN and restored, id-integrity retries and their exact failure, malformed
or missing verdicts scored 0 with the error recorded, a 429 retried by the SDK, and no judge ->
not graded."""

from __future__ import annotations

import pytest
from fakes.messages_api import error_reply, text_reply, tool_use_reply
from projects import make_project, run_steps
from test_rubrics import AGENT_CONFIG, judged  # noqa: F401  (the fixture: a project judged by the fake API)
from test_rubrics import steps as rubric_steps

from agentenv_dagster.steps.execution import StepFailed

CRITERIA = [
    {"id": "polite", "criterion": "The reply is polite.", "weight": 1},
    {"id": "rude", "criterion": "The reply insults Dana.", "weight": -1},
]


def steps(criteria=CRITERIA, **rubric):
    return rubric_steps(criteria, **rubric)


def results(*pairs, **extra):
    return tool_use_reply("submit_verdict", {"results": [
        {"id": key, "score": score, "justification": f"about {key}"} for key, score in pairs
    ], **extra})


def verdict(*scores, **extra):
    return results(*((f"c{i}", s) for i, s in enumerate(scores, 1)), **extra)


def prompt_of(api, n=0):
    return api.requests[n].body["messages"][0]["content"]


def entry_of(context):
    return context.metadata["verifications"]["tone"]


# -- rubric_binary ----------------------------------------------------------------------------
def test_binary_prompt_sections_rekeying_and_negative_criteria(judged):
    root, api = judged
    api.enqueue(verdict(1.0, 1.0))
    context = run_steps(root, steps(grading_policy_prompt="Be strict about tone.",
                                    context_facts_for_judge={"recipient": "no.such.path"}))
    entry = entry_of(context)
    assert entry["format"] == "rubric_binary" and entry["graded"] is True
    assert [(r["id"], r["score"], r["result"], r["weight"]) for r in entry["results"]] == [
        ("polite", 1.0, True, 1), ("rude", 1.0, True, -1)]
    assert entry["score"] == 1.0
    assert "judge_output_retries" not in entry
    usage = entry["judge"]["usage"]  # what the verification asset prices
    assert (usage["calls"], usage["input_tokens"], usage["output_tokens"]) == (1, 10, 5)
    body = api.requests[0].body
    assert body["tool_choice"] == {"type": "tool", "name": "submit_verdict"}
    assert body["tools"][0]["input_schema"]["required"] == ["results"]
    prompt = prompt_of(api)
    order = [prompt.index(s) for s in ("## Agent Prompt", "## Agent Trajectory", "## Agent Response",
                                       "## Criteria", "## Instructions", "## Grading policy", "## Context facts")]
    assert order == sorted(order)
    assert "<agent_prompt>\nWrite to Dana.\n</agent_prompt>" in prompt
    assert "<agent_trajectory>" in prompt and "<agent_response>" in prompt
    assert '"id": "c1"' in prompt and '"id": "c2"' in prompt and '"polite"' not in prompt
    assert '"negative": true' in prompt
    assert "PASS or FAIL" in prompt and "PRESENT or ABSENT" in prompt and "exactly 1.0" in prompt
    assert "Be strict about tone." in prompt and '"recipient": null' in prompt


def test_no_trajectory_section_when_use_trajectory_is_false(judged):
    root, api = judged
    api.enqueue(verdict(1.0, 0.0))
    entry = entry_of(run_steps(root, steps(use_trajectory=False)))
    assert "## Agent Trajectory" not in prompt_of(api)
    assert [r["result"] for r in entry["results"]] == [True, False] and entry["score"] == 0.0


def test_binary_off_scale_score_fails_and_keeps_the_raw_score(judged):
    root, api = judged
    api.enqueue(verdict(0.7, 1.0))
    row = entry_of(run_steps(root, steps()))["results"][0]
    assert (row["score"], row["result"], row["raw_score"]) == (0.0, False, 0.7)


def test_verdict_shapes_bare_list_and_missing():
    from agentenv_dagster.steps.rubric_formats import (
        MissingVerdict,
        agent_verdict,
        verdict_parts,
    )

    item = {"id": "c1", "score": 1, "justification": "ok"}
    assert verdict_parts([item, "junk"]) == ([item], [])  # a bare list is accepted
    assert verdict_parts({"results": [item], "note": "extra"}) == ([item], [])
    assert agent_verdict(None, '```json\n{"results": []}\n```') == {"results": []}
    assert agent_verdict({"results": [item]}, "prose") == {"results": [item]}  # structured output wins
    with pytest.raises(MissingVerdict, match=r"the judge's reply is not JSON as a whole: 'Verdict: \{"):
        agent_verdict(None, 'Verdict: {"results": []}')  # an object inside prose may be quoted agent output
    for bad in (None, {"verdict": "pass"}, {"results": "all good"}, "pass"):
        with pytest.raises(MissingVerdict):
            verdict_parts(bad)


# -- rubric_partial ---------------------------------------------------------------------------
def test_partial_snaps_outcomes_normalises_ranges_and_uses_thresholds(judged):
    root, api = judged
    criteria = [
        {"id": "labels", "criterion": "Tone", "outcomes": [
            {"label": "poor", "score": 0.0}, {"label": "ok", "score": 0.6}, {"label": "great", "score": 1.0}]},
        {"id": "range", "criterion": "Detail", "outcomes": {"min": 0, "max": 10}, "pass_threshold": 0.8},
        {"id": "plain", "criterion": "Signed", "pass_threshold": 0.3},
        {"id": "named", "criterion": "Format", "outcomes": [
            {"label": "bad", "score": 0.0}, {"label": "good", "score": 1.0}]},
    ]
    api.enqueue(tool_use_reply("submit_verdict", {"results": [
        {"id": "c1", "score": 0.55, "justification": "mostly ok"},
        {"id": "c2", "score": 7, "justification": "7 of 10"},
        {"id": "c3", "score": -0.2, "justification": "below zero"},
        {"id": "c4", "score": 0.1, "outcome": "good", "justification": "labelled"},
    ]}))
    entry = entry_of(run_steps(root, steps(criteria, output_format="rubric_partial",
                                           score_aggregator="weighted_average")))
    labels, ranged, plain, named = entry["results"]
    assert (labels["score"], labels["outcome"], labels["raw_score"], labels["result"]) == (0.6, "ok", 0.55, True)
    assert (ranged["score"], ranged["raw_score"], ranged["result"]) == (pytest.approx(0.7), 7.0, False)
    assert (plain["score"], plain["result"]) == (0.0, False)
    assert (named["score"], named["outcome"]) == (1.0, "good")
    assert entry["score"] == pytest.approx((0.6 + 0.7 + 0.0 + 1.0) / 4)
    assert "from 0.0 to 1.0" in prompt_of(api)


# -- trajectory_mistakes ----------------------------------------------------------------------
def test_trajectory_mistakes_lists_mistakes_with_restored_ids(judged):
    root, api = judged
    api.enqueue(verdict(0.0, 1.0, mistakes=[
        {"criterion_id": "c1", "step": "2", "description": "Skipped the greeting.", "severity": "minor"},
        {"criterion_id": "c9", "description": "Not tied to a criterion."},
    ]))
    entry = entry_of(run_steps(root, steps(output_format="trajectory_mistakes")))
    assert entry["format"] == "trajectory_mistakes"
    assert [(r["id"], r["result"]) for r in entry["results"]] == [("polite", False), ("rude", True)]
    assert entry["mistakes"] == [
        {"criterion_id": "polite", "step": "2", "description": "Skipped the greeting.", "severity": "minor"},
        {"criterion_id": "c9", "description": "Not tied to a criterion."},
    ]
    assert entry["score"] == 0.0
    schema = api.requests[0].body["tools"][0]["input_schema"]
    assert set(schema["properties"]) == {"results", "mistakes"}
    prompt = prompt_of(api)
    assert "look for mistakes" in prompt and '"mistakes"' in prompt and "<agent_trajectory>" in prompt


def test_trajectory_mistakes_without_a_mistakes_list_records_none(judged):
    root, api = judged
    api.enqueue(verdict(1.0, 1.0))
    entry = entry_of(run_steps(root, steps(output_format="trajectory_mistakes")))
    assert entry["mistakes"] == [] and entry["score"] == 1.0


# -- id integrity -----------------------------------------------------------------------------
def test_wrong_ids_then_right_ids_are_corrected_and_recorded(judged):
    root, api = judged
    api.enqueue(results(("polite", 1.0), ("rude", 1.0)),  # the author's ids, not the keys
                results(("c1", 1.0), ("c1", 1.0)),        # a duplicate
                verdict(1.0, 0.0))
    entry = entry_of(run_steps(root, steps()))
    assert [r["id"] for r in entry["results"]] == ["polite", "rude"]
    assert entry["score"] == 0.0
    assert entry["judge_output_retries"] == 2
    assert entry["judge_output_discrepancies"] == [
        "missing ids: ['c1', 'c2']; unknown ids: ['polite', 'rude']",
        "missing ids: ['c2']; duplicate ids: ['c1']",
    ]
    assert len(api.requests) == 3
    correction = prompt_of(api, 1)
    assert "## Correction" in correction and "unknown ids: ['polite', 'rude']" in correction
    assert "['c1', 'c2']" in correction


def test_ids_still_wrong_after_three_attempts_fail_with_the_reference_message(judged):
    root, api = judged
    api.enqueue(verdict(1.0), results(("c1", 1.0), ("c2", 1.0), ("c3", 1.0)), verdict(1.0))
    with pytest.raises(StepFailed, match=r"Judge returned 1 results but expected 2 criteria"):
        run_steps(root, steps())
    assert len(api.requests) == 3


def test_an_empty_results_list_is_an_id_mismatch(judged):
    root, api = judged
    api.enqueue(*[tool_use_reply("submit_verdict", {"results": []})] * 3)
    with pytest.raises(StepFailed, match=r"Judge returned 0 results but expected 2 criteria"):
        run_steps(root, steps())


# -- malformed and missing verdicts -----------------------------------------------------------
def test_a_non_numeric_score_scores_that_row_zero_with_the_error(judged):
    root, api = judged
    api.enqueue(results(("c1", "high"), ("c2", 1.0)))
    entry = entry_of(run_steps(root, steps(score_aggregator="weighted_average")))
    bad, good = entry["results"]
    assert (bad["score"], bad["result"], bad["error"]) == (0.0, False, "judge gave no numeric score: 'high'")
    assert good["result"] is True and "error" not in good
    assert entry["errors"] == ["polite: judge gave no numeric score: 'high'"]
    assert entry["score"] == 0.0


def test_a_reply_without_the_tool_call_is_asked_again(judged):
    root, api = judged
    api.enqueue(text_reply("Both criteria pass."), verdict(1.0, 1.0))
    entry = entry_of(run_steps(root, steps()))
    assert entry["score"] == 1.0 and entry["judge_output_retries"] == 1
    assert entry["judge_output_discrepancies"] == ["no verdict: judge replied without calling submit_verdict"]


def test_no_verdict_after_every_attempt_scores_zero_with_the_error(judged):
    root, api = judged
    api.enqueue(text_reply("pass"), tool_use_reply("submit_verdict", {"results": "all good"}),
                tool_use_reply("submit_verdict", {"verdict": "pass"}))
    entry = entry_of(run_steps(root, steps(output_format="rubric_partial")))
    assert entry["score"] == 0.0 and entry["graded"] is True
    assert entry["error"] == ("judge returned no verdict after 3 attempts "
                              "(no verdict: the verdict has no results list (got NoneType))")
    assert [(r["id"], r["score"], r["result"]) for r in entry["results"]] == [
        ("polite", 0.0, False), ("rude", 0.0, False)]
    assert all(r["error"] == entry["error"] for r in entry["results"])
    assert len(api.requests) == 3


# -- transport --------------------------------------------------------------------------------
def test_a_429_is_retried_by_the_sdk(judged):
    root, api = judged
    api.enqueue(error_reply(429, "slow down", retry_after_seconds=0.01), verdict(1.0, 1.0))
    entry = entry_of(run_steps(root, steps(output_format="trajectory_mistakes")))
    assert entry["score"] == 1.0 and "judge_output_retries" not in entry
    assert len(api.requests) == 2  # one SDK retry, not a correction


def test_a_400_fails_the_step_at_once(judged):
    """A request the API refuses is refused again: neither the SDK nor the judge asks twice."""
    root, api = judged
    api.enqueue(*[error_reply(400, "bad request")] * 3)
    with pytest.raises(StepFailed, match=r"LLM judge failed: judge API error 400 \(invalid_request_error\) "
                                         r"for model 'claude-test': bad request"):
        run_steps(root, steps(output_format="rubric_partial"))
    assert len(api.requests) == 1


def test_default_model_api_base_points_the_judge_elsewhere(judged, tmp_path):
    """The step's own endpoint wins over ``[model] base_url`` (which points at nothing here)."""
    from fakes.messages_api import FakeMessagesAPI

    root, api = judged
    config = root / ".agentenv" / "config.toml"
    config.write_text(config.read_text().replace(api.base_url, "http://127.0.0.1:9"))
    with FakeMessagesAPI() as own:
        own.enqueue(verdict(1.0, 1.0))
        entry = entry_of(run_steps(root, steps(default_model_api_base=own.base_url)))
        assert entry["score"] == 1.0 and len(own.requests) == 1
    assert api.requests == []


MULTI_TURN_AGENTS = """
[agents.registry.talker]
kind = "replay"
episodes = [
  {match = "^Write to Dana", reply = "Draft one", actions = [{write_file = "one.txt", content = "1"}]},
  {match = "^Sign it", reply = "Dear Dana, done. Best, Al", actions = [{write_file = "two.txt", content = "2"}]},
]
[agents.registry.asker]
kind = "replay"
episodes = [
  {match = "Draft one", reply = '{"message": "Sign it please", "done": false}'},
  {match = "Best, Al", reply = '{"message": "Thanks", "done": true}'},
]
"""


def test_a_conversation_is_judged_turn_by_turn(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", extra_config=MULTI_TURN_AGENTS, model={
        "api_key": "sk-test-judge", "base_url": fake_messages_api.base_url, "default": "claude-test"})
    fake_messages_api.enqueue(verdict(1.0, 1.0))
    context = run_steps(root, [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "talker", "agent_name": "w", "depends_on": []},
        {"id": "user", "type": "deploy_agent", "a2a_agent_id": "asker", "agent_name": "u", "depends_on": []},
        {"id": "ask", "type": "prompt_agent", "agent_name": "w", "prompt_id": "p", "prompt": "Write to Dana.",
         "max_conversation_turns": 3, "user_agent_name": "u", "depends_on": ["agent", "user"]},
        {"id": "grade", "type": "rubrics_verifier", "prompt_id": "p", "verifier_id": "tone",
         "use_agent_judge": False, "criteria": CRITERIA},
    ])
    assert entry_of(context)["score"] == 1.0
    prompt = prompt_of(fake_messages_api)
    trajectory = prompt[prompt.index("<agent_trajectory>"):prompt.index("</agent_trajectory>")]
    assert trajectory.index("===== Turn 1 =====") < trajectory.index("one.txt") \
        < trajectory.index("===== Turn 2 =====") < trajectory.index("two.txt")


# -- no judge, unsupported formats ------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["rubric_binary", "rubric_partial", "trajectory_mistakes"])
def test_no_judge_is_not_graded_in_every_format(tmp_path, fmt):
    root = make_project(tmp_path / "p", extra_config=AGENT_CONFIG, model={"api_key": "env:NO_SUCH_KEY_VAR"})
    entry = entry_of(run_steps(root, steps(output_format=fmt)))
    assert (entry["format"], entry["graded"], entry["score"], entry["results"]) == (fmt, False, None, [])


@pytest.mark.parametrize("fmt", ["rubric_evidence", "rubric_evidence_with_mistakes"])
def test_evidence_formats_need_screenshot_compaction(fmt):
    from pydantic import ValidationError

    from agentenv_dagster.steps.rubrics import RubricsVerifierStep

    with pytest.raises(ValidationError, match="needs use_agent_judge=false, use_trajectory=true"):
        RubricsVerifierStep.model_validate({"id": "g", "type": "rubrics_verifier", "prompt_id": "p",
                                            "criteria": CRITERIA, "output_format": fmt})


def test_a_judge_agent_that_never_replies_with_json_scores_zero(tmp_path):
    root = make_project(tmp_path / "p", extra_config=AGENT_CONFIG + """
[agents.registry.grader]
kind = "replay"
episodes = [{match = "(?s).*", reply = "Looks fine to me."}]
""")
    context = run_steps(root, [
        *steps(agent_name="judge")[:2],
        {"id": "judge", "type": "deploy_agent", "a2a_agent_id": "grader", "agent_name": "judge", "depends_on": []},
        {**steps(agent_name="judge")[2], "depends_on": [{"task_step_id": "ask"}, {"task_step_id": "judge"}]},
    ])
    entry = entry_of(context)
    assert entry["score"] == 0.0 and entry["judge"] == {"agent_name": "judge"}
    assert entry["error"].startswith("judge returned no verdict after 3 attempts (no verdict: the judge's reply is not JSON")
    assert entry["judge_output_retries"] == 2
