"""The plan of a task: edges (reference agentenv.md §1.3), ancestry, sinks, the static join
check (DESIGN "Context visibility"), slicing (§1.3 Task.run), the content hash, compile-time
name collisions, and custom step types (§1.1, ``[task_steps] impls``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import custom_steps
from agentenv_dagster.compiler import compile_paths, load_plan, step_registry
from agentenv_dagster.config import AgentEnvConfig, load_config
from agentenv_dagster.errors import SpecError, TaskLoadError
from agentenv_dagster.plan import TaskPlan
from agentenv_dagster.spec.loader import load_task_file, parse_task_document
from agentenv_dagster.steps import BUILTIN_STEPS, StepRegistry
from agentenv_dagster.steps.registry import StepRegistryError

# -- helpers ---------------------------------------------------------------------------------


def node(step_id: str, depends_on: Any = "absent") -> dict[str, Any]:
    """A step with no context joins (deploy_env of an env named after the step)."""
    step: dict[str, Any] = {"id": step_id, "type": "deploy_env", "env_id": f"env-{step_id}"}
    if depends_on != "absent":
        step["depends_on"] = depends_on
    return step


def plan_of(steps: list[dict[str, Any]], registry: StepRegistry = BUILTIN_STEPS) -> TaskPlan:
    return TaskPlan(parse_task_document(steps, source="t.json", default_id="t", registry=registry))


def write(folder: Path, name: str, steps: Any) -> Path:
    path = folder / name
    path.write_text(json.dumps(steps))
    return path


@pytest.fixture
def config(tmp_path, monkeypatch) -> AgentEnvConfig:
    monkeypatch.delenv("AGENT_ENV_CONFIG", raising=False)
    return AgentEnvConfig(root=tmp_path)


def join_problems(tmp_path: Path, config: AgentEnvConfig, steps: list[dict[str, Any]]) -> list[str]:
    """Every join error of the file, without the file prefix (checked once here)."""
    path = write(tmp_path, "task.json", steps)
    with pytest.raises(TaskLoadError) as info:
        load_plan(path, config)
    prefix = f"{path}: "
    assert all(str(e).startswith(prefix) for e in info.value.errors)
    assert all(e.file == str(path) for e in info.value.errors)
    return [str(e).removeprefix(prefix) for e in info.value.errors]


ENV = {"id": "env", "type": "deploy_env", "env_id": "email"}
AGENT = {"id": "agent", "type": "deploy_agent", "env_ids": ["email"]}
PROMPT = {"id": "ask", "type": "prompt_agent", "prompt": "Sort the inbox", "prompt_id": "q1"}
VERIFY = {"id": "judge", "type": "rubrics_verifier", "prompt_id": "q1", "criteria": [{"id": "c"}],
          "verifier_id": "v1"}
COLLECT = {"id": "collect", "type": "collect_artifacts"}
LOAD = {"id": "reload", "type": "load_artifact", "artifact_from_step_id": "collect", "env_id": "email"}
TEARDOWN = {"id": "down", "type": "teardown_sandboxes", "agent_names": ["default-agent"], "env_ids": ["email"]}


# -- edges -----------------------------------------------------------------------------------


def test_absent_depends_on_waits_for_every_earlier_step():
    plan = plan_of([node("a"), node("b"), node("c")])
    assert plan.edges == {"a": (), "b": ("a",), "c": ("a", "b")}


def test_null_depends_on_is_the_same_as_absent():
    plan = plan_of([node("a", None), node("b", None)])
    assert plan.edges == {"a": (), "b": ("a",)}


def test_empty_depends_on_is_a_root():
    plan = plan_of([node("a"), node("b", []), node("c", [])])
    assert plan.edges == {"a": (), "b": (), "c": ()}


def test_upstream_pin_null_root_null():
    # depends_on_test: a(null), b([]), c(null) -> a:{}, b:{}, c:{a,b}
    plan = plan_of([node("a", None), node("b", []), node("c", None)])
    assert {k: set(v) for k, v in plan.edges.items()} == {"a": set(), "b": set(), "c": {"a", "b"}}


def test_diamond():
    plan = plan_of([node("a"), node("b", ["a"]), node("c", [{"task_step_id": "a"}]), node("d", ["b", "c"])])
    assert plan.edges == {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")}
    assert plan.sinks == ("d",)
    assert plan.ancestors("d") == frozenset({"a", "b", "c"})
    assert plan.ancestors("b") == plan.ancestors("c") == frozenset({"a"})
    assert plan.ancestors("a") == frozenset()


def test_ancestors_are_transitive_and_exclude_siblings():
    plan = plan_of([node("a"), node("b", ["a"]), node("x", []), node("c", ["b"])])
    assert plan.ancestors("c") == frozenset({"a", "b"})
    assert plan.ancestors("x") == frozenset()


def test_a_null_step_is_a_fan_in_barrier_over_parallel_branches():
    plan = plan_of([node("a", []), node("b", []), node("c", ["a"]), node("d")])
    assert plan.edges["d"] == ("a", "b", "c")
    assert plan.ancestors("d") == frozenset({"a", "b", "c"})
    assert plan.sinks == ("d",)


def test_sinks_are_the_steps_nothing_waits_for_in_list_order():
    assert plan_of([node("a"), node("b", []), node("c", ["a"])]).sinks == ("b", "c")
    assert plan_of([node("a", None), node("b", []), node("c", None)]).sinks == ("c",)
    assert plan_of([node("only")]).sinks == ("only",)


def test_a_step_merges_the_contexts_of_the_dependencies_nothing_else_descends_from():
    chain = plan_of([node("a"), node("b"), node("c")])  # absent depends_on: c waits for a and b
    assert chain.context_sources("c") == ("b",)  # b's context already holds a's
    barrier = plan_of([node("a", []), node("b", []), node("c", ["a"]), node("d")])
    assert barrier.context_sources("d") == ("b", "c")  # a flows in through c; b is its own branch
    diamond = plan_of([node("a"), node("b", ["a"]), node("c", ["a"]), node("d", ["b", "c"])])
    assert diamond.context_sources("d") == ("b", "c") and diamond.context_sources("a") == ()


# -- the static join check -------------------------------------------------------------------


def test_a_correct_chain_passes(tmp_path, config):
    path = write(tmp_path, "chain.json", [ENV, AGENT, PROMPT, VERIFY, COLLECT, LOAD, TEARDOWN])
    plan = load_plan(path, config)
    assert plan.join_errors() == []
    assert [s.id for s in plan.steps] == ["env", "agent", "ask", "judge", "collect", "reload", "down"]


def test_a_correct_parallel_plan_passes(tmp_path, config):
    steps = [
        ENV,
        {**AGENT, "depends_on": ["env"]},
        {**PROMPT, "depends_on": ["agent"]},
        {**VERIFY, "depends_on": ["ask"]},
        {"id": "other-env", "type": "deploy_env", "env_id": "item-store", "depends_on": []},
    ]
    assert load_plan(write(tmp_path, "par.json", steps), config).join_errors() == []


def test_agent_deployed_only_by_a_sibling_branch(tmp_path, config):
    steps = [ENV, {**AGENT, "depends_on": ["env"]},
             {"id": "p", "type": "prompt_agent", "prompt": "hi", "depends_on": ["env"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'p': field 'agent_name': no step it depends on deploys agent 'default-agent' "
        "(step 'agent' does, but is not among its dependencies: add it to depends_on)"
    ]


def test_agent_deployed_by_nobody(tmp_path, config):
    steps = [ENV, {"id": "p", "type": "prompt_agent", "prompt": "hi", "agent_name": "solver"}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'p': field 'agent_name': no step it depends on deploys agent 'solver'"
    ]


def test_env_ids_deployed_by_nobody(tmp_path, config):
    steps = [{"id": "agent", "type": "deploy_agent", "env_ids": ["email", "calendar"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'agent': field 'env_ids': no step it depends on deploys env 'email'",
        "step 'agent': field 'env_ids': no step it depends on deploys env 'calendar'",
    ]


def test_env_deployed_in_a_sibling_branch(tmp_path, config):
    steps = [{"id": "e", "type": "deploy_env", "env_id": "email", "depends_on": []},
             {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "depends_on": []}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'agent': field 'env_ids': no step it depends on deploys env 'email' "
        "(step 'e' does, but is not among its dependencies: add it to depends_on)"
    ]


def test_prompt_id_answered_only_by_a_sibling(tmp_path, config):
    steps = [ENV, AGENT, PROMPT, {**VERIFY, "depends_on": ["agent"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'judge': field 'prompt_id': no step it depends on answers prompt_id 'q1' "
        "(step 'ask' does, but is not among its dependencies: add it to depends_on)"
    ]


def test_prompt_id_answered_by_nobody(tmp_path, config):
    steps = [ENV, AGENT, PROMPT,
             {"id": "check", "type": "agent_prompt_response_verifier", "prompt_id": "q2",
              "criteria": [{"type": "response_contains", "needles": ["done"]}]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'check': field 'prompt_id': no step it depends on answers prompt_id 'q2'"
    ]


def test_a_prompt_without_prompt_id_is_answered_under_its_step_id(tmp_path, config):
    steps = [ENV, AGENT, {"id": "ask", "type": "prompt_agent", "prompt": "hi"},
             {"id": "check", "type": "agent_prompt_response_verifier", "prompt_id": "ask",
              "criteria": [{"type": "response_contains", "needles": ["done"]}]}]
    assert load_plan(write(tmp_path, "t.json", steps), config).join_errors() == []


def test_verifier_id_written_only_by_a_sibling(tmp_path, config):
    config.task_steps.impls = ["custom_steps:AggregateScoresStep"]
    steps = [ENV, AGENT, PROMPT, {**VERIFY, "depends_on": ["ask"]},
             {"id": "agg", "type": "aggregate_scores", "verifier_ids": ["v1", "judge"], "depends_on": ["ask"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'agg': field 'verifier_ids': no step it depends on writes verifier_id 'v1' "
        "(step 'judge' does, but is not among its dependencies: add it to depends_on)",
        "step 'agg': field 'verifier_ids': no step it depends on writes verifier_id 'judge'",
    ]
    fixed = [*steps[:-1], {**steps[-1], "verifier_ids": ["v1"], "depends_on": ["judge"]}]
    assert join_problems(tmp_path, config, [*fixed, {"id": "agg2", "type": "aggregate_scores",
                                                      "verifier_ids": ["nope"]}]) == [
        "step 'agg2': field 'verifier_ids': no step it depends on writes verifier_id 'nope'"
    ]


def test_artifact_producer_in_a_sibling_branch(tmp_path, config):
    steps = [ENV, AGENT, {**COLLECT, "depends_on": ["agent"]},
             {**LOAD, "depends_on": ["env"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'reload': field 'artifact_from_step_id': no step it depends on records artifacts as "
        "step 'collect' (step 'collect' does, but is not among its dependencies: add it to depends_on)"
    ]


def test_legacy_collected_artifacts_step_id_is_joined_too(tmp_path, config):
    steps = [ENV, {"id": "reload", "type": "load_artifact", "collected_artifacts_step_id": "gone",
                   "env_id": "email"}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'reload': field 'collected_artifacts_step_id': no step it depends on records "
        "artifacts as step 'gone'"
    ]


def test_sandbox_names_no_step_deploys(tmp_path, config):
    steps = [ENV, {"id": "down", "type": "teardown_sandboxes", "sandbox_names": ["box"]}]
    assert join_problems(tmp_path, config, steps) == [
        "step 'down': field 'sandbox_names': no step it depends on deploys sandbox 'box'"
    ]


def test_sandbox_names_deployed_by_an_ancestor_or_a_sibling(tmp_path, config):
    box = {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"}
    chain = [box, {"id": "down", "type": "teardown_sandboxes", "sandbox_names": ["box"]}]
    assert load_plan(write(tmp_path, "chain.json", chain), config).join_errors() == []
    siblings = [box, {"id": "down", "type": "teardown_sandboxes", "sandbox_names": ["box"], "depends_on": []}]
    assert join_problems(tmp_path, config, siblings) == [
        "step 'down': field 'sandbox_names': no step it depends on deploys sandbox 'box' "
        "(step 'box' does, but is not among its dependencies: add it to depends_on)"
    ]


def test_stored_artifact_ids_are_not_joins(tmp_path, config):
    steps = [ENV, {"id": "seed", "type": "load_artifact", "artifact_id": "inbox-v1", "env_id": "email"}]
    plan = load_plan(write(tmp_path, "t.json", steps), config)
    assert plan.join_errors() == []
    assert plan.artifact_lineage("seed") == ["inbox-v1"]


def test_every_join_error_is_a_located_spec_error(tmp_path, config):
    steps = [{"id": "p", "type": "prompt_agent", "prompt": "hi"},
             {"id": "v", "type": "rubrics_verifier", "prompt_id": "zz", "criteria": [{"id": "c"}],
              "agent_name": "judge-agent"}]
    path = write(tmp_path, "t.json", steps)
    with pytest.raises(TaskLoadError) as info:
        load_plan(path, config)
    assert [(e.file, e.step_id, e.field, e.message) for e in info.value.errors] == [
        (str(path), "p", "agent_name", "no step it depends on deploys agent 'default-agent'"),
        (str(path), "v", "prompt_id", "no step it depends on answers prompt_id 'zz'"),
        (str(path), "v", "agent_name", "no step it depends on deploys agent 'judge-agent'"),
    ]


@pytest.mark.timeout(60)  # a check quadratic in steps would not finish; the time is bench/join_check.py's
@pytest.mark.parametrize("linked", ["chain", "absent"])
def test_ten_thousand_steps_are_checked_in_one_pass(tmp_path, config, linked):
    """Every odd step resets the env its predecessor deployed: in a chain each reads an
    ancestor's write; with depends_on absent, every earlier step is an ancestor."""
    steps = []
    for i in range(10_000):
        step = ({"id": f"s{i}", "type": "deploy_env", "env_id": f"e{i}"} if i % 2 == 0
                else {"id": f"s{i}", "type": "reset_env", "env_id": f"e{i - 1}"})
        if linked == "chain":
            step["depends_on"] = [f"s{i - 1}"] if i else []
        steps.append(step)
    steps.append({"id": "late", "type": "reset_env", "env_id": "e0", "depends_on": [],
                  "retry_config": {"retry_from_step_id": "s0"}})
    assert join_problems(tmp_path, config, steps) == [
        "step 'late': field 'retry_config': Step 'late' at position 10000 declares retry_config.retry_from_step_id 's0' "
        "which is not in the step's dependency ancestry (ancestor ids: [])"]
    del steps[-1]["retry_config"]
    assert join_problems(tmp_path, config, steps) == [
        "step 'late': field 'env_id': no step it depends on deploys env 'e0' "
        "(step 's0' does, but is not among its dependencies: add it to depends_on)"]
    plan = load_plan(write(tmp_path, "ok.json", steps[:-1]), config)
    assert plan.ancestors("s3") == frozenset({"s0", "s1", "s2"})


