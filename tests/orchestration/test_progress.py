"""What ``agentenv-dagster run`` shows while it runs and when it ends, run for real in a
subprocess: off a terminal a line now and then (no Dagster event lines), ``--verbose`` with
them, ``--quiet`` with only the summary, a live display on a terminal (a pseudo-terminal
here); the summary's run and asset addresses; the counts against the run's own results; and
each verification's link to its row's page."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import dagster as dg
import pytest
from projects import FIXTURES, leaked_servers, make_project

from agentenv_dagster.reports.render import row_page_url

DEBUG_LINE = re.compile(r" - dagster - DEBUG - ")
RUN_LINE = re.compile(r"^run (\S+) of job '(\w+)': (SUCCESS|FAILURE)$")
ROWS_LINE = re.compile(r"^tickets: (\d+)/4 rows \((\d+)%\); (\d+) passed, (\d+) failed, (\d+) errored(; .*)?$")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli(project: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), **(env or {})}
    environment.pop("ANTHROPIC_API_KEY", None)
    if "AGENTENV_UI_URL" not in (env or {}):
        environment.pop("AGENTENV_UI_URL", None)
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=environment,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = make_project(tmp_path_factory.mktemp("progress") / "project")
    (root / "tasks" / "tickets.yaml").write_text((FIXTURES / "progress" / "tickets.yaml").read_text())
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.fixture(scope="module")
def tickets(project, tmp_path_factory):
    """The dataset task, run off a terminal: the CLI's output and its reports."""
    out = tmp_path_factory.mktemp("tickets-out")
    return cli(project, "run", "tasks/tickets.yaml", "--output-dir", str(out)), out


def instance_of(project: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(project / ".dagster_home"))


def run_id_of(done: subprocess.CompletedProcess) -> str:
    match = RUN_LINE.match(done.stdout.splitlines()[0])
    assert match, done.stdout
    return match.group(1)


