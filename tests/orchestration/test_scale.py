"""A large task folder loads: the lazy code location builds only the job a process runs,
``dagster definitions validate`` passes on hundreds of tasks, and the snapshot the webserver
loads stays close to that of the same jobs written by hand (sizes, never seconds)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import dagster as dg
import pytest

from agentenv_dagster import build_repository
from agentenv_dagster.orchestration.dagster_internals import job_snapshot_bytes, repository_snapshot_bytes
from projects import REPO, default_steps, make_project

COUNTING_TRANSLATOR = textwrap.dedent('''
    import os
    from agentenv_dagster.orchestration.translator import TaskTranslator

    class CountingTranslator(TaskTranslator):
        """Notes each job built, with the building process."""

        def get_job_description(self, plan):
            with open(os.environ["AGENTENV_BUILD_LOG"], "a") as log:
                log.write(f"{os.getpid()} {plan.task_id}\\n")
            return super().get_job_description(plan)
''')
COUNTING_DEFINITIONS = textwrap.dedent('''
    from pathlib import Path
    from agentenv_dagster import build_repository
    from counting import CountingTranslator

    defs = build_repository(Path(__file__).parent / "tasks", translator=CountingTranslator())
''')


def many_tasks(count: int) -> dict[str, object]:
    steps = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())
    return {f"task_{i:04d}.json": {"id": f"task_{i:04d}", "type": "task", "version": 1, "steps": steps}
            for i in range(count)}


def snapshot_bytes(repo: dg.RepositoryDefinition) -> int:
    """What the code server sends the webserver: the repository, then each job."""
    return repository_snapshot_bytes(repo) + sum(job_snapshot_bytes(j) for j in repo.get_all_jobs())


@pytest.mark.slow
def test_dagster_definitions_validate_passes_on_300_tasks(tmp_path):
    project = make_project(tmp_path / "p", tasks=many_tasks(300))
    shutil.copy(REPO / "definitions.py", project / "definitions.py")
    shutil.copy(REPO / "workspace.yaml", project / "workspace.yaml")
    (project / ".dagster_home").mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PYTHONPATH": str(project)}
    done = subprocess.run([sys.executable, "-m", "dagster", "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "All code locations passed validation" in done.stderr + done.stdout


def hand_built_jobs(count: int, steps: list[dict]) -> dg.Definitions:
    """The same tasks written the usual Dagster way: an op per step, the full step fields
    (every default spelled out, as the location used to carry them) as default config."""
    def one(i: int) -> dg.JobDefinition:
        ops = {}
        for step in steps:
            @dg.op(name=f"t{i}_{step['id']}", ins={"upstream": dg.In(list, default_value=[])},
                   config_schema={"step": dg.Field(dg.Permissive())})
            def _op(context, upstream):
                return []

            ops[step["id"]] = _op

        @dg.job(name=f"hand_{i}", config={"ops": {f"t{i}_{s['id']}": {"config": {"step": s}} for s in steps}})
        def _job():
            done = {}
            for step in steps:
                done[step["id"]] = ops[step["id"]](upstream=[done[d] for d in step["depends_on"]])

        return _job

    return dg.Definitions(jobs=[one(i) for i in range(count)])


def test_the_snapshot_of_many_tasks_stays_near_hand_built_jobs(tmp_path):
    """Per task, the location sends its job, the assets its graph backs (with their
    lineage), their checks and suite: within two and a half times hand-built op jobs that
    have none of it (a 1,000-task location stays far under Dagster's 100 MB message limit).
    The step config is what the task sets, not every default (which the jobs below spell
    out)."""
    count = 40
    root = make_project(tmp_path / "p", tasks=many_tasks(count))
    repo = build_repository(root / "tasks")
    ours = snapshot_bytes(repo)
    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config

    plan = load_plan(REPO / "tasks" / "reply_to_dana.json", load_config(root))
    full_steps = [s.model_dump(mode="json", exclude_none=True, by_alias=True) for s in plan.steps]
    theirs = snapshot_bytes(hand_built_jobs(count, full_steps).get_repository_def())
    assert ours < 2.5 * theirs, (ours, theirs)
    # the default config holds the fields the task sets, not the defaults of every field
    step = default_steps(repo.get_job("task_0000"))["collect"]
    assert step["agent_name"] == "assistant" and "artifact_paths" not in step
