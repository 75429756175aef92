"""task.html in a real browser: headless Chromium renders the tasks, scores and criteria, and
none of the hostile task output becomes live markup."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import chromium as run_chromium
from browser import needs_chromium

from agentenv_dagster.reports.render import write_reports

pytestmark = needs_chromium


def chromium(tmp_path: Path, page: Path, *args: str) -> str:
    """One isolated, offline headless run of the page; returns stdout."""
    return run_chromium(tmp_path / "chromium-profile", page.resolve().as_uri(), *args)


@pytest.fixture
def page(tmp_path, summary, results) -> Path:
    return write_reports(tmp_path / "run", summary, results).task_html


def test_rendered_dom_shows_tasks_scores_and_criteria(tmp_path, page):
    dom = chromium(tmp_path, page, "--dump-dom")
    for task_id in ["hello_world", "sentiment/row-3", "broken_env", "exec_only"]:
        assert task_id in dom
    assert 'class="weighted-score">0.85</strong>' in dom
    assert dom.count('<tr class="criterion ') == 6
    assert '<tr class="criterion v-pass">' in dom and '<tr class="criterion v-fail">' in dom
    assert "<td><code>classification_match</code></td>" in dom


def test_hostile_content_stays_text(tmp_path, page):
    dom = chromium(tmp_path, page, "--dump-dom")
    assert dom.lower().count("<script") == 1  # the page's own filter, and none of the task's
    assert "<img" not in dom.lower()
    # The payloads would write this marker into the title or a data attribute had they run.
    assert "PWNED" not in dom
    assert "<title>Coder Eval run 2025-10-09_15-30-45</title>" in dom
    assert "&lt;script&gt;document.title = 'PW' + 'NED';&lt;/script&gt;" in dom


def test_screenshot_renders(tmp_path, page):
    shot = tmp_path / "task.png"
    chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,900", "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 20_000  # a blank 1280x900 page is a few kB