# -- slicing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [-1, 3, 7])
def test_slice_start_out_of_range(start):
    plan = plan_of([node("a"), node("b"), node("c")])
    with pytest.raises(SpecError) as info:
        plan.slice(start)
    assert str(info.value) == f"start_step={start} out of range [0, 3)"


@pytest.mark.parametrize(("start", "end"), [(0, 0), (1, 1), (2, 1), (0, 4)])
def test_slice_end_out_of_range(start, end):
    plan = plan_of([node("a"), node("b"), node("c")])
    with pytest.raises(SpecError, match=re.escape(f"end_step={end} out of range ({start}, 3]")):
        plan.slice(start, end)


def test_slice_of_an_empty_task():
    with pytest.raises(SpecError, match=re.escape("start_step=0 out of range [0, 0)")):
        plan_of([]).slice(0)


def test_slice_keeps_the_span_and_drops_edges_to_earlier_steps():
    plan = plan_of([node("a"), node("b", ["a"]), node("c"), node("d", ["a", "c"]), node("e")])
    sliced = plan.slice(2, 4)
    assert [s.id for s in sliced.steps] == ["c", "d"]
    assert sliced.edges == {"c": (), "d": ("c",)}
    assert [s.depends_on for s in sliced.steps] == [[], ["c"]]
    assert (sliced.task_id, sliced.document.source) == ("t", "t.json")
    # the original plan is untouched
    assert plan.edges["d"] == ("a", "c")
    assert [s.depends_on for s in plan.steps] == [None, ["a"], None, ["a", "c"], None]


