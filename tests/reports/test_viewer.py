"""``agentenv-dagster view [OUT_DIR]``: the CLI serves a real run's reports on 127.0.0.1, and
they are fetched over HTTP."""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from projects import make_project

from agentenv_dagster.reports.render import page_policy, row_page_url

pytestmark = pytest.mark.xdist_group("viewer_runs")
SERVING = "Serving {folder} at {url} (Ctrl-C to stop)\n"


@contextlib.contextmanager
def viewing(*args: str, cwd: Path | None = None):
    """``agentenv-dagster view ARGS`` running; yields it and the URL it printed. Ended with
    SIGINT (Ctrl-C) when the test is done with it, killed if it outlives that."""
    process = subprocess.Popen([sys.executable, "-m", "agentenv_dagster.cli", "view", *args], cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline() if ready else ""
        assert line.startswith("Serving "), line + process.stderr.read() if process.poll() is not None else line
        yield process, line.split(" at ", 1)[1].split(" ", 1)[0], line
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()


def test_view_serves_the_run_and_each_row_s_page_until_ctrl_c(ticket_run):
    with viewing(str(ticket_run.out)) as (process, url, line):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/")
        assert line == SERVING.format(folder=ticket_run.out, url=url)
        with httpx.Client(timeout=10) as client:
            home = client.get(url)
            assert (home.status_code, home.headers["location"]) == (302, "/task.html")
            page = client.get(url + "task.html")
            assert page.status_code == 200 and page.headers["content-type"] == "text/html"
            assert page.headers["content-security-policy"] == f"{page_policy()}; frame-ancestors 'none'"
            assert page.headers["x-content-type-options"] == "nosniff"
            assert page.text == (ticket_run.out / "task.html").read_text()
            row = client.get(row_page_url(ticket_run.out, "tickets/t2", "as-is", base_url=url))
            assert row.status_code == 200 and "<title>tickets/t2 · as-is · #00 — SUCCESS</title>" in row.text
            assert "&lt;script&gt;document.title" in row.text
            record = client.get(row_page_url(ticket_run.out, "tickets/t2", "as-is", base_url=url).replace(
                "row.html", "task.json"))
            assert record.headers["content-type"] == "application/json; charset=utf-8"
            assert record.json()["task_id"] == "tickets/t2"
            transcript = client.get(url + "as-is/tickets/t2/00/judge-1.yaml")
            assert transcript.headers["content-type"] == "text/plain; charset=utf-8"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=10) == 0
        assert process.stdout.read() == "stopped\n"


def test_view_serves_nothing_outside_its_folder_and_only_under_its_own_name(tmp_path):
    out, secret = tmp_path / "out", tmp_path / "secret.txt"
    out.mkdir()
    secret.write_text("not for the browser")
    (out / "task.html").write_text("<!doctype html><title>run</title>")
    (out / "link.txt").symlink_to(secret)
    with viewing(str(out)) as (_, url, _), httpx.Client(timeout=10) as client:
        assert client.get(url + "task.html").status_code == 200
        assert client.get(url + "link.txt").status_code == 404
        port = url.rsplit(":", 1)[1].rstrip("/")
        with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as raw:
            raw.sendall(b"GET /../secret.txt HTTP/1.0\r\nHost: 127.0.0.1:" + port.encode() + b"\r\n\r\n")
            answer = b"".join(iter(lambda: raw.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.0 404") and b"not for the browser" not in answer
        rebound = client.get(url + "task.html", headers={"Host": f"attacker.example:{port}"})
        assert rebound.status_code == 403 and "Unexpected Host header" in rebound.text


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_view_listens_on_the_port_asked_for_and_says_when_it_cannot(tmp_path):
    port = free_port()
    with viewing(str(tmp_path), "--port", str(port)) as (_, url, _):
        assert url == f"http://127.0.0.1:{port}/"
        busy = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "view", str(tmp_path), "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert busy.returncode == 2
    assert busy.stderr == f"error: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_view_defaults_to_the_project_s_out_folder_and_refuses_a_missing_one(tmp_path):
    project = make_project(tmp_path / "project", tasks={})
    (project / "out" / "hello_python").mkdir(parents=True)
    with viewing(cwd=project) as (_, url, line), httpx.Client(timeout=10) as client:
        assert line == SERVING.format(folder=project / "out", url=url)
        assert 'href="hello_python/"' in client.get(url).text  # no task.html here: the runs are listed
    missing = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "view", str(tmp_path / "nowhere")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2
    assert missing.stderr == f"error: {tmp_path / 'nowhere'}: no such folder (give the --output-dir of a run)\n"
