"""Real runs for the tests of the row pages, the viewer and JUnit: the CLI on the tasks of
tests/fixtures/viewer, offline (replay agents; the judge on the fake Messages API)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fakes.messages_api import FakeMessagesAPI, tool_use_reply
from projects import FIXTURES, leaked_servers, make_project

VIEWER_FIXTURES = FIXTURES / "viewer"
RATIONALE = "label.txt holds one word, a category."
FINDING = "a single allowed word"
PRICES = "[model.prices.claude-test]\ninput = 3.0\noutput = 15.0\n"


@dataclass(frozen=True)
class Run:
    out: Path  # the reports
    junit: Path
    done: subprocess.CompletedProcess


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    """``agentenv-dagster ARGS`` in the project, with no API key from this machine."""
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    env["DAGSTER_HOME"] = str(project / ".dagster_home")
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def ticket_experiment(root: Path) -> Run:
    """tickets.yaml under tickets_experiment.yaml: two variants x four rows, one failing in the
    first variant only, one erroring in both; the judge passes every row it grades."""
    with FakeMessagesAPI() as api:
        verdict = {"score": 0.9, "rationale": RATIONALE, "findings": [FINDING]}
        api.enqueue(*[tool_use_reply("submit_verdict", verdict, usage=(200, 40)) for _ in range(8)])
        project = make_project(root / "project", tasks={"tickets.yaml": (VIEWER_FIXTURES / "tickets.yaml").read_text()},
                               model={"api_key": "sk-test", "base_url": api.base_url, "default": "claude-test"},
                               extra_config=PRICES)
        (project / "experiments").mkdir()
        shutil.copy(VIEWER_FIXTURES / "tickets_experiment.yaml", project / "experiments")
        out, junit = root / "out", root / "ci" / "junit.xml"
        done = cli(project, "run", "tasks/tickets.yaml", "--experiment", "experiments/tickets_experiment.yaml",
                   "--output-dir", str(out), "--junit", str(junit))
    assert leaked_servers(project / ".agentenv" / "state") == []
    return Run(out, junit, done)


def unjudged(root: Path) -> Run:
    """unjudged.yaml with no judge configured: its judge criterion is not graded."""
    project = make_project(root / "project", tasks={"unjudged.yaml": (VIEWER_FIXTURES / "unjudged.yaml").read_text()})
    out, junit = root / "out", root / "junit.xml"
    done = cli(project, "run", "tasks/unjudged.yaml", "--output-dir", str(out), "--junit", str(junit))
    return Run(out, junit, done)
