"""write_reports: the on-disk layout, run.md for a GitHub job summary, and an inert task.html."""

from __future__ import annotations

import json
import re

import pytest
from report_samples import HOSTILE_IMG, HOSTILE_SCRIPT

from agentenv_dagster.reports import render
from agentenv_dagster.reports.models import EvaluationResult, RunSummary
from agentenv_dagster.reports.render import prepare_reports, task_json_path, write_reports


@pytest.fixture
def written(tmp_path, summary, results):
    return write_reports(tmp_path / "run", summary, results)


def test_layout(tmp_path, written, results):
    out = tmp_path / "run"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "default/broken_env/00/row.html",
        "default/broken_env/00/task.json",
        "default/exec_only/00/row.html",
        "default/exec_only/00/task.json",
        "default/hello_world/00/row.html",
        "default/hello_world/00/task.json",
        "opus/sentiment/row-3/01/row.html",
        "opus/sentiment/row-3/01/task.json",
        "run.json",
        "run.md",
        "task.html",
    ]
    assert written.task_jsons[1] == out / "opus" / "sentiment" / "row-3" / "01" / "task.json"
    assert [EvaluationResult.model_validate_json(p.read_text()) for p in written.task_jsons] == results


def test_run_json_is_the_summary(written, summary):
    data = json.loads(written.run_json.read_text())
    assert data["pass_rate"] == pytest.approx(1 / 3)
    assert RunSummary.model_validate(data) == summary


@pytest.mark.parametrize("task_id", ["../escape", "a//b", "suite/./row", "/abs"])
def test_task_ids_cannot_leave_the_run_directory(tmp_path, task_id):
    result = EvaluationResult(task_id=task_id, final_status="SUCCESS")
    with pytest.raises(ValueError, match=r"path segment '(\.\.|\.|)' cannot name a report folder"):
        task_json_path(tmp_path, result)
    with pytest.raises(ValueError, match=r"path segment '(\.\.|\.|)' cannot name a report folder"):
        prepare_reports(tmp_path / "run", "default", [task_id], 0)
    assert not (tmp_path / "run").exists()


def test_reports_prepared_ahead_are_those_the_reports_then_fill(tmp_path, summary, results, monkeypatch):
    """A dataset's folders are made, and the templates compiled, while its shard runs go on;
    the reports then fill the folders without reading a template again."""
    out = tmp_path / "run"
    render._environment.cache_clear()
    prepare_reports(out, "opus", ["sentiment/row-3", "sentiment/row-4"], 1)
    loader = render._environment().loader
    monkeypatch.setattr(loader, "get_source", lambda *a: pytest.fail(f"a template read again: {a[1]}"))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "opus", "opus/sentiment", "opus/sentiment/row-3", "opus/sentiment/row-3/01",
        "opus/sentiment/row-4", "opus/sentiment/row-4/01"]
    written = write_reports(out, summary, results)
    render._environment().get_template("suite.md")  # (a dataset's suite.md, written next)
    assert written.task_jsons[1].parent == out / "opus" / "sentiment" / "row-3" / "01"
    assert EvaluationResult.model_validate_json(written.task_jsons[1].read_text()) == results[1]


def test_run_md_summary_table(written):
    md = written.run_md.read_text()
    assert "## Coder Eval run `2025-10-09_15-30-45`" in md
    assert "| 33.3% | 1 | 1 | 1 | 1 | 1 | 42.0 s | $0.0320 (floor: 1 unpriced) |" in md
    assert "| `+` | hello_world | default | 00 | SUCCESS | 0.85 | 12.2 s |" in md
    assert "| `-` | sentiment/row-3 | opus | 01 | FAILURE | 0.00 | 4.0 s |" in md
    assert "| `B` | broken_env | default | 00 | BUILD_FAILED | 0.00 | 0.0 s |" in md
    assert "| `?` | exec_only | default | 00 | NOT_GRADED | – | 0.0 s |" in md
    assert "| tasks/bad.yaml | ValidationError: field 'promt' |" in md


