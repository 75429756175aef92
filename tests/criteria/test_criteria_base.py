"""The criterion contract: registry, shared fields, result rows, scoring, fault handling, paths."""

from __future__ import annotations

import asyncio
import os
import re
import threading

import pytest
import yaml
from criteria_helpers import bash, context, grade, write
from projects import NO_CORPUS, upstream_corpus
from pydantic import ValidationError

from agentenv_dagster.criteria import (
    CRITERION_TYPES,
    CheckerMisuseError,
    Criterion,
    CriterionContext,
    CriterionResult,
    evaluate_all,
    parse_criterion,
    task_passed,
    weighted_score,
)

ALL_TYPES = [
    "agent_judge", "classification_match", "cli_called", "command_executed", "commands_efficiency", "file_check",
    "file_contains", "file_exists", "file_matches_regex", "import_check", "json_check", "llm_judge", "pytest",
    "reference_comparison", "run_command", "skill_triggered", "uipath_eval",
]


def test_registry_holds_every_type():
    assert sorted(CRITERION_TYPES) == ALL_TYPES


def test_unknown_type_names_the_known_ones():
    with pytest.raises(ValueError, match=re.escape(f"unknown criterion type 'nope' (known: {ALL_TYPES})")):
        parse_criterion({"type": "nope", "description": "d"})
    with pytest.raises(ValueError, match="unknown criterion type 'None'"):
        parse_criterion({"description": "d"})


def test_a_misspelled_type_suggests_the_close_one():
    with pytest.raises(ValueError) as info:
        parse_criterion({"type": "file_exist", "description": "d", "path": "a.py"})
    assert str(info.value) == (
        f"field 'type': unknown criterion type 'file_exist' (known: {ALL_TYPES}); did you mean 'file_exists'?")


def test_requires_agent_marks_trajectory_criteria():
    needing = sorted(name for name, cls in CRITERION_TYPES.items() if cls.requires_agent)
    assert needing == ["command_executed", "commands_efficiency", "reference_comparison", "skill_triggered"]


def test_common_field_defaults():
    model = parse_criterion({"type": "file_exists", "path": "a", "description": "d"})
    assert (model.weight, model.pass_threshold, model.suite_thresholds) == (1.0, 0.9, None)
    judge = parse_criterion({"type": "llm_judge", "prompt": "p", "description": "d"})
    assert judge.pass_threshold == 0.7


