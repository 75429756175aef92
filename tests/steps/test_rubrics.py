"""rubrics_verifier against real judges: the anthropic client on a fake Messages API, and a
named judge agent over A2A. Offline with no key, nothing is invented."""

from __future__ import annotations

import json

import pytest
from fakes.messages_api import error_reply, text_reply, tool_use_reply

from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

AGENT_CONFIG = """
[agents.registry.writer]
kind = "replay"
episodes = [{match = "(?i)write", reply = "Dear Dana, the Q3 numbers are done. Best, Al"}]
"""
CRITERIA = [
    {"id": "polite", "criterion": "The reply is polite.", "weight": 1},
    {"id": "signed", "criterion": "The reply is signed.", "weight": 1},
]


def steps(criteria=CRITERIA, **rubric):
    return [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "writer", "agent_name": "w", "depends_on": []},
        {"id": "ask", "type": "prompt_agent", "agent_name": "w", "prompt_id": "p", "prompt": "Write to Dana."},
        {"id": "grade", "type": "rubrics_verifier", "prompt_id": "p", "verifier_id": "tone",
         "use_agent_judge": False, "criteria": criteria, **rubric},
    ]


@pytest.fixture
def judged(tmp_path, fake_messages_api):
    root = make_project(tmp_path / "p", extra_config=AGENT_CONFIG, model={
        "api_key": "sk-test-judge", "base_url": fake_messages_api.base_url, "default": "claude-test",
    })
    yield root, fake_messages_api
    assert leaked_servers(root / ".agentenv" / "state") == []


def verdict(*scores):
    return tool_use_reply("submit_verdict", {"results": [
        {"id": f"c{i}", "score": s, "justification": f"because {i}"} for i, s in enumerate(scores, 1)
    ]})


def test_llm_judge_grades_rekeyed_criteria_with_a_forced_tool_call(judged):
    root, api = judged
    api.enqueue(verdict(1.0, 0.0))
    context = run_steps(root, steps())
    entry = context.metadata["verifications"]["tone"]
    assert entry["score"] == 0.0  # all_pass
    assert [(r["id"], r["result"], r["justification"]) for r in entry["results"]] == [
        ("polite", True, "because 1"), ("signed", False, "because 2")]
    assert entry["judge"]["model"] == "claude-test" and entry["judge"]["usage"]["calls"] == 1
    request = api.requests[0].body
    assert request["tool_choice"] == {"type": "tool", "name": "submit_verdict"}
    prompt = request["messages"][0]["content"]
    assert '"id": "c1"' in prompt and '"id": "polite"' not in prompt
    for section in ("## Agent Prompt", "## Agent Trajectory", "## Agent Response", "## Criteria", "## Instructions"):
        assert section in prompt
    assert "Dear Dana, the Q3 numbers are done." in prompt
    assert api.requests[0].headers["authorization"] == "Bearer sk-test-judge"


def test_weighted_average_and_partial_scores(judged):
    root, api = judged
    api.enqueue(verdict(0.8, 1.7))
    context = run_steps(root, steps(output_format="rubric_partial", score_aggregator="weighted_average"))
    entry = context.metadata["verifications"]["tone"]
    assert [r["score"] for r in entry["results"]] == [0.8, 1.0]  # clamped to [0, 1]
    assert entry["score"] == pytest.approx(0.9)


def test_judge_ids_are_corrected_up_to_three_times(judged):
    root, api = judged
    api.enqueue(verdict(1.0), verdict(1.0, 1.0))
    context = run_steps(root, steps())
    assert context.metadata["verifications"]["tone"]["score"] == 1.0
    assert "## Correction" in api.requests[1].body["messages"][0]["content"]
    assert "missing ids: ['c2']" in api.requests[1].body["messages"][0]["content"]


def test_a_judge_that_never_returns_the_right_ids_fails_the_step(judged):
    root, api = judged
    api.enqueue(verdict(1.0), verdict(1.0), verdict(1.0))
    with pytest.raises(StepFailed, match=r"Judge returned 1 results but expected 2 criteria"):
        run_steps(root, steps())


