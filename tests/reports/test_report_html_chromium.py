"""task.html in a real browser: headless Chromium renders the tasks, scores and criteria, and
none of the hostile task output becomes live markup."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentenv_dagster.reports.render import write_reports

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium binary not found (Debian: apt-get install -y chromium)"
)


def chromium(tmp_path: Path, page: Path, *args: str) -> str:
    """One isolated, offline headless run; returns stdout."""
    completed = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}", *args, page.resolve().as_uri(),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return completed.stdout


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
    assert "<script" not in dom.lower()
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