@pytest.mark.parametrize("fields, message", [
    ({}, "description\n  Field required"),
    ({"description": "d", "weight": -1}, "greater than or equal to 0"),
    ({"description": "d", "weight": float("inf")}, "finite number"),
    ({"description": "d", "weight": float("nan")}, "finite number"),
    ({"description": "d", "pass_threshold": 1.5}, "less than or equal to 1"),
    ({"description": "d", "pass_threshold": -0.1}, "greater than or equal to 0"),
    ({"description": "d", "pathh": "x"}, "pathh\n  Extra inputs are not permitted"),
    ({"description": "d", "stop_early": {}}, "stop_early\n  Extra inputs are not permitted"),
    ({"description": "d", "weight": 0, "suite_thresholds": {"mean": 1}},
     "weight 0 is informational and may not set suite_thresholds"),
])
def test_common_field_validation(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        parse_criterion({"type": "file_exists", "path": "a", **fields})


def test_stop_early_only_on_live_criteria_and_never_informational():
    armed = parse_criterion({"type": "command_executed", "description": "d", "stop_early": {}})
    assert (armed.stop_early.on_pass, armed.stop_early.decide_within) == ("continue", None)
    with pytest.raises(ValidationError, match="weight 0 is informational and may not set stop_early"):
        parse_criterion({"type": "skill_triggered", "description": "d", "skill_name": "a", "expected_skill": "a",
                         "weight": 0, "stop_early": {"on_pass": "stop"}})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        parse_criterion({"type": "command_executed", "description": "d", "stop_early": {"decide_within": 0}})
    with pytest.raises(ValidationError, match="Input should be 'continue' or 'stop'"):
        parse_criterion({"type": "command_executed", "description": "d", "stop_early": {"on_pass": "halt"}})


def test_a_model_checks_its_own_type():
    cls = CRITERION_TYPES["file_exists"]
    assert cls(path="a", description="d").type == "file_exists"
    with pytest.raises(ValidationError, match="type must be 'file_exists', got 'file_check'"):
        cls(type="file_check", path="a", description="d")


class _Raising(Criterion):
    type_name = "raising"
    fault: str

    async def check(self, ctx):
        if self.fault == "misuse":
            raise CheckerMisuseError("the task is wrong")
        raise RuntimeError("boom")


def test_a_checker_fault_scores_zero_with_its_type_and_message(tmp_path):
    result = grade(_Raising(description="d", fault="runtime"), context(tmp_path, []))
    assert (result.score, result.error) == (0.0, "RuntimeError: boom")


def test_a_real_checker_fault_is_scored(tmp_path):
    (tmp_path / "adir").mkdir()
    result = grade({"type": "file_contains", "path": "adir", "includes": ["x"]}, context(tmp_path, []))
    assert result.score == 0.0 and result.error.startswith("IsADirectoryError: ")


class _StuckOnTheLoop(Criterion):
    """A check that never ends: it awaits what never comes."""

    type_name = "stuck_on_the_loop"

    async def check(self, ctx):
        await asyncio.Event().wait()


class _StuckOnItsThread(Criterion):
    """A blocking check that cannot end until the test lets it, as a stuck file read."""

    type_name = "stuck_on_its_thread"
    blocking = True

    async def check(self, ctx):
        RELEASE.wait()
        return self.result(1.0)


RELEASE = threading.Event()


@pytest.mark.parametrize("stuck", [_StuckOnTheLoop, _StuckOnItsThread])
def test_a_check_that_overruns_the_time_limit_scores_zero(tmp_path, stuck):
    RELEASE.clear()
    try:
        result = grade(stuck(description="d"), context(tmp_path, [], time_limit=0.2))
    finally:
        RELEASE.set()
    assert (result.score, result.details, result.error) == (
        0.0, "Check timed out", "the check did not finish within the task's time limit (0.2 s)")


def test_the_later_criteria_share_what_is_left_of_the_limit(tmp_path):
    write(tmp_path, {"a.txt": "x"})
    ctx = context(tmp_path, [], time_limit=30, started=0.0)  # started long ago: no time is left
    result = grade({"type": "file_exists", "path": "a.txt"}, ctx)
    assert (result.score, result.error) == (0.0, "the check did not finish within the task's time limit (30 s)")


def test_a_checker_s_own_timeout_is_a_fault_not_the_deadline(tmp_path):
    class _TimesOut(Criterion):
        type_name = "times_out"

        async def check(self, ctx):
            raise TimeoutError("the judge took too long")

    result = grade(_TimesOut(description="d"), context(tmp_path, [], time_limit=60))
    assert (result.details, result.error) == ("Check failed", "TimeoutError: the judge took too long")


def test_checker_misuse_propagates(tmp_path):
    with pytest.raises(CheckerMisuseError, match="the task is wrong"):
        grade(_Raising(description="d", fault="misuse"), context(tmp_path, []))


def test_result_rows_follow_the_report_schema(tmp_path):
    write(tmp_path, {"a.txt": "positive"})
    ctx = context(tmp_path, [])
    basic = grade({"type": "file_exists", "path": "a.txt", "weight": 0}, ctx).to_dict()
    assert basic == {
        "criterion_type": "file_exists", "description": "under test", "score": 1.0, "details": "File 'a.txt' exists",
        "error": None, "evaluation_status": "evaluated", "pass_threshold": 0.9, "gating": False, "result_kind": "basic",
    }
    labelled = grade({"type": "classification_match", "path": "a.txt", "expected_label": "positive",
                      "allowed_labels": ["positive", "negative"]}, ctx).to_dict()
    assert (labelled["result_kind"], labelled["observed_label"], labelled["expected_label"], labelled["gating"]) == (
        "classification", "positive", "positive", True)
    judged = grade({"type": "llm_judge", "prompt": "p"}, ctx).to_dict()
    judge_keys = ("score", "evaluation_status", "result_kind", "findings", "token_usage", "transcript_path")
    assert {k: judged[k] for k in judge_keys} == {
        "score": None, "evaluation_status": "not_evaluated", "result_kind": "judge", "findings": [],
        "token_usage": None, "transcript_path": None}


def _r(score, weight=1.0, threshold=0.9):
    return CriterionResult("t", "d", score, weight=weight, pass_threshold=threshold)


def test_weighted_score_counts_gating_graded_criteria_only():
    assert weighted_score([_r(1.0, 3), _r(0.5, 1), _r(0.0, 0), _r(None, 2)]) == pytest.approx(0.875)
    assert weighted_score([_r(0.2, 0), _r(None, 1)]) is None
    assert weighted_score([]) is None


def test_task_passes_only_when_every_gating_criterion_meets_its_threshold():
    assert task_passed([_r(0.9), _r(0.7, 2, threshold=0.7), _r(0.0, 0)]) is True
    assert task_passed([_r(1.0, 10), _r(0.89)]) is False
    assert task_passed([_r(1.0), _r(None)]) is None
    assert task_passed([_r(0.0), _r(None, 0)]) is False
    assert task_passed([_r(0.0, 0)]) is True


def test_evaluate_all_runs_in_task_order_in_one_sandbox(tmp_path):
    criteria = [parse_criterion(c) for c in [
        {"type": "run_command", "description": "make", "command": "echo hi > made.txt"},
        {"type": "file_contains", "description": "made", "path": "made.txt", "includes": ["hi"]},
        {"type": "command_executed", "description": "ran", "command_pattern": "echo"},
    ]]
    results = __import__("asyncio").run(evaluate_all(criteria, context(tmp_path, [bash("echo hi")])))
    assert [(r.criterion_type, r.score) for r in results] == [
        ("run_command", 1.0), ("file_contains", 1.0), ("command_executed", 1.0)]


@pytest.mark.parametrize("path, message", [
    ("/etc/passwd", "path '/etc/passwd' is absolute; criterion paths are relative to the sandbox"),
    ("C:\\x.txt", "is absolute"),
    ("../outside.txt", "path '../outside.txt' escapes the sandbox"),
    ("a/../../b", "escapes the sandbox"),
    ("", "path must not be empty"),
])
def test_paths_must_stay_in_the_sandbox(path, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        parse_criterion({"type": "file_contains", "description": "d", "path": path, "includes": []})


def test_relative_paths_that_stay_inside_and_row_placeholders_load():
    for path in ("a/../b.txt", "./b.txt", "${row.expected_path}"):
        parse_criterion({"type": "file_exists", "description": "d", "path": path})


def test_globs_match_at_least_one_for_existence_and_exactly_one_elsewhere(tmp_path):
    write(tmp_path, {"src/a.py": "import os", "src/b.py": "x", "lib/deep/c.py": "x = 1"})
    ctx = context(tmp_path, [])
    exists = grade({"type": "file_exists", "path": "src/*.py"}, ctx)
    assert (exists.score, exists.details) == (1.0, "File 'src/*.py' exists (src/a.py, src/b.py)")
    assert grade({"type": "file_exists", "path": "*.md"}, ctx).score == 0.0
    ambiguous = grade({"type": "file_contains", "path": "src/*.py", "includes": ["x"]}, ctx)
    assert ambiguous.score == 0.0
    assert ambiguous.error == "AmbiguousPathError: 'src/*.py' matches 2 paths, expected exactly one: src/a.py, src/b.py"
    single = grade({"type": "file_contains", "path": "lib/**/*.py", "includes": ["x = 1"]}, ctx)
    assert single.score == 1.0
    assert single.details == "File 'lib/**/*.py' (resolved: lib/deep/c.py); Includes: 1/1 found; Score: 1.00"


def test_a_symlink_out_of_the_sandbox_fails_the_criterion(tmp_path):
    sandbox, outside = tmp_path / "sandbox", tmp_path / "secret.txt"
    sandbox.mkdir()
    outside.write_text("secret")
    os.symlink(outside, sandbox / "link.txt")
    result = grade({"type": "file_contains", "path": "link.txt", "includes": ["secret"]}, context(sandbox, []))
    assert (result.score, result.error) == (0.0, "SandboxEscapeError: 'link.txt' resolves outside the sandbox")


def test_context_defaults():
    ctx = CriterionContext(sandbox_dir=".", task_dir=".", reference_dir=None, tool_calls=[], final_text="")
    assert (ctx.expected_commands, ctx.row, ctx.env, ctx.offered_skills) == (None, None, {}, None)


def _corpus_criteria():
    corpus = upstream_corpus()
    for path in sorted((corpus / "coder_eval").rglob("*.yaml")) if corpus else []:
        document = yaml.safe_load(path.read_text())
        if not isinstance(document, dict):
            continue
        for index, data in enumerate(document.get("success_criteria") or []):
            yield pytest.param(data, id=f"corpus/{path.relative_to(corpus)}#{index}")


CORPUS = list(_corpus_criteria())
# Written for an older schema (``expected:`` instead of ``skill_name``/``expected_skill``); upstream rejects it too.
STALE = {"corpus/coder_eval/tasks/uipath_flow/triggering/triggering.yaml#0"}


@pytest.mark.parametrize("data", CORPUS or [pytest.param(None, marks=pytest.mark.skip(reason=NO_CORPUS))])
def test_every_corpus_criterion_loads(request, data):
    if request.node.callspec.id in STALE:
        with pytest.raises(ValidationError, match="expected\n  Extra inputs are not permitted"):
            parse_criterion(data)
    else:
        assert parse_criterion(data).type == data["type"]
