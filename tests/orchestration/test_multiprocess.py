"""The real `dagster` CLI on the project's code location, under the multiprocess executor."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from projects import REPO, leaked_servers, make_project, node_of, stream_rows

SLEEP_STEP = textwrap.dedent('''
    import asyncio, time
    from agentenv_dagster.steps.base import TaskStep

    class SleepStep(TaskStep):
        """A custom step type (``[task_steps] impls``) that sleeps and notes when."""
        type_name = "sleep"
        seconds: float = 1.0

        async def execute(self, ctx, rt):
            started = time.time()
            await asyncio.sleep(self.seconds)
            ctx.metadata_map("sleeps")[self.id] = [started, time.time()]
''')


def dagster(project, *args, timeout=300):
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PYTHONPATH": str(project)}
    (project / ".dagster_home").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "dagster", *args], cwd=project, env=env,
        capture_output=True, text=True, timeout=timeout,
    )


def run_contexts(project):
    (run_dir,) = (project / ".agentenv" / "state" / "runs").iterdir()
    return {node_of(p.stem): stream_rows(run_dir, p.stem)[""] for p in (run_dir / "context").glob("*.jsonl")}


@pytest.mark.slow
def test_independent_branches_overlap_under_the_multiprocess_executor(tmp_path):
    project = make_project(tmp_path / "p", extra_config='[task_steps]\nimpls = ["slow_steps:SleepStep"]\n', tasks={
        "overlap.json": [
            {"id": "left", "type": "sleep", "seconds": 3, "depends_on": []},
            {"id": "right", "type": "sleep", "seconds": 3, "depends_on": []},
            {"id": "join", "type": "sleep", "seconds": 0},
        ]})
    (project / "slow_steps.py").write_text(SLEEP_STEP)
    shutil.copy(REPO / "definitions.py", project / "definitions.py")
    done = dagster(project, "job", "execute", "-f", "definitions.py", "-j", "overlap")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sleeps = run_contexts(project)["join"]["metadata"]["sleeps"]
    (l_start, l_end), (r_start, r_end) = sleeps["left"], sleeps["right"]
    assert max(l_start, r_start) < min(l_end, r_end), f"branches ran one after the other: {sleeps}"
    assert sleeps["join"][0] >= max(l_end, r_end)  # null depends_on waits for every earlier step


@pytest.mark.slow
def test_dagster_cli_validates_and_executes_reply_to_dana(tmp_path):
    project = make_project(tmp_path / "p")
    shutil.copy(REPO / "definitions.py", project / "definitions.py")
    shutil.copy(REPO / "workspace.yaml", project / "workspace.yaml")
    validated = dagster(project, "definitions", "validate", "-w", "workspace.yaml")
    assert validated.returncode == 0, validated.stderr[-3000:]
    assert "All code locations passed validation" in validated.stderr + validated.stdout
    done = dagster(project, "job", "execute", "-f", "definitions.py", "-j", "reply_to_dana")
    assert done.returncode == 0, done.stderr[-3000:]
    final = run_contexts(project)["teardown_run"]
    assert final["metadata"]["verifications"]["sent"]["score"] == 1.0
    assert final["metadata"]["collected_artifacts"]["collect"]["artifacts"]
    assert leaked_servers(project / ".agentenv" / "state") == []


@pytest.mark.slow
def test_the_dg_cli_checks_the_location_and_launches_a_dataset_row(tmp_path):
    """`dg` (dagster-dg-cli), which supersedes `dagster definitions validate` / `job execute`:
    the project's `[tool.dg]` names the root definitions.py, and a row launched by its
    partition alone runs with that partition's steps."""
    project = make_project(tmp_path / "p")
    shutil.copy(REPO / "definitions.py", project / "definitions.py")
    (project / "evals").mkdir()  # dg wants a package of the project's own: an empty one will do
    (project / "evals" / "__init__.py").write_text("")
    (project / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "evals"
        version = "0"

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "evals"
        defs_module = "evals"
        code_location_target_module = "definitions"
    """))
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PYTHONPATH": str(project)}
    (project / ".dagster_home").mkdir()
    dg = shutil.which("dg", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))

    def run(*args):
        return subprocess.run([dg, *args], cwd=project, env=env, capture_output=True, text=True, timeout=300)

    checked = run("check", "defs")
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-3000:]
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    launched = run("launch", "--job", "triage_tickets", "--partition", "t3")
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "RUN_SUCCESS" in launched.stderr + launched.stdout
    (run_dir,) = (project / ".agentenv" / "state" / "runs").iterdir()
    final = stream_rows(run_dir, "teardown_run")
    assert list(final) == ["t3"] and final["t3"]["metadata"]["verifications"]["success_criteria"]["score"] == 1.0
    assert leaked_servers(project / ".agentenv" / "state") == []
