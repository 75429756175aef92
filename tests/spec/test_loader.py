"""Loading agent-env task documents: both stored forms, depends_on, the DAG checks and every
step-model validation message, each located as ``<file>: step '<id>': ...`` (reference
agentenv.md §1.1-1.4, §3). Also the versioned TaskStore."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from agentenv_dagster.errors import SpecError, TaskLoadError
from agentenv_dagster.spec.loader import (
    NOT_A_STEP_LIST,
    TaskDocument,
    load_task_file,
    parse_task_document,
)
from agentenv_dagster.spec.store import TaskStore
from agentenv_dagster.steps import BUILTIN_STEPS

# -- helpers ---------------------------------------------------------------------------------


def env(step_id: str, env_id: str = "email", **extra: Any) -> dict[str, Any]:
    return {"id": step_id, "type": "deploy_env", "env_id": env_id, **extra}


def write(tmp_path: Path, data: Any, name: str = "task.json") -> Path:
    """A str is written as is (raw file text); anything else as JSON."""
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def load(tmp_path: Path, data: Any, name: str = "task.json") -> TaskDocument:
    return load_task_file(write(tmp_path, data, name), BUILTIN_STEPS)


def problems(tmp_path: Path, data: Any, name: str = "task.json") -> tuple[str, list[str]]:
    """(the file's path, every reported problem as the user sees it)."""
    path = write(tmp_path, data, name)
    with pytest.raises(TaskLoadError) as info:
        load_task_file(path, BUILTIN_STEPS)
    assert str(info.value) == "\n".join(str(e) for e in info.value.errors)
    return str(path), [str(e) for e in info.value.errors]


def only_problem(tmp_path: Path, data: Any) -> str:
    path, found = problems(tmp_path, data)
    assert len(found) == 1, found
    return found[0].removeprefix(f"{path}: ")


def step_problem(tmp_path: Path, step: dict[str, Any]) -> str:
    """The one problem of ``step`` placed after a valid deploy_env step, minus the file."""
    return only_problem(tmp_path, [env("env"), step])


# -- stored forms ----------------------------------------------------------------------------


def test_bare_list_form_takes_the_file_stem_as_task_id(tmp_path):
    doc = load(tmp_path, [env("env"), {"id": "p", "type": "prompt_agent", "prompt": "hi"}], "my-task.json")
    assert doc.task_id == "my-task"
    assert doc.version is None
    assert doc.source == str(tmp_path / "my-task.json")
    assert [(s.id, s.type, type(s).__name__) for s in doc.steps] == [
        ("env", "deploy_env", "DeployEnvStep"),
        ("p", "prompt_agent", "PromptAgentStep"),
    ]


def test_stored_form_carries_id_and_version(tmp_path):
    doc = load(tmp_path, {"id": "email-triage", "type": "task", "version": 3, "steps": [env("env")]}, "x.json")
    assert (doc.task_id, doc.version) == ("email-triage", 3)
    assert [s.id for s in doc.steps] == ["env"]


def test_stored_form_with_legacy_project_id_and_created_at_loads(tmp_path):
    doc = load(tmp_path, {
        "id": "t1", "type": "task", "version": 2, "project_id": "legacy-project",
        "created_at_utc": "2025-01-01 00:00 UTC", "steps": [env("env")],
    })
    assert (doc.task_id, doc.version, len(doc.steps)) == ("t1", 2, 1)


def test_stored_form_without_id_falls_back_to_the_stem(tmp_path):
    doc = load(tmp_path, {"type": "task", "steps": [env("env")]}, "stemmy.json")
    assert (doc.task_id, doc.version) == ("stemmy", None)


def test_stored_form_round_trips_through_step_documents(tmp_path):
    steps = [
        env("env"),
        {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "depends_on": ["env"]},
        {"id": "p", "type": "prompt_agent", "prompt": "hi", "prompt_id": "q", "depends_on": []},
    ]
    first = load(tmp_path, steps, "a.json")
    stored = {"id": "a", "type": "task", "version": 1, "steps": first.step_documents()}
    second = parse_task_document(stored, source="stored", default_id="zzz", registry=BUILTIN_STEPS)
    assert second.step_documents() == first.step_documents()
    assert second.content_hash == first.content_hash


@pytest.mark.parametrize(
    "document",
    [
        {"steps": [{"id": "a", "type": "deploy_env", "env_id": "e"}]},  # no type: "task"
        {"type": "task"},  # no steps
        {"type": "task", "steps": {"a": 1}},
        {"type": "workflow", "steps": []},
        "a string",
        42,
        None,
    ],
    ids=["no-type", "no-steps", "steps-dict", "wrong-type", "string", "number", "null"],
)
def test_a_document_that_is_not_a_step_list_is_refused(tmp_path, document):
    path, found = problems(tmp_path, json.dumps(document))
    assert NOT_A_STEP_LIST == "JSON file must contain a list of step dicts"
    assert found == [f"{path}: JSON file must contain a list of step dicts"]


def test_invalid_json_names_line_and_column(tmp_path):
    path, found = problems(tmp_path, '[\n  {"id": "a",\n  }\n]')
    assert found == [f"{path}: invalid JSON at line 3 column 3: Expecting property name enclosed in double quotes"]


def test_empty_file_is_invalid_json_at_line_1(tmp_path):
    path, found = problems(tmp_path, "")
    assert found == [f"{path}: invalid JSON at line 1 column 1: Expecting value"]


def test_unreadable_file_is_reported_against_the_file(tmp_path):
    missing = tmp_path / "missing.json"
    with pytest.raises(TaskLoadError) as info:
        load_task_file(missing, BUILTIN_STEPS)
    assert [str(e) for e in info.value.errors] == [f"{missing}: cannot read file: No such file or directory"]


def test_empty_step_list_is_a_valid_empty_task(tmp_path):
    doc = load(tmp_path, [])
    assert doc.steps == ()


def test_a_step_that_is_not_an_object(tmp_path):
    assert only_problem(tmp_path, [1]) == "step at position 0 is not an object: 1"


@pytest.mark.parametrize("bad_id", [None, "", 5])
def test_a_step_needs_a_non_empty_string_id(tmp_path, bad_id):
    step = {"type": "deploy_env", "env_id": "e"}
    if bad_id is not None:
        step["id"] = bad_id
    assert only_problem(tmp_path, [env("a"), step]) == (
        "field 'id': step at position 1 needs a non-empty string 'id'"
    )


# -- depends_on ------------------------------------------------------------------------------


def test_bare_ids_and_object_form_parse_equal_and_store_as_objects(tmp_path):
    bare = load(tmp_path, [env("a"), env("b", "x"), env("c", "y", depends_on=["a", "b"])], "t.json")
    objects = load(tmp_path, [
        env("a"), env("b", "x"),
        env("c", "y", depends_on=[{"task_step_id": "a"}, {"task_step_id": "b"}]),
    ], "t.json")
    mixed = load(tmp_path, [env("a"), env("b", "x"), env("c", "y", depends_on=["a", {"task_step_id": "b"}])], "t.json")
    assert bare.steps[2].depends_on == objects.steps[2].depends_on == mixed.steps[2].depends_on == ["a", "b"]
    stored = bare.steps[2].to_document()
    assert stored["depends_on"] == [{"task_step_id": "a"}, {"task_step_id": "b"}]
    assert bare.step_documents() == objects.step_documents() == mixed.step_documents()
    assert bare.content_hash == objects.content_hash


def test_to_document_is_the_stored_form(tmp_path):
    doc = load(tmp_path, [
        env("a", ttl_seconds=60),
        env("b", "x", depends_on=[], version=4),
        env("c", "y", fail_task_on_error=False, retry_config={"go_to_step_id": "c", "max_retries": 2}),
    ])
    a, b, c = (s.to_document() for s in doc.steps)
    # base fields always; defaults omitted; depends_on only when not null
    assert a == {"id": "a", "type": "deploy_env", "version": None, "fail_task_on_error": True,
                 "env_id": "email", "ttl_seconds": 60}
    assert b == {"id": "b", "type": "deploy_env", "version": 4, "fail_task_on_error": True,
                 "env_id": "x", "depends_on": []}
    # go_to_step_id is an input alias; the stored form says retry_from_step_id
    assert c == {"id": "c", "type": "deploy_env", "version": None, "fail_task_on_error": False,
                 "env_id": "y", "retry_config": {"retry_from_step_id": "c", "max_retries": 2}}


def test_null_and_empty_depends_on_stay_distinct(tmp_path):
    doc = load(tmp_path, [env("a"), env("b", "x", depends_on=None), env("c", "y", depends_on=[])])
    assert [s.depends_on for s in doc.steps] == [None, None, []]
    assert "depends_on" not in doc.steps[1].to_document()


@pytest.mark.parametrize(
    ("value", "shown"),
    [("a", "'a'"), ({"task_step_id": "a"}, "{'task_step_id': 'a'}"), (7, "7")],
)
def test_depends_on_that_is_not_a_list(tmp_path, value, shown):
    assert step_problem(tmp_path, env("x", "y", depends_on=value)) == (
        f"step 'x': field 'depends_on': depends_on is a list of step ids, not {shown}"
    )


@pytest.mark.parametrize(
    ("entry", "shown"),
    [(7, "7"), (None, "None"), ({"id": "a"}, "{'id': 'a'}"), (["a"], "['a']")],
)
def test_a_bad_depends_on_entry(tmp_path, entry, shown):
    assert step_problem(tmp_path, env("x", "y", depends_on=[entry])) == (
        "step 'x': field 'depends_on': "
        f'a depends_on entry is a step id or {{"task_step_id": "<step id>"}}, not {shown}'
    )


def test_an_object_entry_with_a_non_string_id_is_taken_as_is(tmp_path):
    assert step_problem(tmp_path, env("x", "y", depends_on=[{"task_step_id": 7}])) == (
        "step 'x': field 'depends_on': Step 'x' at position 1 declares depends_on '7', "
        "which names no step in this task (steps before it: ['env'])"
    )


def test_duplicate_step_id(tmp_path):
    assert only_problem(tmp_path, [env("a"), env("b", "x"), env("a", "y")]) == (
        "step 'a': Duplicate step id 'a' at position 2; step ids must be unique within a task"
    )


def test_forward_reference(tmp_path):
    assert only_problem(tmp_path, [env("a", depends_on=["b"]), env("b", "x")]) == (
        "step 'a': field 'depends_on': Step 'a' at position 0 declares depends_on 'b', which "
        "doesn't come before it (forward refs are not allowed: a step depends only on the steps before it)"
    )


def test_self_reference(tmp_path):
    assert only_problem(tmp_path, [env("a"), env("b", "x", depends_on=["b"])]) == (
        "step 'b': field 'depends_on': Step 'b' at position 1 declares depends_on 'b', which "
        "doesn't come before it (forward refs are not allowed: a step depends only on the steps before it)"
    )


def test_unknown_id_lists_the_sorted_earlier_ids(tmp_path):
    assert only_problem(tmp_path, [env("zeta"), env("alpha", "x"), env("mid", "y", depends_on=["nope"])]) == (
        "step 'mid': field 'depends_on': Step 'mid' at position 2 declares depends_on 'nope', "
        "which names no step in this task (steps before it: ['alpha', 'zeta'])"
    )


def test_unknown_id_on_the_first_step(tmp_path):
    assert only_problem(tmp_path, [env("a", depends_on=["nope"])]) == (
        "step 'a': field 'depends_on': Step 'a' at position 0 declares depends_on 'nope', "
        "which names no step in this task (steps before it: [])"
    )


def test_every_dag_problem_of_a_file_is_reported(tmp_path):
    path, found = problems(tmp_path, [
        env("a", depends_on=["b"]), env("b", "x"), env("b", "y", depends_on=["b", "zz", "a"]),
    ])
    forward = (
        "which doesn't come before it (forward refs are not allowed: "
        "a step depends only on the steps before it)"
    )
    assert found == [
        f"{path}: step 'a': field 'depends_on': Step 'a' at position 0 declares depends_on 'b', {forward}",
        f"{path}: step 'b': Duplicate step id 'b' at position 2; step ids must be unique within a task",
        f"{path}: step 'b': field 'depends_on': Step 'b' at position 2 declares depends_on 'zz', "
        "which names no step in this task (steps before it: ['a', 'b'])",
    ]


# -- step types and fields -------------------------------------------------------------------


def test_unknown_step_type(tmp_path):
    assert step_problem(tmp_path, {"id": "x", "type": "deploy_envv"}) == (
        "step 'x': field 'type': Unknown task step type: deploy_envv"
    )


def test_missing_step_type(tmp_path):
    assert step_problem(tmp_path, {"id": "x"}) == "step 'x': field 'type': required field is missing"


def test_misspelled_field_suggests_the_right_one(tmp_path):
    assert step_problem(tmp_path, {"id": "x", "type": "prompt_agent", "prompt": "hi", "agent_nme": "a"}) == (
        "step 'x': field 'agent_nme': unknown field (did you mean 'agent_name'?)"
    )


def test_unknown_field_without_a_close_match(tmp_path):
    assert step_problem(tmp_path, env("x", "y", zzzzqq=1)) == "step 'x': field 'zzzzqq': unknown field"


def test_misspelled_nested_field_suggests_from_the_nested_model(tmp_path):
    retry = {"retry_from_step_id": "x", "max_retry": 1}
    assert step_problem(tmp_path, {"id": "x", "type": "prompt_agent", "prompt": "hi", "retry_config": retry}) == (
        "step 'x': field 'retry_config.max_retry': unknown field (did you mean 'max_retries'?)"
    )
    artifacts = [{"id": "a", "verison": 1}]
    assert step_problem(tmp_path, {"id": "x", "type": "load_artifact", "env_id": "e", "artifacts": artifacts}) == (
        "step 'x': field 'artifacts.0.verison': unknown field (did you mean 'version'?)"
    )


def test_wrong_field_type(tmp_path):
    assert step_problem(tmp_path, env("x", "y", ttl_seconds="abc")) == (
        "step 'x': field 'ttl_seconds': Input should be a valid integer, "
        "unable to parse string as an integer (got 'abc')"
    )


def test_value_outside_a_literal(tmp_path):
    assert step_problem(tmp_path, env("x", "y", gateway_mode="fast")) == (
        "step 'x': field 'gateway_mode': Input should be 'performance' or 'consistent' (got 'fast')"
    )


def test_missing_required_field(tmp_path):
    assert step_problem(tmp_path, {"id": "x", "type": "deploy_env"}) == (
        "step 'x': field 'env_id': required field is missing"
    )


def test_several_problems_of_one_step_are_joined(tmp_path):
    assert step_problem(tmp_path, {"id": "x", "type": "deploy_env", "env_idd": "e", "ttl_seconds": "z"}) == (
        "step 'x': field 'env_id': required field is missing; "
        "field 'ttl_seconds': Input should be a valid integer, unable to parse string as an integer (got 'z'); "
        "field 'env_idd': unknown field (did you mean 'env_id'?)"
    )


def test_several_problems_in_one_file_are_all_reported(tmp_path):
    path, found = problems(tmp_path, [
        env("a", bad=1),
        {"id": "b", "type": "nope"},
        {"id": "c", "type": "deploy_env"},
        env("ok"),
        {"id": "t", "type": "teardown_sandboxes"},
    ])
    assert found == [
        f"{path}: step 'a': field 'bad': unknown field",
        f"{path}: step 'b': field 'type': Unknown task step type: nope",
        f"{path}: step 'c': field 'env_id': required field is missing",
        f"{path}: step 't': teardown_sandboxes needs at least one of agent_names, env_ids, sandbox_names",
    ]


def test_load_errors_are_spec_errors_with_their_location(tmp_path):
    path = write(tmp_path, [env("a"), {"id": "x", "type": "deploy_env"}])
    with pytest.raises(TaskLoadError) as info:
        load_task_file(path, BUILTIN_STEPS)
    (error,) = info.value.errors
    assert isinstance(error, SpecError)
    assert (error.file, error.step_id, error.field, error.message) == (
        str(path), "x", "env_id", "required field is missing",
    )


# -- every step-model validator --------------------------------------------------------------

LOAD_ARTIFACT_CASES = [
    ({"artifacts": [{"id": "a"}], "artifact_id": "b", "env_id": "email"},
     "Pass either `artifacts=[...]` or `artifact_id=...`, not both"),
    ({"collected_artifacts_step_id": "c", "artifact_id": "b", "env_id": "email"},
     "`collected_artifacts_step_id` is mutually exclusive with `artifacts`/`artifact_id`/`urls`"),
    ({"artifact_from_step_id": "c", "urls": ["http://x/a"], "agent_name": "a"},
     "`artifact_from_step_id` is mutually exclusive with "
     "`artifacts`/`artifact_id`/`urls`/`collected_artifacts_step_id`"),
    ({"artifact_from_step_id": "c", "collected_artifacts_step_id": "d", "env_id": "email"},
     "`artifact_from_step_id` is mutually exclusive with "
     "`artifacts`/`artifact_id`/`urls`/`collected_artifacts_step_id`"),
    ({"env_id": "email"},
     "Must pass at least one of `artifacts=[...]`, `artifact_id=...`, `urls=[...]`, "
     "`artifact_from_step_id=...`, or `collected_artifacts_step_id=...`"),
    ({"artifact_id": "a", "agent_name": "a", "container_name": "c", "sandbox_name": "s"},
     "Pass either `agent_name` or `container_name`, not both"),
    ({"artifact_id": "a"},
     "Must pass at least one of `env_id`, `agent_name`, `sandbox_name`, or `container_name`+`sandbox_name`"),
    ({"artifact_id": "a", "env_id": "email", "container_name": "c"},
     "`container_name` requires `sandbox_name`"),
    ({"urls": ["http://x/a"], "env_id": "email"},
     "`urls` requires `agent_name`, `sandbox_name`, or `container_name`+`sandbox_name`"),
]


@pytest.mark.parametrize(("fields", "message"), LOAD_ARTIFACT_CASES)
def test_load_artifact_validation(tmp_path, fields, message):
    assert step_problem(tmp_path, {"id": "x", "type": "load_artifact", **fields}) == f"step 'x': {message}"


@pytest.mark.parametrize(
    "fields",
    [
        {"artifact_id": "a", "env_id": "email"},
        {"artifacts": [{"id": "a", "version": 2}], "agent_name": "a"},
        {"urls": ["http://x/a", {"url": "http://x/b", "filename": "b"}], "sandbox_name": "s"},
        {"artifact_from_step_id": "c", "container_name": "c", "sandbox_name": "s"},
        {"collected_artifacts_step_id": "c", "agent_name": "a"},
    ],
)
def test_load_artifact_valid_combinations(fields):
    cls = BUILTIN_STEPS.get("load_artifact")
    step = cls.model_validate({"id": "x", "type": "load_artifact", **fields})
    assert step.id == "x"


PROMPT_AGENT_CASES = [
    ({}, "step 'x': PromptAgentTaskStep requires either `prompt` or `parts`"),
    ({"prompt": "hi", "parts": [{"kind": "text", "text": "hi"}]},
     "step 'x': PromptAgentTaskStep accepts `prompt` OR `parts`, not both"),
    ({"prompt": "hi", "max_conversation_turns": 0}, "step 'x': max_conversation_turns must be >= 1"),
    ({"prompt": "hi", "max_conversation_turns": -3}, "step 'x': max_conversation_turns must be >= 1"),
    ({"prompt": "hi", "model_params": {"temperature": 0, "api_key": "k", "model": "m"}},
     "step 'x': model_params may not set reserved keys: ['api_key', 'model']"),
    # pydantic's list[dict] check answers before the step's own "parts[i] must be a dict"
    ({"parts": [{"kind": "text", "text": "a"}, 1]},
     "step 'x': field 'parts.1': Input should be a valid dictionary (got 1)"),
]


@pytest.mark.parametrize(("fields", "message"), PROMPT_AGENT_CASES)
def test_prompt_agent_validation(tmp_path, fields, message):
    assert step_problem(tmp_path, {"id": "x", "type": "prompt_agent", **fields}) == message


def test_prompt_agent_parts_alone_is_valid(tmp_path):
    doc = load(tmp_path, [{"id": "x", "type": "prompt_agent", "parts": [{"kind": "text", "text": "a"}]}])
    assert doc.steps[0].prompt_text() == "a"


UNIQUE_IDS = "step 'x': field 'criteria': rubric criteria must have unique, non-empty string ids"


@pytest.mark.parametrize(
    "criteria",
    [
        [{"id": "a", "criterion": "c"}, {"id": "a", "criterion": "d"}],
        [{"id": "", "criterion": "c"}],
        [{"id": 3, "criterion": "c"}],
        [{"criterion": "no id"}],
    ],
    ids=["duplicate", "empty", "not-a-string", "missing"],
)
def test_rubrics_criteria_need_unique_string_ids(tmp_path, criteria):
    step = {"id": "x", "type": "rubrics_verifier", "prompt_id": "p", "criteria": criteria}
    assert step_problem(tmp_path, step) == UNIQUE_IDS


def test_rubrics_default_model_api_base_needs_a_direct_judge(tmp_path):
    step = {"id": "x", "type": "rubrics_verifier", "prompt_id": "p", "criteria": [{"id": "a"}],
            "default_model_api_base": "http://127.0.0.1:1"}
    assert step_problem(tmp_path, step) == (
        "step 'x': default_model_api_base is only allowed with use_agent_judge=false"
    )
    cls = BUILTIN_STEPS.get("rubrics_verifier")
    ok = cls.model_validate({**step, "use_agent_judge": False})
    assert ok.default_model_api_base == "http://127.0.0.1:1"


def test_rubrics_score_aggregator_is_one_of_three(tmp_path):
    step = {"id": "x", "type": "rubrics_verifier", "prompt_id": "p", "criteria": [{"id": "a"}],
            "score_aggregator": "median"}
    assert step_problem(tmp_path, step) == (
        "step 'x': field 'score_aggregator': Input should be 'all_pass', 'any_pass' or "
        "'weighted_average' (got 'median')"
    )


def test_teardown_needs_a_target(tmp_path):
    assert step_problem(tmp_path, {"id": "x", "type": "teardown_sandboxes", "env_ids": []}) == (
        "step 'x': teardown_sandboxes needs at least one of agent_names, env_ids, sandbox_names"
    )


def test_teardown_must_stay_best_effort(tmp_path):
    step = {"id": "x", "type": "teardown_sandboxes", "env_ids": ["email"], "fail_task_on_error": True}
    assert step_problem(tmp_path, step) == (
        "step 'x': teardown_sandboxes is best-effort (a failed terminate is logged, never raised); "
        "fail_task_on_error must be false"
    )


def test_teardown_defaults_to_tolerated(tmp_path):
    doc = load(tmp_path, [env("env"), {"id": "x", "type": "teardown_sandboxes", "env_ids": ["email"]}])
    assert doc.steps[1].fail_task_on_error is False
    assert doc.steps[1].to_document()["fail_task_on_error"] is False


RETRY_CASES = [
    ({}, "retry_config requires 'retry_from_step_id' (or 'go_to_step_id')"),
    ({"retry_from_step_id": ""}, "retry_config requires 'retry_from_step_id' (or 'go_to_step_id')"),
    ({"max_retries": 2}, "retry_config requires 'retry_from_step_id' (or 'go_to_step_id')"),
    ({"retry_from_step_id": "x", "max_retries": True}, "retry_config.max_retries must be an int, got True"),
    ({"retry_from_step_id": "x", "max_retries": "2"}, "retry_config.max_retries must be an int, got '2'"),
    ({"go_to_step_id": "x", "max_retries": 1.5}, "retry_config.max_retries must be an int, got 1.5"),
    ({"retry_from_step_id": "x", "max_retries": -1}, "retry_config.max_retries must be >= 0, got -1"),
]


@pytest.mark.parametrize(("retry", "message"), RETRY_CASES)
def test_retry_config_validation(tmp_path, retry, message):
    assert step_problem(tmp_path, env("x", "y", retry_config=retry)) == (
        f"step 'x': field 'retry_config': {message}"
    )


def test_retry_config_alias_and_default(tmp_path):
    doc = load(tmp_path, [env("a"), env("b", "x", retry_config={"go_to_step_id": "a"})])
    retry = doc.steps[1].retry_config
    assert (retry.retry_from_step_id, retry.max_retries) == ("a", 1)
    assert doc.steps[1].to_document()["retry_config"] == {"retry_from_step_id": "a"}


def test_retry_from_must_be_the_step_or_an_ancestor(tmp_path):
    # null depends_on = every earlier step; self is allowed; a transitive ancestor is allowed
    load(tmp_path, [env("a"), env("b", "x", retry_config={"retry_from_step_id": "a"})])
    load(tmp_path, [env("a"), env("b", "x", depends_on=[], retry_config={"retry_from_step_id": "b"})])
    load(tmp_path, [env("a"), env("b", "x", depends_on=["a"]),
                    env("c", "y", depends_on=["b"], retry_config={"retry_from_step_id": "a"})])
    sibling = [env("a"), env("b", "x", depends_on=["a"]),
               env("c", "y", depends_on=["a"], retry_config={"retry_from_step_id": "b"})]
    assert only_problem(tmp_path, sibling) == (
        "step 'c': field 'retry_config': Step 'c' at position 2 declares retry_config.retry_from_step_id "
        "'b' which is not in the step's dependency ancestry (ancestor ids: ['a'])"
    )
    unknown = [env("a"), env("b", "x", retry_config={"retry_from_step_id": "zzz"})]
    assert only_problem(tmp_path, unknown) == (
        "step 'b': field 'retry_config': Step 'b' at position 1 declares retry_config.retry_from_step_id "
        "'zzz' which is not in the step's dependency ancestry (ancestor ids: ['a'])"
    )


RESPONSE_VERIFIER_CASES = [
    ([{"type": "response_contains"}], "field 'criteria': response_contains needs non-empty `needles`"),
    ([{"type": "response_contains", "needles": []}], "field 'criteria': response_contains needs non-empty `needles`"),
    ([{"type": "response_regex_present"}], "field 'criteria': response_regex_present needs a non-empty `pattern`"),
    ([{"type": "response_regex_present", "pattern": "a", "flags": ["IGNORECASE", "NOPE"]}],
     "field 'criteria': unknown regex flag 'NOPE'"),
    ([{"type": "response_word_count"}],
     "field 'criteria.0.type': Input should be 'response_contains' or 'response_regex_present' "
     "(got 'response_word_count')"),
]


@pytest.mark.parametrize(("criteria", "message"), RESPONSE_VERIFIER_CASES)
def test_agent_prompt_response_verifier_validation(tmp_path, criteria, message):
    step = {"id": "x", "type": "agent_prompt_response_verifier", "prompt_id": "p", "criteria": criteria}
    assert step_problem(tmp_path, step) == f"step 'x': {message}"


def test_agent_prompt_response_verifier_valid_criteria():
    cls = BUILTIN_STEPS.get("agent_prompt_response_verifier")
    step = cls.model_validate({
        "id": "x", "type": "agent_prompt_response_verifier", "prompt_id": "p",
        "criteria": [
            {"type": "response_contains", "needles": ["a"]},
            {"type": "response_regex_present", "pattern": "b+", "flags": ["IGNORECASE", "MULTILINE"]},
        ],
    })
    assert [c.type for c in step.criteria] == ["response_contains", "response_regex_present"]


def test_validation_errors_escape_through_pytest_raises(tmp_path):
    path = write(tmp_path, [{"id": "x", "type": "prompt_agent"}])
    with pytest.raises(TaskLoadError, match=re.escape(
        f"{path}: step 'x': PromptAgentTaskStep requires either `prompt` or `parts`"
    )):
        load_task_file(path, BUILTIN_STEPS)


# -- hostile documents (docs/input-limits.md) ------------------------------------------------


def test_a_lone_surrogate_in_a_prompt_is_refused_at_its_step(tmp_path):
    text = '[{"id": "ask", "type": "prompt_agent", "prompt": "Sort \\ud800 the inbox", "depends_on": []}]'
    assert only_problem(tmp_path, text) == (
        "step 'ask': field 'prompt': text holds a lone surrogate ('\\ud800' at character 6): not valid Unicode")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_non_finite_rubric_weight_is_refused_at_load(tmp_path, literal):
    text = ('[{"id": "judge", "type": "rubrics_verifier", "prompt_id": "p", "depends_on": [], '
            f'"criteria": [{{"id": "c", "weight": {literal}}}]}}]')
    shown = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf", "1e400": "inf"}[literal]
    assert only_problem(tmp_path, text) == (
        f"step 'judge': field 'criteria.0.weight': {shown} is not a finite number (NaN and infinity are refused)")


@pytest.mark.parametrize("weight", ["nan", "-inf", "heavy", True])
def test_a_rubric_weight_must_be_a_finite_number(tmp_path, weight):
    step = {"id": "x", "type": "rubrics_verifier", "prompt_id": "p", "criteria": [{"id": "c", "weight": weight}]}
    assert step_problem(tmp_path, step) == (
        f"step 'x': field 'criteria': rubric criterion 'c': weight must be a finite number, got {weight!r}")


def test_non_finite_text_is_refused_by_a_float_field(tmp_path):
    step = {"id": "ask", "type": "prompt_agent", "prompt": "hi", "timeout_seconds": "nan"}
    assert step_problem(tmp_path, step) == "step 'ask': field 'timeout_seconds': Input should be a finite number (got 'nan')"


def test_a_non_finite_seed_value_is_refused(tmp_path):
    assert only_problem(tmp_path, '{"id": "t", "type": "task", "steps": [], "seed": {"limit": NaN}}') == (
        "field 'seed.limit': nan is not a finite number (NaN and infinity are refused)")


def test_a_huge_wrong_typed_value_is_quoted_as_a_short_excerpt(tmp_path):
    huge = "x" * 5_000_000
    message = step_problem(tmp_path, {"id": "env2", "type": "deploy_env", "env_id": [huge]})
    assert message.startswith("step 'env2': field 'env_id': Input should be a valid string (got ['xxx")
    assert len(message) < 400


@pytest.mark.parametrize(("data", "expected"), [
    (b'[{"id": "a", "type": "deploy_env"}]\n\x00\x00\xff\xfe', "binary data, not a text document (a NUL byte at line 2 column 1)"),
    ('[{"id": "caf\u00e9", "type": "deploy_env"}]'.encode("latin-1"),
     "not UTF-8 text: byte 0xe9 at line 1 column 13 (save the file as UTF-8)"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON: nested deeper than 100 levels"),
], ids=["binary", "latin-1", "nested"])
def test_unreadable_text_is_one_clean_problem(tmp_path, data, expected):
    path = tmp_path / "task.json"
    path.write_bytes(data)
    with pytest.raises(TaskLoadError) as info:
        load_task_file(path, BUILTIN_STEPS)
    assert [str(e) for e in info.value.errors] == [f"{path}: {expected}"]


def test_a_file_reports_at_most_a_hundred_problems(tmp_path):
    path, found = problems(tmp_path, [{"id": f"s{i}", "type": "nope"} for i in range(5_000)])
    assert len(found) == 101
    assert found[-1] == f"{path}: ... and 4900 more problems"


# -- the versioned store ---------------------------------------------------------------------


@pytest.fixture
def store(tmp_path) -> TaskStore:
    return TaskStore(tmp_path / "store")


def _doc(tmp_path: Path, steps: list[dict[str, Any]]) -> TaskDocument:
    return load(tmp_path, steps, "src.json")


def test_store_put_adds_versions_and_never_overwrites(tmp_path, store):
    v1 = _doc(tmp_path, [env("a")])
    v2 = _doc(tmp_path, [env("a"), env("b", "x", depends_on=["a"])])
    assert store.versions("t") == []
    assert store.put("t", v1) == 1
    first_file = (store.root / "t" / "1.json").read_text()
    assert store.put("t", v2) == 2
    assert store.put("t", v1) == 3  # same content again: still a new version
    assert store.versions("t") == [1, 2, 3]
    assert (store.root / "t" / "1.json").read_text() == first_file
    stored = json.loads(first_file)
    assert stored == {"id": "t", "type": "task", "version": 1, "steps": v1.step_documents()}


def test_store_get_latest_and_a_version(tmp_path, store):
    store.put("t", _doc(tmp_path, [env("a")]))
    store.put("t", _doc(tmp_path, [env("a"), env("b", "x", depends_on=["a"])]))
    latest = store.get("t", None, BUILTIN_STEPS)
    assert (latest.task_id, latest.version, [s.id for s in latest.steps]) == ("t", 2, ["a", "b"])
    assert latest.steps[1].depends_on == ["a"]
    assert latest.source == str(store.root / "t" / "2.json")
    first = store.get("t", 1, BUILTIN_STEPS)
    assert (first.version, [s.id for s in first.steps]) == (1, ["a"])


def test_store_task_ids_are_independent(tmp_path, store):
    store.put("t", _doc(tmp_path, [env("a")]))
    assert store.put("u", _doc(tmp_path, [env("a")])) == 1
    assert store.versions("t") == [1]


def test_store_unknown_task(store):
    with pytest.raises(LookupError, match=re.escape("Task 'nope' not found")):
        store.get("nope", None, BUILTIN_STEPS)


def test_store_unknown_version(tmp_path, store):
    store.put("t", _doc(tmp_path, [env("a")]))
    store.put("t", _doc(tmp_path, [env("a")]))
    with pytest.raises(LookupError) as info:
        store.get("t", 5, BUILTIN_STEPS)
    assert str(info.value) == "Task 't' has no version 5 (versions: [1, 2])"