def test_slice_end_defaults_to_the_last_step():
    sliced = plan_of([node("a"), node("b"), node("c")]).slice(1)
    assert [s.id for s in sliced.steps] == ["b", "c"]
    assert sliced.edges == {"b": (), "c": ("b",)}


def test_a_sliced_plan_needs_the_saved_context_names():
    plan = plan_of([ENV, AGENT, PROMPT, VERIFY])
    regrade = plan.slice(3)
    assert [str(e) for e in regrade.join_errors()] == [
        "t.json: step 'judge': field 'prompt_id': no step it depends on answers prompt_id 'q1'"
    ]
    assert plan.slice(3, given_names=[("prompt", "q1")]).join_errors() == []


def test_a_sliced_plan_accepts_names_from_a_saved_context():
    from agentenv_dagster.cli import context_names

    saved = {
        "deployed_envs": [{"env_id": "email", "env_version": "1"}],
        "deployed_agents": [{"agent_name": "default-agent", "api_url": "http://127.0.0.1:1"}],
        "prompt_responses": [{"prompt_id": "q1", "response": "done"}],
        "metadata": {"verifications": {"v1": {"score": 1.0}}, "collected_artifacts": {"collect": {}}},
    }
    names = context_names(saved)
    assert names == {("env", "email"), ("agent", "default-agent"), ("prompt", "q1"),
                     ("verification", "v1"), ("producer", "collect")}
    plan = plan_of([ENV, AGENT, PROMPT, VERIFY, COLLECT, LOAD])
    assert plan.slice(2, given_names=names).join_errors() == []
    assert plan.slice(5, given_names=names).join_errors() == []
    assert [e.message for e in plan.slice(5).join_errors()] == [
        "no step it depends on deploys env 'email'",
        "no step it depends on records artifacts as step 'collect'",
    ]


