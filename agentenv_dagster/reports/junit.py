"""A run's results as JUnit XML (``agentenv-dagster run --junit FILE``), so CI shows them:
GitLab's ``artifacts:reports:junit`` and GitHub's JUnit report actions read this shape.

- ``<testsuites>`` holds a ``<testsuite>`` per task and variant, and one per dataset suite's
  thresholds; each carries ``name``, ``tests``, ``failures``, ``errors``, ``skipped``, ``time``.
- A ``<testcase>`` per row x criterion: ``classname`` is the row (``<variant>/<task id>/<NN>``,
  its report folder; GitLab shows it as the suite), ``name`` the criterion (unique in the row:
  its position, type and description), ``file`` the task file, ``time``.
- A failed gating criterion is a ``<failure>`` whose text is the justification (the checker's
  details, the judge's rationale and findings); a criterion that was not graded is
  ``<skipped>`` with the reason; informational and advisory criteria pass.
- A row whose status the criteria did not decide (an error, a timeout, turns or a budget
  exhausted) has a ``run`` test case too: ``<error>`` for an error, else ``<failure>``.
- Each suite threshold (``suite_thresholds``) is a test case of its suite.

Every text is agent, judge or task output, so characters XML cannot carry are dropped and long
texts are cut.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .models import EvaluationResult, RunSummary
from .render import report_folder, row_page_path
from .results import CriterionResultRow, FinalStatus

MESSAGE_CHARS = 300  # a failure's one-line message attribute
TEXT_CHARS = 8_000  # a failure's, skip's or output's text
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass
class _Suite:
    """A ``<testsuite>`` being filled, and its counts."""

    name: str
    time: float = 0.0
    cases: list[ET.Element] = field(default_factory=list)

    def add(self, case: ET.Element) -> None:
        self.cases.append(case)

    def element(self) -> ET.Element:
        counts = _counts(self.cases)
        suite = ET.Element("testsuite", name=self.name, **counts, time=_seconds(self.time))
        suite.extend(self.cases)
        return suite


def junit_xml(
    summary: RunSummary, results: list[EvaluationResult], suites: list[dict[str, Any]], out_dir: Path | str,
) -> ET.ElementTree:
    """The run as a JUnit document; ``out_dir`` is where its reports are (each test case's
    output names its row's page there)."""
    by_task: dict[tuple[str, str], _Suite] = {}
    for result in results:
        task = _task_of(result)
        suite = by_task.setdefault((task, result.variant_id), _Suite(_suite_name(task, result.variant_id)))
        suite.time += result.duration_seconds
        for case in _row_cases(result, out_dir):
            suite.add(case)
    thresholds = [_thresholds_suite(s) for s in suites]
    root = ET.Element("testsuites", name=f"agentenv-dagster run {summary.run_id}")
    root.extend(s.element() for s in [*by_task.values(), *thresholds] if s.cases)
    root.attrib.update(_counts(list(root.iter("testcase"))))
    root.set("time", _seconds(summary.total_duration_seconds))
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(
    path: Path | str, summary: RunSummary, results: list[EvaluationResult], suites: list[dict[str, Any]],
    out_dir: Path | str,
) -> Path:
    """Write :func:`junit_xml` to ``path`` (its folder made if need be)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(summary, results, suites, out_dir).write(path, encoding="utf-8", xml_declaration=True)
    return path


def _row_cases(result: EvaluationResult, out_dir: Path | str) -> list[ET.Element]:
    classname = report_folder("", result.variant_id, result.task_id, result.replicate_index).as_posix()
    source = result.task_config.source_file if result.task_config else None
    page = row_page_path(out_dir, result.task_id, result.variant_id, result.replicate_index).as_posix()
    cases = []
    for index, row in enumerate(result.success_criteria_results, start=1):
        name = f"criterion {index}: {row.criterion_type}" + (f" - {row.description}" if row.description else "")
        case = _case(classname, name, source, 0.0)
        outcome = _criterion_outcome(row)
        if outcome is not None:
            case.append(outcome)
        _output(case, f"{_verdict_line(row)}\n{row.details or ''}".rstrip() + f"\nrow page: {page}")
        cases.append(case)
    run = _run_outcome(result)
    if run is not None:
        case = _case(classname, "run", source, result.duration_seconds)
        case.append(run)
        _output(case, f"status {result.final_status.value}\nrow page: {page}")
        cases.append(case)
    return cases


def _criterion_outcome(row: CriterionResultRow) -> ET.Element | None:
    """``<failure>`` for a gating criterion below its threshold, ``<skipped>`` for one not
    graded, None for a pass (or an informational or advisory result)."""
    if row.verdict == "not evaluated":
        reason = row.error or row.details or "not graded"
        return _outcome("skipped", reason if reason.startswith("not graded") else f"not graded: {reason}", reason)
    if row.verdict == "fail" and not row.advisory:
        justification = "\n".join(
            [row.details or "", *(f"- {f}" for f in row.findings or []), f"error: {row.error}" if row.error else ""]
        ).strip()
        message = f"score {row.score:.2f} is below the threshold {row.pass_threshold:.2f}"
        return _outcome("failure", message, justification or message, type="criterion_failed")
    return None


def _run_outcome(result: EvaluationResult) -> ET.Element | None:
    """The row's own test case, when its status is not the criteria's verdict."""
    status = result.final_status
    message = f"{status.value}: {result.error_message}" if result.error_message else status.value
    text = "\n\n".join(t for t in (result.error_message, result.error_log_tail) if t) or status.value
    if status.category == "error":
        return _outcome("error", message, text, type=status.value)
    if status.category == "failed" and status is not FinalStatus.FAILURE:
        return _outcome("failure", message, text, type=status.value)
    if status.category == "ungraded" and not result.success_criteria_results:
        return _outcome("skipped", message, text)
    return None


def _thresholds_suite(suite: dict[str, Any]) -> _Suite:
    variant = suite.get("variant_id") or "default"
    built = _Suite(_suite_name(f"{suite['suite_id']} suite thresholds", variant))
    classname = f"{variant}/{suite['suite_id']}/suite"
    for aggregate in suite.get("criterion_aggregates") or []:
        for check in aggregate.get("checks") or []:
            metric, minimum, actual = check["metric"], _number(check["min_value"]), _number(check.get("actual_value"))
            case = _case(classname, f"criterion {aggregate['criterion_index'] + 1}: {metric} >= {minimum}", None, 0.0)
            if not check.get("passed"):
                shown = "was not computed" if actual is None else f"= {actual} is below the minimum {minimum}"
                case.append(_outcome("failure", f"{metric} {shown}", f"{metric} {shown}", type="suite_threshold"))
            _output(case, f"{metric} = {actual} (minimum {minimum})")
            built.add(case)
    return built


def _case(classname: str, name: str, source: str | None, seconds: float) -> ET.Element:
    case = ET.Element("testcase", classname=_text(classname, MESSAGE_CHARS), name=_text(name, MESSAGE_CHARS))
    if source:
        case.set("file", _text(source, MESSAGE_CHARS))
    case.set("time", _seconds(seconds))
    return case


def _outcome(tag: str, message: str, text: str, **attributes: str) -> ET.Element:
    element = ET.Element(tag, message=_text(" ".join(message.split()), MESSAGE_CHARS), **attributes)
    element.text = _text(text, TEXT_CHARS)
    return element


def _output(case: ET.Element, text: str) -> None:
    ET.SubElement(case, "system-out").text = _text(text, TEXT_CHARS)


def _verdict_line(row: CriterionResultRow) -> str:
    score = "no score" if row.score is None else f"score {row.score:.2f}"
    gate = "advisory, not gated" if row.advisory else "gating" if row.gating else "informational, not gated"
    return f"{row.verdict}: {score} (threshold {row.pass_threshold:.2f}, {gate})"


def _counts(cases: list[ET.Element]) -> dict[str, str]:
    def having(tag: str) -> int:
        return sum(1 for c in cases if c.find(tag) is not None)

    return {"tests": str(len(cases)), "failures": str(having("failure")), "errors": str(having("error")),
            "skipped": str(having("skipped"))}


def _task_of(result: EvaluationResult) -> str:
    """The task a row belongs to (a dataset row's id is ``<task id>/<row id>``)."""
    resolved = result.task_config.resolved if result.task_config else {}
    return str(resolved.get("task_id") or result.task_id)


def _suite_name(name: str, variant_id: str) -> str:
    return _text(name if variant_id == "default" else f"{name} [{variant_id}]", MESSAGE_CHARS)


def _number(value: Any) -> Any:
    """A metric as people read it (0.667, not 0.6666666666666666)."""
    return str(round(value, 4)) if isinstance(value, float) else value


def _seconds(value: float) -> str:
    return f"{max(value, 0.0):.3f}"


def _text(value: str, limit: int) -> str:
    """Only characters XML 1.0 can carry, at most ``limit`` of them."""
    text = _NOT_XML.sub("", value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
