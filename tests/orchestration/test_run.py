"""Tasks run through Dagster in-process: scores as asset metadata, failure semantics, teardown."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.orchestration.io_manager import final_context
from projects import leaked_servers, make_project, node_of

SENT = dg.AssetKey(["verifications", "reply_to_dana", "sent"])
TONE = dg.AssetKey(["verifications", "reply_to_dana", "tone"])
COLLECTED = dg.AssetKey(["artifacts", "reply_to_dana", "collect"])


def _metadata(instance, key):
    event = instance.get_latest_materialization_event(key)
    assert event is not None, f"{key} was not materialized"
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def _checks(result):
    return {
        (e.event_specific_data.asset_key, e.event_specific_data.check_name): e.event_specific_data
        for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def test_reply_to_dana_runs_end_to_end_offline(project):
    defs = build_definitions(project / "tasks")
    state = project / ".agentenv" / "state"
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("reply_to_dana").execute_in_process(instance=instance)
        assert result.success

        sent = _metadata(instance, SENT)
        assert sent["score"] == 1.0 and sent["passed"] is True
        assert [r.data["id"] for r in sent["criteria"].records] == ["sent_to_dana", "about_q3", "signed"]

        tone = _metadata(instance, TONE)  # no judge offline: recorded, never invented
        assert tone["graded"] is False and "score" not in tone
        assert "needs an API key" in tone["reason"]

        collected = _metadata(instance, COLLECTED)
        assert collected["file_count"] == 1
        url = collected["files"]["reply_to_dana.txt"]
        assert url.startswith("file://") and "Q3 numbers are reconciled" in open(url[7:]).read()

        checks = _checks(result)
        assert checks[(SENT, "passed")].passed is True
        assert checks[(TONE, "passed")].passed is False
        assert checks[(TONE, "passed")].severity == dg.AssetCheckSeverity.WARN

        # the check's Execute button: it re-reads the evaluation, and still says why it was not graded
        check_only = defs.resolve_implicit_global_asset_job_def().get_subset(
            asset_selection=set(), asset_check_selection={dg.AssetCheckKey(TONE, "passed")})
        again = check_only.execute_in_process(instance=instance)
        reread = _checks(again)[(TONE, "passed")]
        assert reread.passed is False and reread.severity == dg.AssetCheckSeverity.WARN
        assert "needs an API key" in reread.metadata["reason"].value
        assert reread.metadata["from_run"].value == result.run_id

        observation = instance.fetch_observations(dg.AssetKey(["artifacts", "inbox"]), limit=1).records
        assert observation[0].asset_observation.metadata["version"].value == 1

    context = final_context(state / "runs", result.run_id)
    assert context.prompt_responses[0].tool_call_count == 2
    assert context.metadata["loaded_environment_artifacts"][0]["id"] == "inbox"
    assert leaked_servers(state) == []
    # the teardown op's stream: a record for the row (its final context), then the stream's end
    records = [json.loads(line) for line in (state / "runs" / result.run_id / "context" /
                                             "reply_to_dana_steps.teardown_run.jsonl").read_text().splitlines()]
    assert [r.get("row") for r in records] == ["", None] and records[-1] == {"end": True}
    assert records[0]["context"]["metadata"]["verifications"]["sent"]["score"] == 1.0


FAILING_TASK = [
    {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "a2a_agent_id": "replay",
     "agent_name": "a", "depends_on": ["email"]},
    {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": "p", "prompt": "nothing scripted",
     "depends_on": ["agent"]},
    {"id": "check", "type": "agent_prompt_response_verifier", "prompt_id": "p", "verifier_id": "v",
     "criteria": [{"type": "response_contains", "needles": ["x"]}], "depends_on": ["ask"]},
]


def _run(tmp_path, steps):
    root = make_project(tmp_path / "p", tasks={"t.json": steps})
    defs = build_definitions(root / "tasks")
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("t").execute_in_process(instance=instance, raise_on_error=False)
    state = root / ".agentenv" / "state"
    return result, final_context(state / "runs", result.run_id), state


def test_a_fatal_failure_fails_the_run_skips_dependents_and_tears_down(tmp_path):
    result, context, state = _run(tmp_path, FAILING_TASK)
    assert not result.success
    statuses = {node_of(e.step_key): e.event_type_value for e in result.all_events
                if e.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED")}
    assert statuses["ask"] == "STEP_FAILURE"
    assert "check" not in statuses or statuses["check"] == "STEP_SKIPPED"
    failed = context.metadata["failed_steps"]
    assert [(f["step_id"], f["is_fatal"]) for f in failed] == [("ask", True)]
    assert "A2A task failed" in failed[0]["error"] and "NoScriptedReply" in failed[0]["error"]
    # the failed agent still leaves its PromptResponse
    assert context.find_prompt_response("p").error_type == "NoScriptedReply"
    assert leaked_servers(state) == []


@pytest.mark.slow
def test_a_tolerated_failure_lets_dependents_run(tmp_path):
    steps = [dict(s) for s in FAILING_TASK]
    steps[2]["fail_task_on_error"] = False
    result, context, state = _run(tmp_path, steps)
    assert result.success
    assert [(f["step_id"], f["is_fatal"]) for f in context.metadata["failed_steps"]] == [("ask", False)]
    verdict = context.metadata["verifications"]["v"]
    assert verdict["score"] == 0.0
    assert verdict["results"][0]["message"] == "Skipped: prompt had error_type=NoScriptedReply"
    assert leaked_servers(state) == []


@pytest.mark.slow
def test_the_judge_resource_is_configurable_from_the_launchpad(tmp_path, monkeypatch, fake_messages_api):
    from fakes.messages_api import tool_use_reply

    steps = json.loads((make_project(tmp_path / "src") / "tasks" / "reply_to_dana.json").read_text())
    next(s for s in steps if s["id"] == "tone")["use_agent_judge"] = False
    root = make_project(tmp_path / "p", tasks={"reply_to_dana.json": steps})
    monkeypatch.setenv("LAUNCHPAD_JUDGE_KEY", "sk-launchpad")
    fake_messages_api.enqueue(tool_use_reply("submit_verdict", {"results": [
        {"id": "c1", "score": 1, "justification": "polite"}, {"id": "c2", "score": 0, "justification": "vague"}]}))
    run_config = {"resources": {"agentenv_judge": {"config": {
        "model": "claude-launchpad", "base_url": fake_messages_api.base_url, "api_key_env": "LAUNCHPAD_JUDGE_KEY",
    }}}}
    defs = build_definitions(root / "tasks")
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("reply_to_dana").execute_in_process(instance=instance, run_config=run_config)
        assert result.success
        tone = _metadata(instance, TONE)
    assert "score" in tone, tone.get("reason")
    assert tone["score"] == 0.0 and tone["judge_model"] == "claude-launchpad" and tone["passed"] is False
    assert fake_messages_api.requests[0].body["model"] == "claude-launchpad"
    assert fake_messages_api.requests[0].headers["authorization"] == "Bearer sk-launchpad"
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_step_fields_in_the_run_config_that_are_not_a_step_fail_naming_the_node_and_the_fields(project):
    """The launchpad's ``steps`` replace a step whole: an incomplete one is a clear failure
    (not pydantic's dump), and the run deploys nothing."""
    run_config = {"ops": {"reply_to_dana_steps": {"config": {"steps": {"email": {"env_id": "email"}}}}}}
    defs = build_definitions(project / "tasks")
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("reply_to_dana").execute_in_process(
            instance=instance, run_config=run_config, raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert node_of(failure.step_key) == "email"
    message = failure.event_specific_data.error.message
    assert "validation error" not in message
    assert message.rstrip().endswith(
        "step 'email': its fields in the run config (ops.reply_to_dana_steps.config.steps.email) are not a "
        "deploy_env step: field 'id': required field is missing; field 'type': required field is missing. "
        "A step given there replaces the task's step whole: give all of its fields, or leave it out to run "
        "the task's own")