# -- content hash ----------------------------------------------------------------------------


def test_content_hash_is_stable_across_loads(tmp_path):
    steps = [ENV, AGENT, PROMPT, VERIFY]
    path = write(tmp_path, "t.json", steps)
    first = load_task_file(path, BUILTIN_STEPS).content_hash
    second = load_task_file(path, BUILTIN_STEPS).content_hash
    assert first == second
    assert re.fullmatch(r"[0-9a-f]{16}", first)
    # key order and defaults spelled out do not matter: the stored form is canonical
    reordered = [dict(reversed(list(s.items()))) for s in steps]
    reordered[0]["ttl_seconds"] = 7200
    assert load_task_file(write(tmp_path, "t.json", reordered), BUILTIN_STEPS).content_hash == first


def test_content_hash_changes_when_a_step_or_the_id_changes(tmp_path):
    base = load_task_file(write(tmp_path, "t.json", [ENV, AGENT, PROMPT]), BUILTIN_STEPS).content_hash
    changed_prompt = [ENV, AGENT, {**PROMPT, "prompt": "Sort the inbox now"}]
    changed_edge = [ENV, AGENT, {**PROMPT, "depends_on": ["agent"]}]
    hashes = {
        load_task_file(write(tmp_path, "t.json", changed_prompt), BUILTIN_STEPS).content_hash,
        load_task_file(write(tmp_path, "t.json", changed_edge), BUILTIN_STEPS).content_hash,
        load_task_file(write(tmp_path, "u.json", [ENV, AGENT, PROMPT]), BUILTIN_STEPS).content_hash,
    }
    assert base not in hashes
    assert len(hashes) == 3


