"""aggregate_verifiers, run for real: a replay agent's reply and files checked by two verifiers,
their rows scored once (reference agentenv.md §3 "Other steps", scoring), and its asset drawn
downstream of theirs."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

REPLAY = """
[agents.registry.scribe]
kind = "replay"
episodes = [{match = "note", reply = "noted", actions = [{write_file = "/app/artifact/notes/a.txt", content = "A"}]}]
"""
AGENT = {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "scribe", "agent_name": "s", "depends_on": []}
ASK = {"id": "ask", "type": "prompt_agent", "agent_name": "s", "prompt_id": "p", "prompt": "take a note"}
RESP = {"id": "resp", "type": "agent_prompt_response_verifier", "prompt_id": "p", "depends_on": ["ask"], "criteria": [
    {"type": "response_contains", "needles": ["noted"]},
    {"type": "response_contains", "needles": ["signed"], "weight": 3},
]}
BOX = {"id": "box", "type": "verify_sandbox", "agent_name": "s", "base_dir": "/app/artifact", "depends_on": ["ask"],
       "criteria": [{"type": "probe_file_exists", "paths": ["notes/a.txt"]},
                    {"type": "llm_judge", "criterion": "left for a rubric"}]}


def aggregate(step_id: str, verifier_ids: list[str], **extra) -> dict:
    return {"id": step_id, "type": "aggregate_verifiers", "verifier_ids": verifier_ids,
            "depends_on": ["resp", "box"], **extra}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", extra_config=REPLAY, model={"api_key": ""})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_rows_of_several_verifiers_are_scored_once_without_the_skipped_ones(project):
    context = run_steps(project, [
        AGENT, ASK, RESP, BOX,
        aggregate("weighted", ["resp", "box"], verifier_id="overall"),
        aggregate("strict", ["box", "resp"], score_aggregator="all_pass"),
        aggregate("lenient", ["resp"], score_aggregator="any_pass"),
    ])
    verifications = context.metadata["verifications"]
    # the sources: resp 1 of 2 needles, box 1 probe passed and 1 criterion left to another verifier
    assert [r["result"] for r in verifications["resp"]["results"]] == [True, False]
    assert [r["skipped"] for r in verifications["box"]["results"]] == [False, True]
    # default weighted_average over the 3 rows counted: (1*1 + 0*3 + 1*1) / (1 + 3 + 1)
    assert verifications["overall"] == {"score": pytest.approx(0.4), "source_verifier_ids": ["resp", "box"]}
    assert verifications["strict"] == {"score": 0.0, "source_verifier_ids": ["box", "resp"]}
    assert verifications["lenient"] == {"score": 1.0, "source_verifier_ids": ["resp"]}
    assert "weighted" not in verifications  # keyed by verifier_id when set
    assert "failed_steps" not in context.metadata


def test_a_verification_that_was_not_graded_leaves_the_aggregate_not_graded(project):
    rubric = {"id": "tone", "type": "rubrics_verifier", "prompt_id": "p", "use_agent_judge": False,
              "use_trajectory": False, "criteria": [{"id": "polite", "criterion": "The reply is polite."}],
              "depends_on": ["ask"]}
    context = run_steps(project, [
        AGENT, ASK, RESP, BOX, rubric,
        {"id": "all", "type": "aggregate_verifiers", "verifier_ids": ["resp", "tone"], "depends_on": ["resp", "tone"]},
    ])
    assert context.metadata["verifications"]["tone"]["graded"] is False
    assert context.metadata["verifications"]["all"] == {
        "score": None, "graded": False, "reason": "source verification(s) not graded: ['tone']",
        "source_verifier_ids": ["resp", "tone"],
    }


def test_a_verification_missing_at_run_time_fails_with_what_is_available(project):
    # the env-outcome verifier fails (tolerated) before writing: its id is declared, but absent
    steps = [
        {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
        {"id": "gone", "type": "env_outcome_verifier", "env_id": "email", "file_artifact_id": "no_such_script",
         "fail_task_on_error": False},
        {"id": "empty", "type": "aggregate_verifiers", "verifier_ids": []},
        {"id": "all", "type": "aggregate_verifiers", "verifier_ids": ["gone", "empty"]},
    ]
    expected = ("AggregateVerifiers: verifier_id(s) not found in context.metadata.verifications: ['gone']. "
                "Available: ['empty']")
    with pytest.raises(StepFailed, match=re.escape(f"step 'all' (aggregate_verifiers) failed: {expected}")) as info:
        run_steps(project, steps)
    assert info.value.record["is_fatal"] is True


def test_an_aggregate_must_depend_on_the_verifiers_it_names(project):
    steps = [AGENT, ASK, RESP, BOX, {"id": "all", "type": "aggregate_verifiers", "verifier_ids": ["resp", "box"],
                                     "depends_on": ["resp"]}]
    with pytest.raises(TaskLoadError, match=re.escape(
        "step 'all': field 'verifier_ids': no step it depends on writes verifier_id 'box' "
        "(step 'box' does, but is not among its dependencies: add it to depends_on)"
    )):
        run_steps(project, steps)


def test_the_aggregate_asset_is_one_multi_asset_with_the_aggregated_verifications(tmp_path):
    root = make_project(tmp_path / "p", extra_config=REPLAY, tasks={"notes.json": [
        AGENT, ASK, RESP, BOX, aggregate("overall", ["resp", "box"]),
    ]})
    graph = build_definitions(root / "tasks", strict=True).resolve_asset_graph()

    def key(verifier_id: str) -> dg.AssetKey:
        return dg.AssetKey(["verifications", "notes", verifier_id])

    # one multi-asset, the task's graph: the aggregate is materialized by the same run as the
    # verifications it aggregates, downstream of them inside that graph
    assert {key("resp"), key("box"), key("overall")} <= set(graph.get_all_asset_keys())
    assert graph.get(key("overall")).assets_def is graph.get(key("resp")).assets_def
    assert dg.AssetCheckKey(key("overall"), "passed") in graph.asset_check_keys