def test_judge_api_errors_are_retried_then_fail_clearly(judged):
    root, api = judged
    api.enqueue(*[error_reply(529, "overloaded", retry_after_seconds=0.01)] * 9)
    with pytest.raises(StepFailed, match=r"LLM judge failed after 3 attempts"):
        run_steps(root, steps())
    assert len(api.requests) == 9  # 3 attempts x (1 call + 2 SDK retries)


def test_no_judge_configured_is_recorded_as_not_graded(tmp_path):
    root = make_project(tmp_path / "p", extra_config=AGENT_CONFIG, model={"api_key": "env:NO_SUCH_KEY_VAR"})
    context = run_steps(root, steps())
    entry = context.metadata["verifications"]["tone"]
    assert entry["graded"] is False and entry["score"] is None and entry["results"] == []
    assert entry["reason"].startswith("no judge configured")


def test_a_named_judge_agent_reads_the_files_handed_to_it(tmp_path):
    """chart-q3: collect the analyst's file, load it into the judge's sandbox, judge it."""
    judge_reply = json.dumps({"results": [{"id": "c1", "score": 1, "justification": "bars seen"}]})
    root = make_project(tmp_path / "p", extra_config=f"""
[agents.registry.analyst]
kind = "replay"
episodes = [{{match = "chart", reply = "Saved q3.png", actions = [{{write_file = "/app/artifact/q3.png", content = "PNG"}}]}}]
[agents.registry.grader]
kind = "replay"
episodes = [{{match = "/tmp/file_artifacts/q3.png", reply = {json.dumps(judge_reply)}}}]
""")
    context = run_steps(root, [
        {"id": "analyst", "type": "deploy_agent", "a2a_agent_id": "analyst", "agent_name": "analyst", "depends_on": []},
        {"id": "judge", "type": "deploy_agent", "a2a_agent_id": "grader", "agent_name": "judge", "depends_on": []},
        {"id": "chart", "type": "prompt_agent", "agent_name": "analyst", "prompt_id": "chart",
         "prompt": "Draw the Q3 chart.", "depends_on": ["analyst"]},
        {"id": "collect", "type": "collect_artifacts", "agent_name": "analyst", "artifact_paths": ["q3.png"],
         "depends_on": [{"task_step_id": "chart"}]},
        {"id": "handoff", "type": "load_artifact", "agent_name": "judge", "artifact_from_step_id": "collect",
         "depends_on": [{"task_step_id": "collect"}, {"task_step_id": "judge"}]},
        {"id": "grade", "type": "rubrics_verifier", "agent_name": "judge", "prompt_id": "chart",
         "verifier_id": "chart", "criteria": [{"id": "bars", "criterion": "q3.png is a bar chart.", "weight": 1}],
         "depends_on": [{"task_step_id": "handoff"}]},
    ])
    loaded = context.metadata["loaded_file_artifact_universes"][0]
    assert (loaded["agent_name"], loaded["destination_path"], loaded["files"]) == ("judge", "/tmp/file_artifacts", ["q3.png"])
    entry = context.metadata["verifications"]["chart"]
    assert entry["score"] == 1.0 and entry["results"][0]["id"] == "bars"
    assert entry["judge"] == {"agent_name": "judge"}


def test_a_prompt_error_skips_the_judge_and_scores_zero(judged):
    root, api = judged
    failing = steps()
    failing[1] = {**failing[1], "prompt": "nothing matches", "fail_task_on_error": False}
    context = run_steps(root, failing)
    entry = context.metadata["verifications"]["tone"]
    assert entry["score"] == 0.0
    assert entry["results"] == [{"id": "prompt_error", "score": 0, "result": False,
                                 "message": "Skipped: prompt had error_type=NoScriptedReply"}]
    assert api.requests == []  # the judge was never asked


def test_the_default_judge_agent_is_deployed_for_the_grading_and_stopped(judged):
    root, api = judged
    api.enqueue(text_reply(json.dumps({"results": [
        {"id": "c1", "score": 1, "justification": "polite"}, {"id": "c2", "score": 1, "justification": "signed"}]})))
    context = run_steps(root, steps(use_agent_judge=True))
    entry = context.metadata["verifications"]["tone"]
    assert entry["score"] == 1.0 and entry["judge"] == {"a2a_agent_id": "a2a-default", "model": "claude-test"}
    assert "## Criteria" in api.requests[0].body["messages"][0]["content"]