# -- compile-time collisions -----------------------------------------------------------------


def test_job_name_collision_is_an_error_of_the_later_file(tmp_path, config):
    first = write(tmp_path, "email-triage.json", [ENV])
    second = write(tmp_path, "email_triage.json", [ENV])
    report = compile_paths([first, second], config)
    assert [p.task_id for p in report.plans] == ["email-triage"]
    assert [str(e) for e in report.errors] == [
        f"{second}: task 'email_triage' compiles to job 'email_triage', already used by {first}"
    ]


def test_job_name_collision_through_stored_ids(tmp_path, config):
    first = write(tmp_path, "a.json", {"id": "team.task", "type": "task", "steps": [ENV]})
    second = write(tmp_path, "b.json", {"id": "team-task", "type": "task", "steps": [ENV]})
    report = compile_paths([first, second], config)
    assert [str(e) for e in report.errors] == [
        f"{second}: task 'team-task' compiles to job 'team_task', already used by {first}"
    ]


def test_node_name_collision(tmp_path, config):
    path = write(tmp_path, "t.json", [node("deploy.env"), node("deploy-env"), node("deploy_env")])
    report = compile_paths([path], config)
    assert report.plans == []
    assert [str(e) for e in report.errors] == [
        f"{path}: step 'deploy-env': field 'id': step id 'deploy-env' and step id 'deploy.env' both become op 'deploy_env'",
        f"{path}: step 'deploy_env': field 'id': step id 'deploy_env' and step id 'deploy-env' both become op 'deploy_env'",
    ]


