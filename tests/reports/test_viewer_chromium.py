"""The viewer in a real browser: headless Chromium on the pages `agentenv-dagster view` serves
from a real run; screenshots go to test-artifacts/ for CI to keep."""

from __future__ import annotations

import re

import pytest
from browser import ARTIFACTS, chromium, needs_chromium
from test_viewer import viewing

from agentenv_dagster.reports.render import row_page_url

pytestmark = [needs_chromium, pytest.mark.xdist_group("viewer_runs")]


@pytest.fixture
def served(ticket_run):
    with viewing(str(ticket_run.out)) as (_, url, _):
        yield ticket_run, url


def look(tmp_path, url: str, name: str) -> str:
    """The page's DOM once its script ran, and its screenshot in test-artifacts/."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / f"viewer-{name}.png"
    chromium(tmp_path / f"profile-{name}", url, f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000  # not a blank page
    return chromium(tmp_path / f"profile-{name}-dom", url, "--dump-dom")


def shown_rows(dom: str) -> list[tuple[str, str]]:
    """(task id, variant) of each row of the rows table the filter left visible."""
    table = dom[dom.index('<table class="summary">'):]
    table = table[:table.index("</table>")]
    return re.findall(r'<tr data-category="\w+" data-task="([^"]+)">\s*<td>.*?</td>\s*<td>.*?</td>\s*<td>([^<]+)</td>',
                      table, re.DOTALL)


def test_the_failed_rows_filter(tmp_path, served):
    _, url = served
    every = look(tmp_path, url + "task.html", "run")
    assert len(shown_rows(every)) == 8 and "8 of 8 rows shown" in every
    failed = look(tmp_path, url + "task.html?only=failed", "run-failed-rows")
    assert shown_rows(failed) == [("tickets/t3", "as-is"), ("tickets/t4", "as-is"), ("tickets/t4", "fixed")]
    assert "3 of 8 rows shown" in failed
    assert re.findall(r'<section class="task [^"]*" id="([^"]+)" data-category="\w+" data-task="[^"]+">', failed) == [
        "task-as-is/tickets/t3/00", "task-as-is/tickets/t4/00", "task-fixed/tickets/t4/00"]


def test_a_row_page_shows_the_agent_s_script_as_text(tmp_path, served):
    run, url = served
    dom = look(tmp_path, row_page_url(run.out, "tickets/t2", "as-is", base_url=url), "row")
    assert "<script" not in dom.lower() and "<img" not in dom.lower()
    assert "PWNED" not in dom  # the reply's script would have put it in the title had it run
    assert "<title>tickets/t2 · as-is · #00 — SUCCESS</title>" in dom
    assert "&lt;script&gt;document.title = 'PW' + 'NED';&lt;/script&gt;bug" in dom
