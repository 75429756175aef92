"""The code location: jobs mirror the steps, assets and checks are declared before any run."""

from __future__ import annotations

import json

import dagster as dg
import pytest
import yaml
from dagster_graphql.schema.run_config import default_values_yaml_from_type_snap

from agentenv_dagster import build_definitions
from agentenv_dagster.errors import TaskLoadError

def task_graph(job: dg.JobDefinition) -> dg.GraphDefinition:
    """The task's op graph: the one node of its job (the graph backing the task's assets)."""
    (node,) = job.graph.nodes
    return node.definition


def step_ops(graph: str, config: dict) -> dict:
    """Run config for a task's graph."""
    return {"ops": {graph: {"config": config}}}


VERIFICATION = dg.AssetKey(["verifications", "reply_to_dana", "sent"])
TONE = dg.AssetKey(["verifications", "reply_to_dana", "tone"])
COLLECTED = dg.AssetKey(["artifacts", "reply_to_dana", "collect"])
INBOX = dg.AssetKey(["artifacts", "inbox"])


def test_one_job_per_task_with_ops_named_after_steps_and_depends_on_edges(project):
    defs = build_definitions(project / "tasks")
    job = defs.resolve_job_def("reply_to_dana")
    graph = task_graph(job)
    assert graph.name == "reply_to_dana_steps"
    nodes = {node.name for node in graph.nodes}
    assert nodes == {"email", "inbox", "assistant", "reply", "tone", "sent", "collect", "teardown_run"}
    upstream = {
        invocation.alias: sorted(d.node for edges in inputs.values() for d in edges.get_node_dependencies())
        for invocation, inputs in graph.dependencies.items()
    }
    assert upstream["email"] == []
    assert upstream["inbox"] == ["email"] and upstream["assistant"] == ["email"]
    assert upstream["reply"] == ["assistant", "inbox"]
    assert upstream["teardown_run"] == ["collect", "sent", "tone"]
    # a node loads the contexts of the dependencies nothing else descends from; the others order it
    loaded = {
        invocation.alias: sorted(d.node for d in inputs["upstream"].get_node_dependencies())
        for invocation, inputs in graph.dependencies.items() if "upstream" in inputs
    }
    plan_sources = {"reply": ["assistant", "inbox"], "teardown_run": ["collect", "sent", "tone"]}
    assert {k: loaded[k] for k in plan_sources} == plan_sources
    # an op definition per step, saying what the step does
    reply = graph.node_named("reply")
    assert reply.tags["agentenv/step_type"] == "prompt_agent" and reply.tags["agentenv/step_id"] == "reply"
    assert reply.definition.description == "Step `reply` (prompt_agent): reads agent `assistant`; writes prompt `reply`."
    job = defs.resolve_job_def("reply_to_dana")
    assert job.description.startswith('Prompt: "Reply to Dana."') and "agent-env task `reply_to_dana`" in job.description
    assert job.tags["agentenv/task_id"] == "reply_to_dana"
    assert len(job.tags["agentenv/content_hash"]) == 16


def test_a_chain_node_loads_one_context_and_is_ordered_after_the_rest(project):
    (project / "tasks" / "chain.json").write_text(json.dumps([  # absent depends_on: after every earlier step
        {"id": "email", "type": "deploy_env", "env_id": "email"},
        {"id": "assistant", "type": "deploy_agent", "env_ids": ["email"], "agent_name": "assistant"},
        {"id": "ask", "type": "prompt_agent", "agent_name": "assistant", "prompt_id": "p", "prompt": "hi"},
    ]))
    graph = task_graph(build_definitions(project / "tasks").resolve_job_def("chain"))
    inputs = {invocation.alias: {name: sorted(d.node for d in edges.get_node_dependencies())
                                 for name, edges in deps.items()}
              for invocation, deps in graph.dependencies.items()}
    assert inputs["ask"] == {"upstream": ["assistant"], "after": ["email"]}
    assert inputs["assistant"] == {"upstream": ["email"]}
    # "after" streams are waited for row by row, their contexts not merged (another input has them)
    after = graph.node_named("ask").definition.input_def_named("after")
    assert after.description.startswith("streams whose rows it only waits for")


def test_step_fields_are_launchpad_config(project):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    # what the launchpad opens with: the webserver's rootDefaultYaml, from the job snapshot
    snap = job.get_job_snapshot()
    root = snap.config_schema_snapshot.get_config_snap(snap.mode_def_snaps[0].root_config_key)
    prefilled = yaml.safe_load(default_values_yaml_from_type_snap(snap.config_schema_snapshot, root))
    step = prefilled["ops"]["reply_to_dana_steps"]["config"]["steps"]["reply"]
    assert step["prompt"] == "Reply to Dana." and step["agent_name"] == "assistant"