def test_a_bad_file_does_not_stop_the_others(tmp_path, config):
    bad = write(tmp_path, "bad.json", [{"id": "x", "type": "deploy_env"}])
    broken_join = write(tmp_path, "join.json", [{"id": "p", "type": "prompt_agent", "prompt": "hi"}])
    good = write(tmp_path, "good.json", [ENV, AGENT])
    report = compile_paths([bad, broken_join, good], config)
    assert [p.task_id for p in report.plans] == ["good"]
    assert [str(e) for e in report.errors] == [
        f"{bad}: step 'x': field 'env_id': required field is missing",
        f"{broken_join}: step 'p': field 'agent_name': no step it depends on deploys agent 'default-agent'",
    ]


def test_a_yaml_file_that_fails_to_be_a_task_names_the_real_cause(tmp_path, config):
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("task_id: t\ndescription: d\nsuccess_criteria:\n- {type: file_exists, path: [a.py\n")
    typo = tmp_path / "typo.yaml"
    typo.write_text("task_id: t\ndescription: d\ninitial_prompt: p\nsucess_criteria:\n"
                    "- {type: file_exists, path: a.py, description: d}\n")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("task_id: caf\xe9\n".encode("latin-1"))
    report = compile_paths([syntax, typo, latin1], config)
    assert [str(e) for e in report.errors] == [
        f"{syntax}: invalid YAML at line 5 column 1: expected ',' or ']', but got '<stream end>'",
        f"{typo}:4: field 'sucess_criteria': unknown field (did you mean 'success_criteria'? 'success_criteria' is required)",
        f"{latin1}: not UTF-8 text: byte 0xe9 at line 1 column 13 (save the file as UTF-8)",
    ]


def test_unknown_registry_ids_are_warnings_not_errors(tmp_path, config):
    path = write(tmp_path, "t.json", [
        {"id": "env", "type": "deploy_env", "env_id": "crm"},
        {"id": "agent", "type": "deploy_agent", "env_ids": ["crm"], "a2a_agent_id": "openhands"},
    ])
    report = compile_paths([path], config)
    assert report.errors == []
    assert [p.task_id for p in report.plans] == ["t"]
    assert report.warnings == [
        f"{path}: step 'env': env 'crm' is not in the local registry",
        f"{path}: step 'agent': agent 'openhands' is not in the local registry",
    ]


# -- custom step types -----------------------------------------------------------------------


def test_with_impls_adds_a_custom_type_without_touching_the_builtins():
    registry = BUILTIN_STEPS.with_impls(["custom_steps:EchoStep"])
    assert registry.get("echo") is custom_steps.EchoStep
    assert BUILTIN_STEPS.get("echo") is None
    assert set(registry.names()) == set(BUILTIN_STEPS.names()) | {"echo"}
    plan = plan_of([{"id": "hello", "type": "echo", "message": "hi", "repeat": 2}], registry)
    (step,) = plan.steps
    assert isinstance(step, custom_steps.EchoStep)
    assert step.to_document() == {"id": "hello", "type": "echo", "version": None,
                                  "fail_task_on_error": True, "message": "hi", "repeat": 2}


def test_a_custom_type_is_validated_like_a_builtin(tmp_path):
    registry = BUILTIN_STEPS.with_impls(["custom_steps:EchoStep"])
    path = write(tmp_path, "t.json", [{"id": "hello", "type": "echo", "mesage": "hi"}])
    with pytest.raises(TaskLoadError) as info:
        load_task_file(path, registry)
    assert [str(e) for e in info.value.errors] == [
        f"{path}: step 'hello': field 'message': required field is missing; "
        "field 'mesage': unknown field (did you mean 'message'?)"
    ]


def test_a_custom_type_colliding_with_a_builtin_is_refused():
    with pytest.raises(StepRegistryError) as info:
        BUILTIN_STEPS.with_impls(["custom_steps:CollidingStep"])
    assert str(info.value) == (
        "custom_steps:CollidingStep declares type 'deploy_env', which collides with "
        "agentenv_dagster.steps.deploy:DeployEnvStep"
    )