@pytest.mark.slow
def test_off_a_terminal_a_run_shows_lines_of_progress_not_dagster_s_events_and_ends_with_its_addresses(project):
    done = cli(project, "run", "tasks/reply_to_dana.json", env={"AGENTENV_UI_URL": "http://ui.example:8080/"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert not DEBUG_LINE.search(done.stdout + done.stderr) and "STEP_START" not in done.stdout + done.stderr
    run_id = run_id_of(done)
    lines = done.stderr.splitlines()
    assert lines[0] == f"reply_to_dana: run {run_id} started, 1 row"
    with instance_of(project) as instance:
        planned = {r.event_log_entry.step_key for r in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.STEP_START).records}  # the events are in the instance all the same
        materialized = [r.event_log_entry.asset_materialization for r in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records]
    assert len(planned) == 8  # 7 steps and the teardown
    assert re.fullmatch(r"reply_to_dana: 8/8 steps \(100%\); not graded; elapsed \d:\d\d:\d\d; SUCCESS", lines[-1])
    assert all(re.fullmatch(r"reply_to_dana: [1-8]/8 steps \(\d+%\); .*", line) for line in lines[1:])
    assert f"      run:    http://ui.example:8080/runs/{run_id}" in done.stdout.splitlines()
    keys = {m.asset_key.to_user_string() for m in materialized}
    assert {"verifications/reply_to_dana/sent", "verifications/reply_to_dana/tone", "results/reply_to_dana"} <= keys
    assert {f"http://ui.example:8080/assets/{key}" for key in keys} == {
        line.split()[-1] for line in done.stdout.splitlines() if "/assets/" in line}
    # an agent-env task writes no row pages: its verifications link none
    assert not any("row_page" in m.metadata for m in materialized)


@pytest.mark.slow
def test_verbose_shows_dagster_s_event_lines_instead_of_the_progress(project):
    done = cli(project, "run", "tasks/reply_to_dana.json", "--verbose")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = run_id_of(done)
    assert DEBUG_LINE.search(done.stderr)
    assert f" - {run_id} - " in done.stderr and "RUN_START" in done.stderr and "STEP_START" in done.stderr
    assert "started, 1 row" not in done.stderr
    assert f"      run:    http://127.0.0.1:3000/runs/{run_id}" in done.stdout.splitlines()


@pytest.mark.slow
def test_quiet_prints_the_summary_alone(project):
    done = cli(project, "run", "tasks/reply_to_dana.json", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    run_id = run_id_of(done)
    assert "  verification sent: 1.000" in done.stdout.splitlines()
    assert f"      run:    http://127.0.0.1:3000/runs/{run_id}" in done.stdout.splitlines()
    both = cli(project, "run", "tasks/reply_to_dana.json", "-q", "-v")
    assert (both.returncode, both.stderr) == (2, "error: --verbose and --quiet: choose one\n")


def test_a_dataset_run_s_lines_count_its_rows_as_its_results_do(project, tickets):
    done, out = tickets
    assert done.returncode == 1, done.stdout + done.stderr  # a row failed, one errored
    assert not DEBUG_LINE.search(done.stdout + done.stderr)
    first, *progress = done.stderr.splitlines()
    run_id = re.fullmatch(r"tickets: run (\S+) started, 4 rows", first).group(1)
    assert all(ROWS_LINE.match(line) for line in progress), done.stderr
    counts = [tuple(map(int, ROWS_LINE.match(line).groups()[:5])) for line in progress]
    assert counts and all(d == p + f + e and pct == 100 * d // 4 for d, pct, p, f, e in counts), done.stderr
    assert [c[0] for c in counts] == sorted(c[0] for c in counts), done.stderr  # rows done only go up
    summary = json.loads((out / "run.json").read_text())
    final = (summary["tasks_succeeded"], summary["tasks_failed"], summary["tasks_error"])
    assert counts[-1] == (4, 100, *final) == (4, 100, 2, 1, 1), done.stderr
    assert progress[-1].endswith("; SUCCESS"), done.stderr  # the Dagster run succeeded: a wrong label is not a failed step
    with instance_of(project) as instance:
        outcomes = {r.asset_materialization.partition: r.asset_materialization.metadata["outcome"].value
                    for r in instance.get_records_for_run(
                        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
                    if r.asset_materialization.asset_key == dg.AssetKey(["results", "tickets"])}
    statuses = {r["task_id"]: r["status"] for r in summary["task_results"]}
    assert {f"tickets/{row}": outcome for row, outcome in outcomes.items()} == {
        task: {"SUCCESS": "passed", "FAILURE": "failed", "ERROR": "errored"}[status] for task, status in statuses.items()}
    stdout = done.stdout.splitlines()
    assert "    tickets: SUCCESS, 4 rows: 2 passed, 1 failed, 1 errored" in stdout
    assert f"      run:    http://127.0.0.1:3000/runs/{run_id}" in stdout
    assert f"  view:    agentenv-dagster view {out}" in stdout
    (first,) = [i for i, line in enumerate(stdout) if line.startswith("    assets: ")]
    assets = [line.split()[-1] for line in stdout[first:]]
    assert assets == sorted(assets) and "http://127.0.0.1:3000/assets/verifications/tickets/success_criteria" in assets


def test_each_verification_links_its_row_s_page(project, tickets):
    done, out = tickets
    run_id = re.match(r"tickets: run (\S+) started", done.stderr).group(1)
    with instance_of(project) as instance:
        verifications = [r.asset_materialization for r in instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
            if r.asset_materialization.asset_key.path[0] == "verifications"]
    assert sorted(m.partition for m in verifications) == ["t1", "t2", "t3", "t4"]
    for materialization in verifications:
        link = materialization.metadata["row_page"]
        assert isinstance(link, dg.UrlMetadataValue)
        assert link.value == row_page_url(out, f"tickets/{materialization.partition}")
        page = Path(unquote(urlparse(link.value).path))
        assert page.is_file() and "<html" in page.read_text()[:200].lower()


@pytest.mark.slow
def test_on_a_terminal_the_live_display_shows_the_rows_then_leaves_the_summary(project, tmp_path):
    out = tmp_path / "out"
    shown, code = under_a_terminal(project, "run", "tasks/tickets.yaml", "--output-dir", str(out))
    assert code == 1, shown
    assert "\x1b[?25l" in shown and "\x1b[2K" in shown  # the cursor hidden, lines redrawn: a live display
    text = ANSI.sub("", shown)
    final = max(m.start() for m in re.finditer(r"tickets ━+ 4/4 rows 2 passed 1 failed 1 errored", text))
    summary = text.index("    tickets: SUCCESS, 4 rows: 2 passed, 1 failed, 1 errored")
    assert final < text.index("+ tickets/t1: SUCCESS") < summary < text.index("      run:    http://127.0.0.1:3000/runs/")
    assert not DEBUG_LINE.search(text)


def under_a_terminal(project: Path, *args: str, deadline: float = 300) -> tuple[str, int]:
    """``agentenv-dagster ARGS`` with a pseudo-terminal as its stdin, stdout and stderr: all it
    wrote there, and its exit code."""
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "TERM": "xterm-256color",
           "COLUMNS": "160", "LINES": "40"}
    for name in ("ANTHROPIC_API_KEY", "AGENTENV_UI_URL", "NO_COLOR"):
        env.pop(name, None)
    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=env,
                               stdin=terminal, stdout=terminal, stderr=terminal)
    os.close(terminal)
    written = bytearray()
    ends = time.monotonic() + deadline
    try:
        while time.monotonic() < ends:
            ready, _, _ = select.select([controller], [], [], 1.0)
            if not ready:
                if process.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal's last writer is gone
                break
            if not chunk:
                break
            written += chunk
        else:
            process.kill()
        return written.decode(errors="replace"), process.wait(timeout=60)
    finally:
        os.close(controller)
