"""Each row's page (row.html beside its task.json): its trajectory in order, the grading beside
each criterion, and where it is; task.html's variants side by side and its row filter's hooks."""

from __future__ import annotations

import html
import re

import dagster as dg
import pytest
import viewer_runs

from agentenv_dagster.reports.experiment import variant_comparison
from agentenv_dagster.reports.models import CommandTelemetry, EvaluationResult, TurnRecord
from agentenv_dagster.reports.render import row_page_path, row_page_url, write_reports
from agentenv_dagster.reports.timeline import TimelineCall, TimelineMessage, timeline

pytestmark = pytest.mark.xdist_group("viewer_runs")


def text_of(page: str) -> str:
    """The page's text as a reader sees it: tags gone, entities decoded, blanks folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def call(name: str) -> CommandTelemetry:
    return CommandTelemetry(tool_name=name, result_status="success")


def test_the_timeline_puts_each_message_after_the_tool_calls_before_it():
    turn = TurnRecord(iteration=1, commands=[call("Read"), call("Write"), call("Bash")], messages=[
        {"role": "user", "content": "do it", "tool_calls_before": 0},
        {"role": "assistant", "content": "reading first", "tool_calls_before": 1},
        {"role": "system<script>", "content": "odd", "tool_calls_before": 99},  # out of range: after every call
    ])
    assert [(e.kind, getattr(e, "role", None) or e.command.tool_name) for e in timeline(turn)] == [
        ("message", "user"), ("tool_call", "Read"), ("message", "assistant"),
        ("tool_call", "Write"), ("tool_call", "Bash"), ("message", "other")]
    assert [e.number for e in timeline(turn) if isinstance(e, TimelineCall)] == [1, 2, 3]


def test_a_turn_recorded_without_messages_reads_prompt_calls_reply():
    turn = TurnRecord(iteration=1, user_input="ask", agent_output="done", commands=[call("Bash")])
    assert timeline(turn) == [TimelineMessage("user", "ask"), TimelineCall(1, turn.commands[0]),
                              TimelineMessage("assistant", "done")]


def test_a_row_page_is_beside_its_task_json_and_has_a_link(tmp_path):
    out = tmp_path / "run"
    assert row_page_path(out, "suite/row 1", "opus", 2) == out / "opus" / "suite" / "row 1" / "02" / "row.html"
    assert row_page_url(out, "hello") == (out / "default" / "hello" / "00" / "row.html").resolve().as_uri()
    assert (row_page_url(out, "suite/row 1", "opus", 2, base_url="http://127.0.0.1:8123/")
            == "http://127.0.0.1:8123/opus/suite/row%201/02/row.html")
    with pytest.raises(ValueError, match=r"path segment '\.\.' cannot name a report folder"):
        row_page_url(out, "../escape", base_url="http://127.0.0.1:8123/")


def test_the_sample_row_page_shows_tokens_and_cost_per_turn_and_the_judge_beside_its_criterion(tmp_path, summary,
                                                                                                 results):
    written = write_reports(tmp_path / "run", summary, results)
    page = (written.task_jsons[0].parent / "row.html").read_text()
    shown = text_of(page)
    assert "Turn 1: 2 tool calls, 3.50 s, 2000 tokens, $0.0100, claude-sonnet-4-5" in shown
    assert "pass llm_judge Code is idiomatic 0.70 0.70 yes rationale: fine uses print transcript: judge-0.yaml" in shown
    assert '<a href="judge-0.yaml">judge-0.yaml</a>' in page  # beside the page, in the row's folder
    assert '<a href="../../../task.html#task-default/hello_world/00">' in page
    # task.html links each row to its page, and its transcript from the run's folder
    run_page = written.task_html.read_text()
    assert re.findall(r'<a class="row-page" href="([^"]+)">', run_page) == [
        "default/hello_world/00/row.html", "opus/sentiment/row-3/01/row.html",
        "default/broken_env/00/row.html", "default/exec_only/00/row.html"]
    assert '<a href="default/hello_world/00/judge-0.yaml">' in run_page


def test_a_transcript_path_that_is_not_a_plain_file_name_is_not_a_link(tmp_path, summary, results):
    results[0].success_criteria_results[1].transcript_path = "javascript:alert(1)"
    written = write_reports(tmp_path / "run", summary, results)
    page = (written.task_jsons[0].parent / "row.html").read_text()
    assert "transcript: <code>javascript:alert(1)</code>" in page and 'href="javascript' not in page


def test_variants_are_compared_row_by_row_against_the_first():
    rows = [EvaluationResult(task_id=t, variant_id=v, final_status=s, weighted_score=score)
            for t, v, s, score in [("a", "base", "SUCCESS", 1.0), ("b", "base", "FAILURE", 0.25),
                                   ("a", "new", "SUCCESS", 1.0), ("b", "new", "SUCCESS", 0.75),
                                   ("c", "new", "NOT_GRADED", None)]]
    comparison = variant_comparison(rows)
    assert [(r.task_id, r.deltas, r.category) for r in comparison.rows] == [
        ("a", {"new": 0.0}, "succeeded"), ("b", {"new": 0.5}, "failed"), ("c", {"new": None}, "ungraded")]
    assert comparison.average_delta("new") == pytest.approx(0.875 - 0.625)
    assert variant_comparison(rows[:2]) is None  # one variant: nothing to compare


# -- the real run: tests/fixtures/viewer/tickets.yaml under its experiment, by the CLI --


def row_page(run: viewer_runs.Run, variant: str, row: str) -> str:
    return row_page_path(run.out, f"tickets/{row}", variant).read_text()


def test_the_real_run_wrote_every_row_s_page(ticket_run):
    assert ticket_run.done.returncode == 1, ticket_run.done.stdout + ticket_run.done.stderr
    pages = sorted(p.relative_to(ticket_run.out).as_posix() for p in ticket_run.out.rglob("row.html"))
    assert pages == [f"{v}/tickets/{r}/00/row.html" for v in ("as-is", "fixed") for r in ("t1", "t2", "t3", "t4")]


def test_a_real_row_page_shows_the_trajectory_in_order(ticket_run):
    shown = text_of(row_page(ticket_run, "as-is", "t1"))
    trajectory = shown[shown.index("Trajectory (1 turn)"):]
    assert re.search(
        r"Turn 1: 2 tool calls, \d+\.\d\d s, 0 tokens, n/a, replay "
        r"user Label this support ticket billing, bug or question; .* Ticket: \"I was charged twice this month.\" "
        r"#1 Write success \d+\.\d{3} s \S+ arguments \{ \"file_path\": \"label.txt\", \"content\": \"billing\" \} "
        r"result wrote label.txt "
        r"#2 Bash success \d+\.\d{3} s \S+ arguments \{ \"command\": \"cat label.txt\" \} result billing \[exit code 0\] "
        r"assistant billing ", trajectory), trajectory


def test_a_real_row_page_shows_the_judge_s_verdict_and_justification_beside_its_criterion(ticket_run):
    page = row_page(ticket_run, "as-is", "t3")
    shown = text_of(page)
    assert ("fail classification_match the ticket's label 0.00 0.90 yes "
            "observed='billing', expected='question' (file 'label.txt')") in shown
    assert (f"pass llm_judge the judge on the label 0.90 0.70 yes rationale: {viewer_runs.RATIONALE} "
            f"{viewer_runs.FINDING} transcript: judge-1.yaml judge: 240 tokens, $0.0012") in shown
    assert (row_page_path(ticket_run.out, "tickets/t3", "as-is").parent / "judge-1.yaml").is_file()


def test_an_agent_s_script_in_its_reply_and_tool_arguments_is_text(ticket_run):
    page = row_page(ticket_run, "as-is", "t2")
    assert "<script" not in page.lower() and "<img" not in page.lower()
    assert "&lt;script&gt;document.title = &#39;PW&#39; + &#39;NED&#39;;&lt;/script&gt;bug" in page
    assert "echo &#39;&lt;img src=x onerror=" in page


def test_the_real_run_s_variants_side_by_side(ticket_run):
    page = (ticket_run.out / "task.html").read_text()
    table = text_of(page[page.index('<table class="compare">'):page.index("</table>", page.index('class="compare"'))])
    assert table.startswith("Task # as-is fixed Δ pass rate 50.0% 75.0% average score 0.70 0.82 +0.12 ")
    assert "tickets/t3 00 - 0.45 + 0.95 +0.50" in table
    assert "tickets/t4 00 ! 0.45 ! 0.45 0.00" in table
    assert '<a href="fixed/tickets/t3/00/row.html">0.95</a>' in page
    # the filter's hooks: every row of both tables and every section says its outcome
    assert re.findall(r'<tr data-category="(\w+)" data-task="tickets/t3">', page) == ["failed", "failed", "succeeded"]


def test_each_verification_of_the_real_run_links_its_variant_s_row_page(ticket_run):
    """In the Dagster instance, each row's verification under each variant links the page the
    run wrote for that row and variant."""
    with dg.DagsterInstance.from_config(str(ticket_run.out.parent / "project" / ".dagster_home")) as instance:
        links = {}
        for key in instance.get_asset_keys():
            if key.path[0] == "verifications":
                for record in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=100).records:
                    materialization = record.asset_materialization
                    links[(key.path[-1], materialization.partition)] = materialization.metadata["row_page"].value
    rows = [(v, r) for v in ("as-is", "fixed") for r in ("t1", "t2", "t3", "t4")]
    assert {partition: link for (_, partition), link in links.items()} == {
        f"{r}|{v}": row_page_url(ticket_run.out, f"tickets/{r}", v) for v, r in rows}
    assert {verifier for verifier, _ in links} == {"success_criteria"}