def test_run_md_criteria_tables(written):
    md = written.run_md.read_text()
    assert "### `+` hello_world · default · #00 — SUCCESS, score 0.85" in md
    assert "| pass | file_exists | hello.py exists | 1.00 | 0.90 | yes | 1 file matched |  |" in md
    assert "| pass | llm_judge | Code is idiomatic | 0.70 | 0.70 | yes | rationale: fine |  |" in md
    assert "| info | commands_efficiency | few commands | 0.50 | 0.90 | no |  |  |" in md
    assert "> **Error:** criteria not met \\| see details" in md
    assert "_No criteria were graded._" in md


def test_run_md_cells_hold_no_raw_html_or_line_breaks(written):
    md = written.run_md.read_text()
    assert "<script" not in md
    row = next(line for line in md.splitlines() if "classification_match" in line)
    assert row == (
        "| fail | classification_match | label is positive | 0.00 | 0.90 | yes | observed (other)<br>"
        "&lt;script&gt;document.title = 'PW' + 'NED';&lt;/script&gt; |  |"
    )


@pytest.mark.parametrize("page", ["task.html", "opus/sentiment/row-3/01/row.html"])
def test_pages_escape_hostile_content_and_load_nothing(written, page):
    """The only script is task.html's filter, inline and named by hash in the page's policy."""
    text = (written.run_json.parent / page).read_text()
    assert "&lt;script&gt;document.title = &#39;PW&#39; + &#39;NED&#39;;&lt;/script&gt;" in text
    assert "&lt;img src=x onerror=" in text
    assert HOSTILE_SCRIPT not in text and HOSTILE_IMG not in text
    script, digest = render.filter_script()
    scripts = re.findall(r"<script\b[^>]*>", text, re.IGNORECASE)
    assert scripts == (["<script>"] if page == "task.html" else [])
    assert text.count(script) == len(scripts)
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', text).group(1)
    assert "default-src &#39;none&#39;" in policy
    assert ("script-src &#39;sha256-" in policy) == (page == "task.html") and (digest[1:-1] in policy) == (page == "task.html")
    assert not re.search(r"<(link|iframe|img|object|embed)\b|url\(|https?://", text, re.IGNORECASE)


def test_task_html_content(written):
    page = written.task_html.read_text()
    for text in [
        "hello_world", "sentiment/row-3", "broken_env", "exec_only",  # every task
        'class="weighted-score">0.85<', "0.70",  # scores
        "pip install -q requests", "hello.py\n",  # pre/post-run output
        "python hello.py", "Turn 1: 2 tool calls",  # turns with tool calls
        "expected <code>positive</code>, observed <code>(other)</code>", "uses print", "judge-0.yaml",
        "Post-failure evidence", "not evaluated", "Step 3/7 : RUN false",
    ]:  # fmt: skip
        assert text in page, text
    assert page.count('<tr class="criterion ') == 6  # 3 + 1 + 2 post-failure


def test_each_result_s_parts_rendered_ahead_are_those_the_reports_join(tmp_path, summary, results):
    """A dataset's command renders each run's rows' parts as the run ends: the reports then
    join them, the same files as rendering them all at the end; a part is as its result was
    when added. Each summary row links to its result's section."""
    whole = write_reports(tmp_path / "whole", summary, results)
    rendered = render.RenderedRows()
    rendered.add(results[:2])
    joined = write_reports(tmp_path / "joined", summary, results, rendered=rendered)
    for name in ("run_md", "task_html"):
        assert getattr(joined, name).read_text() == getattr(whole, name).read_text()
    page = whole.task_html.read_text()
    links, sections = re.findall(r'<a href="#([^"]+)">', page), re.findall(r'<section [^>]*id="([^"]+)"', page)
    assert links == sections == ["task-default/hello_world/00", "task-opus/sentiment/row-3/01",
                                 "task-default/broken_env/00", "task-default/exec_only/00"]
    ahead = render.RenderedRows()
    ahead.add(results[:1])
    results[0].task_id = "renamed"  # after it was rendered: its parts stay as they were
    results[1].task_id = "renamed_too"  # not rendered yet: rendered as it is now
    again = write_reports(tmp_path / "again", summary, results, rendered=ahead).run_md.read_text()
    assert "| hello_world |" in again and "| renamed |" not in again and "| renamed_too |" in again