def test_a_step_edited_in_the_launchpad_replaces_that_step_and_keeps_the_others(project):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    edited = {"id": "reply", "type": "prompt_agent", "agent_name": "assistant", "prompt": "Reply to Sam."}
    resolved = dg.validate_run_config(job, {**step_ops("reply_to_dana_steps", {"steps": {"reply": edited}}),
                                            "resources": {"agentenv": {"config": {"project_dir": str(project),
                                                                                   "rows_in_flight": 3}}}})
    ops = resolved["ops"]  # (Dagster's resolved form names a graph's nodes by their handle)
    assert ops["reply_to_dana_steps.reply"]["config"]["step"] == edited
    assert ops["reply_to_dana_steps.tone"]["config"]["step"]["id"] == "tone"
    assert resolved["resources"]["agentenv"]["config"]["rows_in_flight"] == 3


def test_run_config_outside_the_steps_is_checked_against_the_job(project):
    job = build_definitions(project / "tasks").resolve_job_def("reply_to_dana")
    with pytest.raises(dg.DagsterInvalidConfigError, match="rows_in_flght"):
        dg.validate_run_config(job, {"resources": {"agentenv": {"config": {"project_dir": str(project),
                                                                           "rows_in_flght": 3}}}})
    with pytest.raises(dg.DagsterInvalidConfigError, match="stepz"):
        dg.validate_run_config(job, step_ops("reply_to_dana_steps", {"stepz": {}}))


def test_assets_and_checks_are_declared_with_lineage_from_the_loaded_artifact(project):
    defs = build_definitions(project / "tasks")
    graph = defs.resolve_asset_graph()
    assert {VERIFICATION, TONE, COLLECTED, INBOX} <= set(graph.get_all_asset_keys())
    # the env-outcome verdict reads the env loaded from the inbox, with its script artifact
    assert graph.get(VERIFICATION).parent_keys == {INBOX, dg.AssetKey(["artifacts", "dana_reply_check"])}
    assert graph.get(TONE).parent_keys == {INBOX}
    assert graph.get(COLLECTED).parent_keys == {INBOX}
    # each row's outcome, made from every asset of the task
    results = dg.AssetKey(["results", "reply_to_dana"])
    assert graph.get(results).parent_keys == {VERIFICATION, TONE, COLLECTED}
    # one multi-asset backed by the task's graph: Materialize runs the task
    assert graph.get(VERIFICATION).assets_def is graph.get(results).assets_def
    assert graph.get(VERIFICATION).is_executable
    checks = {key for key in graph.asset_check_keys}
    assert dg.AssetCheckKey(VERIFICATION, "passed") in checks
    assert dg.AssetCheckKey(TONE, "passed") in checks


def test_a_bad_task_file_is_skipped_and_reported_not_fatal(project):
    (project / "tasks" / "broken.json").write_text(json.dumps([
        {"id": "a", "type": "deploy_env", "env_id": "email", "ttl_secnds": 5}
    ]))
    defs = build_definitions(project / "tasks")
    assert defs.resolve_job_def("reply_to_dana") is not None
    placeholder = defs.resolve_job_def("broken__invalid")
    assert "step 'a': field 'ttl_secnds': unknown field (did you mean 'ttl_seconds'?)" in placeholder.description
    result = placeholder.execute_in_process(raise_on_error=False)
    assert not result.success


def test_strict_mode_refuses_a_bad_task_file(project):
    (project / "tasks" / "broken.json").write_text("[{]")
    with pytest.raises(TaskLoadError, match=r"broken.json: invalid JSON at line 1 column 3"):
        build_definitions(project / "tasks", strict=True)


def test_a_custom_translator_names_the_assets_the_runs_report(project):
    from agentenv_dagster.orchestration.translator import TaskTranslator

    class Prefixed(TaskTranslator):
        def get_verification_asset_key(self, task_id, verifier_id):
            return dg.AssetKey(["evals", task_id, verifier_id])

    defs = build_definitions(project / "tasks", translator=Prefixed())
    key = dg.AssetKey(["evals", "reply_to_dana", "sent"])
    assert key in defs.resolve_asset_graph().get_all_asset_keys()
    with dg.instance_for_test() as instance:
        assert defs.resolve_job_def("reply_to_dana").execute_in_process(instance=instance).success
        assert instance.get_latest_materialization_event(key) is not None
        assert instance.get_latest_materialization_event(VERIFICATION) is None
