"""classification_match and skill_triggered: labels, canonicalization, engagement rules, live verdicts."""

from __future__ import annotations

import itertools

import pytest
from criteria_helpers import bash, call, context, grade, write

from agentenv_dagster.criteria import CheckerMisuseError, parse_criterion

LABELS = ["positive", "negative"]


def classify(tmp_path, content, expected="positive", **fields):
    if content is not None:
        write(tmp_path, {"result.txt": content})
    return grade({"type": "classification_match", "path": "result.txt", "expected_label": expected,
                  "allowed_labels": LABELS, **fields}, context(tmp_path, []))


def labels(result):
    return result.score, result.observed_label, result.expected_label


@pytest.mark.parametrize("content, expected, fields, outcome", [
    ("positive\n", "positive", {}, (1.0, "positive", "positive")),
    ("  POSITIVE ", "positive", {}, (1.0, "positive", "positive")),
    ("positive", "Positive", {}, (1.0, "positive", "positive")),
    ("POSITIVE", "positive", {"case_sensitive": True}, (0.0, "(other)", "positive")),
    ("negative", "positive", {}, (0.0, "negative", "positive")),
    ("neutral", "positive", {}, (0.0, "(other)", "positive")),
    (None, "positive", {}, (0.0, "(none)", "positive")),
    (" \n\t", "positive", {}, (0.0, "(none)", "positive")),
])
def test_classification_match(tmp_path, content, expected, fields, outcome):
    result = classify(tmp_path, content, expected, **fields)
    assert labels(result) == outcome
    assert result.result_kind == "classification"
    assert result.details == f"observed={outcome[1]!r}, expected={outcome[2]!r} (file 'result.txt')"


def test_classification_match_needs_allowed_labels():
    with pytest.raises(Exception, match="at least 1 item"):
        parse_criterion({"type": "classification_match", "description": "d", "path": "r", "expected_label": "a",
                         "allowed_labels": []})


def skill(calls, skill_name="uipath-agents", expected_skill="uipath-agents", tmp_path=".", **ctx_fields):
    return grade({"type": "skill_triggered", "skill_name": skill_name, "expected_skill": expected_skill},
                 context(tmp_path, calls, **ctx_fields))


def test_confusion_cells(tmp_path):
    engaged = [call("Skill", skill="uipath-agents")]
    assert labels(skill(engaged, tmp_path=tmp_path)) == (1.0, "yes", "yes")  # true positive
    assert labels(skill([], tmp_path=tmp_path)) == (0.0, "no", "yes")  # false negative
    assert labels(skill(engaged, expected_skill="", tmp_path=tmp_path)) == (0.0, "yes", "no")  # false positive
    assert labels(skill([bash("ls")], expected_skill="other", tmp_path=tmp_path)) == (1.0, "no", "no")  # true negative


def test_engagement_signals(tmp_path):
    assert skill([call("Skill", skill="uipath-coded-agents:uipath-agents")], tmp_path=tmp_path).observed_label == "yes"
    assert skill([bash("cat .agents/skills/uipath-agents/SKILL.md")], tmp_path=tmp_path).observed_label == "yes"
    escaped_windows_path = "C:\\\\repo\\\\skills\\\\uipath-agents\\\\ref.md"
    assert skill([call("Read", file_path=escaped_windows_path)], tmp_path=tmp_path).observed_label == "yes"
    assert skill([bash("ls skills/skills/uipath-agents/")], tmp_path=tmp_path).observed_label == "yes"
    assert skill([call("Skill", skill="uipath-agents-extra")], tmp_path=tmp_path).observed_label == "no"
    assert skill([call("Write", file_path="notes/uipath-agents.md")], tmp_path=tmp_path).observed_label == "no"
    assert skill([bash("cat skills/uipath-agents")], tmp_path=tmp_path).observed_label == "no"  # not a directory path


def test_skill_field_of_the_telemetry_counts_for_skill_calls(tmp_path):
    from agentenv_dagster.criteria import ToolCall
    assert skill([ToolCall("Skill", {}, "success", skill="uipath-agents")], tmp_path=tmp_path).observed_label == "yes"


GATED = ["Skill", "Read", "Glob", "Grep"]
STATUSES = ["success", "error", None, "unknown"]


def _gated_call(tool, status):
    if tool == "Skill":
        return call("Skill", status, skill="beta")
    return call(tool, status, file_path="skills/beta/SKILL.md", pattern="skills/beta/**")


@pytest.mark.parametrize("tool, status", list(itertools.product(GATED, STATUSES)))
def test_gated_tools_engage_only_on_success_and_live_agrees(tmp_path, tool, status):
    positive = parse_criterion({"type": "skill_triggered", "description": "d", "skill_name": "beta",
                                "expected_skill": "beta"})
    calls = [_gated_call(tool, status)]
    result = grade(positive, context(tmp_path, calls))
    engaged = status == "success"
    assert result.observed_label == ("yes" if engaged else "no")
    assert positive.live_verdict(calls) == (True if engaged else None)
    assert (positive.live_verdict(calls) is True) == (result.score == 1.0)


@pytest.mark.parametrize("status", ["error", "unknown", None])
def test_bash_reading_a_skill_counts_whatever_its_status(tmp_path, status):
    assert skill([bash("cat skills/beta/SKILL.md", status)], "beta", "beta", tmp_path).observed_label == "yes"


def test_an_errored_skill_call_counts_once_a_read_succeeds(tmp_path):
    calls = [call("Skill", "error", skill="beta"), call("Read", "success", file_path="skills/beta/SKILL.md")]
    assert skill(calls, "beta", "beta", tmp_path).observed_label == "yes"


def test_an_excluded_skill_call_is_not_revived_by_its_own_parameters(tmp_path):
    calls = [call("Skill", "error", skill="beta", args="see skills/beta/SKILL.md")]
    assert skill(calls, "beta", "beta", tmp_path).observed_label == "no"


def test_engagement_anywhere_counts_regardless_of_order(tmp_path):
    calls = [call("Skill", skill="alpha"), bash("ls"), call("Skill", skill="beta")]
    assert skill(calls, "beta", "beta", tmp_path).score == 1.0
    assert skill(calls, "alpha", "beta", tmp_path).score == 0.0  # the distractor fired


def test_distractor_live_verdict_fails_once_engaged():
    distractor = parse_criterion({"type": "skill_triggered", "description": "d", "skill_name": "alpha",
                                  "expected_skill": "beta"})
    assert distractor.live_verdict([call("Skill", skill="beta")]) is None
    assert distractor.live_verdict([call("Skill", skill="alpha")]) is False


def test_no_telemetry_is_a_plain_error_result(tmp_path):
    result = skill(None, tmp_path=tmp_path)
    assert (result.score, result.result_kind, result.observed_label) == (0.0, "basic", None)
    assert "turn_records" in result.error


def test_a_skill_that_was_never_offered_is_the_tasks_fault(tmp_path):
    with pytest.raises(CheckerMisuseError, match=r"names skill 'absent-skill' but the agent was offered only \['probe-skill'\]"):
        skill([], "absent-skill", "absent-skill", tmp_path, offered_skills=frozenset({"probe-skill"}))
    assert skill([call("Skill", skill="probe-skill")], "probe-skill", "probe-skill", tmp_path,
                 offered_skills=frozenset({"probe-skill"})).score == 1.0


def test_stale_expected_key_is_rejected():
    with pytest.raises(Exception, match="expected\n  Extra inputs are not permitted"):
        parse_criterion({"type": "skill_triggered", "description": "d", "skill_name": "a", "expected_skill": "a",
                         "expected": "yes"})