def test_a_custom_type_keeping_the_base_type_name_is_refused():
    with pytest.raises(StepRegistryError, match=re.escape(
        "custom_steps:UntypedStep must declare its own type_name"
    )):
        BUILTIN_STEPS.with_impls(["custom_steps:UntypedStep"])


def test_a_class_that_is_not_a_task_step_is_refused():
    with pytest.raises(StepRegistryError) as info:
        BUILTIN_STEPS.with_impls(["custom_steps:NotAStep"])
    assert str(info.value) == "[task_steps] impls entry 'custom_steps:NotAStep' is not a TaskStep subclass"


@pytest.mark.parametrize("pointer", ["custom_steps.EchoStep", "custom_steps:", ":EchoStep", ""])
def test_a_malformed_pointer_is_refused(pointer):
    with pytest.raises(StepRegistryError) as info:
        BUILTIN_STEPS.with_impls([pointer])
    assert str(info.value) == f"[task_steps] impls entry {pointer!r} is not 'module.path:ClassName'"


def test_a_pointer_that_cannot_be_imported_is_refused():
    with pytest.raises(StepRegistryError) as info:
        BUILTIN_STEPS.with_impls(["no_such_module_xyz:Step"])
    assert str(info.value) == (
        "[task_steps] impls entry 'no_such_module_xyz:Step' cannot be imported: "
        "No module named 'no_such_module_xyz'"
    )
    with pytest.raises(StepRegistryError) as info:
        BUILTIN_STEPS.with_impls(["custom_steps:Missing"])
    assert str(info.value).startswith("[task_steps] impls entry 'custom_steps:Missing' cannot be imported: ")
    assert "Missing" in str(info.value).split("cannot be imported: ", 1)[1]


def test_a_custom_type_from_the_project_config(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENT_ENV_CONFIG", raising=False)
    project = tmp_path / "project"
    (project / ".agentenv").mkdir(parents=True)
    (project / ".agentenv" / "config.toml").write_text(
        '[task_steps]\nimpls = ["custom_steps:EchoStep", "custom_steps:AggregateScoresStep"]\n'
    )
    (project / "tasks").mkdir()
    path = write(project / "tasks", "hello.json", [{"id": "hello", "type": "echo", "message": "hi"}])

    config = load_config(project / "tasks")  # found by walking up
    assert config.task_steps.impls == ["custom_steps:EchoStep", "custom_steps:AggregateScoresStep"]
    assert config.root == project.resolve()
    assert step_registry(config).get("aggregate_scores") is custom_steps.AggregateScoresStep

    report = compile_paths([path], config)
    assert report.errors == []
    assert [type(s) for s in report.plans[0].steps] == [custom_steps.EchoStep]

    default = load_config(tmp_path)  # no config file above tmp_path: built-ins only
    assert default.task_steps.impls == []
    report = compile_paths([path], default)
    assert [str(e) for e in report.errors] == [f"{path}: step 'hello': field 'type': Unknown task step type: echo"]


def test_a_bad_impl_in_the_project_config_fails_the_compile(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENT_ENV_CONFIG", raising=False)
    (tmp_path / ".agentenv").mkdir()
    (tmp_path / ".agentenv" / "config.toml").write_text('[task_steps]\nimpls = ["custom_steps:CollidingStep"]\n')
    config = load_config(tmp_path)
    with pytest.raises(StepRegistryError, match=re.escape("collides with agentenv_dagster.steps.deploy:DeployEnvStep")):
        compile_paths([write(tmp_path, "t.json", [ENV])], config)


def test_a_producer_later_in_the_list_is_named_without_suggesting_a_forward_ref(tmp_path):
    path = write(tmp_path, "t.json", [
        {"id": "ask", "type": "prompt_agent", "agent_name": "late", "prompt": "hi", "depends_on": []},
        {"id": "agent", "type": "deploy_agent", "agent_name": "late", "depends_on": []},
    ])
    report = compile_paths([path], load_config(tmp_path))
    assert [str(e) for e in report.errors] == [
        f"{path}: step 'ask': field 'agent_name': no step it depends on deploys agent 'late' "
        "(step 'agent' does, but comes after it in the list)"
    ]
