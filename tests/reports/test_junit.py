"""``run --junit FILE``: JUnit XML in the shape GitLab's ``artifacts:reports:junit`` and GitHub's
JUnit report actions parse, read back with ``xml.etree``."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter

import pytest
import viewer_runs
from projects import make_project

from agentenv_dagster.reports.junit import TEXT_CHARS, junit_xml
from agentenv_dagster.reports.models import CriterionResultRow, EvaluationResult, RunSummary

pytestmark = pytest.mark.xdist_group("viewer_runs")
OUTCOMES = ("failure", "error", "skipped")


def check_shape(root: ET.Element) -> None:
    """What the parsers rely on: one <testsuites> of named <testsuite>s whose counts add up;
    each <testcase> with a classname, a name unique in it (GitLab keeps only the first of a
    name) and a numeric time; at most one outcome, with a message and its text."""
    assert root.tag == "testsuites"
    cases = list(root.iter("testcase"))
    for suite in root:
        assert suite.tag == "testsuite" and suite.get("name")
        mine = suite.findall("testcase")
        assert [child.tag for child in suite] == ["testcase"] * len(mine)
        assert {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")} == counts(mine)
        float(suite.get("time"))
    assert {k: int(root.get(k)) for k in ("tests", "failures", "errors", "skipped")} == counts(cases)
    for case in cases:
        assert case.get("classname") and case.get("name")
        float(case.get("time"))
        outcomes = [child for child in case if child.tag in OUTCOMES]
        assert len(outcomes) <= 1 and all(o.get("message") and o.text for o in outcomes)
        assert [child.tag for child in case if child.tag not in OUTCOMES] in ([], ["system-out"])
    assert not [k for k, n in Counter((c.get("classname"), c.get("name")) for c in cases).items() if n > 1]


def counts(cases: list[ET.Element]) -> dict[str, int]:
    return {"tests": len(cases), "failures": sum(c.find("failure") is not None for c in cases),
            "errors": sum(c.find("error") is not None for c in cases),
            "skipped": sum(c.find("skipped") is not None for c in cases)}


def outcome(case: ET.Element) -> tuple[str, str | None]:
    found = next((child for child in case if child.tag in OUTCOMES), None)
    return ("passed", None) if found is None else (found.tag, found.get("message"))


def test_a_test_case_per_row_and_criterion_failures_carrying_the_justification(ticket_run):
    root = ET.parse(ticket_run.junit).getroot()
    check_shape(root)
    assert [s.get("name") for s in root] == ["tickets [as-is]", "tickets [fixed]", "tickets suite thresholds [as-is]",
                                             "tickets suite thresholds [fixed]"]
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    criteria = ["criterion 1: classification_match - the ticket's label", "criterion 2: llm_judge - the judge on the label"]
    rows = [(f"{v}/tickets/{r}/00", name) for v in ("as-is", "fixed") for r in ("t1", "t2", "t3") for name in criteria]
    assert set(rows) <= set(cases)
    failed = cases[("as-is/tickets/t3/00", criteria[0])]
    assert outcome(failed) == ("failure", "score 0.00 is below the threshold 0.90")
    assert failed.find("failure").text == "observed='billing', expected='question' (file 'label.txt')"
    assert failed.get("file") == "tasks/tickets.yaml"
    judged = cases[("fixed/tickets/t3/00", criteria[1])]
    assert outcome(judged) == ("passed", None)
    assert judged.find("system-out").text == (
        f"pass: score 0.90 (threshold 0.70, gating)\nrationale: {viewer_runs.RATIONALE}\n"
        f"row page: {ticket_run.out.as_posix()}/fixed/tickets/t3/00/row.html")
    assert [outcome(cases[row]) for row in rows].count(("passed", None)) == len(rows) - 1


def test_a_row_that_errored_is_an_error_and_the_suite_thresholds_are_test_cases(ticket_run):
    root = ET.parse(ticket_run.junit).getroot()
    cases = {(c.get("classname"), c.get("name")): c for c in root.iter("testcase")}
    for variant in ("as-is", "fixed"):
        kind, message = outcome(cases[(f"{variant}/tickets/t4/00", "run")])
        assert kind == "error" and message.startswith("ERROR: NoScriptedReply: no replay episode matches the prompt")
        assert not [k for k in cases if k[0] == f"{variant}/tickets/t4/00" and k[1] != "run"]  # its criteria: evidence only
    thresholds = {k: outcome(c) for k, c in cases.items() if k[0].endswith("/suite")}
    assert thresholds == {
        ("as-is/tickets/suite", "criterion 1: accuracy >= 0.9"): ("failure", "accuracy = 0.6667 is below the minimum 0.9"),
        ("as-is/tickets/suite", "criterion 1: completion_rate >= 1.0"): ("failure", "completion_rate = 0.75 is below the minimum 1.0"),
        ("fixed/tickets/suite", "criterion 1: accuracy >= 0.9"): ("passed", None),
        ("fixed/tickets/suite", "criterion 1: completion_rate >= 1.0"): ("failure", "completion_rate = 0.75 is below the minimum 1.0"),
    }
    assert {k: root.get(k) for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": "18", "failures": "4", "errors": "2", "skipped": "0"}
    assert f"  junit: {ticket_run.junit}" in ticket_run.done.stdout


def test_a_criterion_not_graded_is_skipped_with_its_reason(unjudged_run):
    assert unjudged_run.done.returncode == 0, unjudged_run.done.stdout + unjudged_run.done.stderr
    root = ET.parse(unjudged_run.junit).getroot()
    check_shape(root)
    (suite,) = root
    judged = suite.find("testcase[@name='criterion 2: llm_judge - the judge on style']")
    reason = "not graded: no judge configured: set [model] api_key in .agentenv/config.toml or ANTHROPIC_API_KEY"
    assert outcome(judged) == ("skipped", reason) and judged.find("skipped").text == reason
    assert outcome(suite.find("testcase[@name='criterion 1: file_exists - hello.py exists']")) == ("passed", None)
    assert root.get("skipped") == "1" and root.get("failures") == root.get("errors") == "0"


def test_text_xml_cannot_carry_is_dropped_and_long_text_cut():
    hostile = "bad\x00byte \x1b[31mred\x1b[0m <![CDATA[ ]]> & \ud800" + "x" * (2 * TEXT_CHARS)
    result = EvaluationResult(task_id="t", final_status="FAILURE", weighted_score=0.0, success_criteria_results=[
        CriterionResultRow(criterion_type="file_contains", description="d\x07", score=0.0, details=hostile)])
    summary = RunSummary.from_results("r", result.started_at, result.started_at, [result])
    text = ET.tostring(junit_xml(summary, [result], [], "out").getroot(), encoding="unicode")
    failure = ET.fromstring(text).find(".//failure")
    assert failure.text.startswith("badbyte [31mred[0m <![CDATA[ ]]> & xxx") and len(failure.text) == TEXT_CHARS
    assert ET.fromstring(text).find(".//testcase").get("name") == "criterion 1: file_contains - d"


def test_junit_is_for_coder_eval_tasks(tmp_path):
    project = make_project(tmp_path / "project")
    done = viewer_runs.cli(project, "run", "tasks/reply_to_dana.json", "--junit", str(tmp_path / "j.xml"))
    assert done.returncode == 2
    assert done.stderr == "error: --junit is for Coder Eval tasks (YAML): an agent-env task writes its context.json\n"
    assert not (tmp_path / "j.xml").exists()
