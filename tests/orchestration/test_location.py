"""The lazy code location: a process that asks for one job builds that task alone, the same
job the whole location has; everything else loads the whole folder, once."""

from __future__ import annotations

import json

import dagster as dg

from agentenv_dagster import build_definitions, build_repository
from agentenv_dagster.orchestration import definitions
from agentenv_dagster.orchestration.dagster_internals import location_job
from agentenv_dagster.orchestration.location import declared_task_id
from agentenv_dagster.orchestration.translator import TaskTranslator
from projects import REPO, make_project

STEPS = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())


def stored(task_id: str) -> dict:
    return {"id": task_id, "type": "task", "version": 1, "steps": STEPS}


def counting_builds(monkeypatch) -> list[str]:
    built: list[str] = []
    real = definitions.build_task  # what builds a task's job, alone or in the whole location
    monkeypatch.setattr(definitions, "build_task", lambda plan, *a, **k: built.append(plan.task_id) or real(plan, *a, **k))
    return built


def test_a_lazy_location_builds_only_the_job_asked_for(tmp_path, monkeypatch):
    root = make_project(tmp_path / "p", tasks={**{f"t{i}.json": stored(f"task_{i}") for i in range(6)},
                                               "broken.json": "[{]"})
    built = counting_builds(monkeypatch)
    repo = build_repository(root / "tasks")
    assert built == []  # importing the location compiles nothing
    job = repo.get_job("task_3")
    assert built == ["task_3"] and repo.has_job("task_3") and repo.get_job("task_3") is job
    eager = build_definitions(root / "tasks").get_repository_def().get_job("task_3")
    assert job.get_job_snapshot_id() == eager.get_job_snapshot_id()
    assert set(job.resource_defs) == set(eager.resource_defs) and job.executor_def.name == eager.executor_def.name
    built.clear()
    # a name no task file compiles to: the whole location answers (a broken file's placeholder)
    assert repo.get_job("broken__invalid").tags["agentenv/invalid"] == "true"
    assert {"task_0", "task_5", "broken__invalid"} <= set(repo.job_names)
    assert repo.get_sensor_def("agentenv_task_files")
    assert dg.AssetKey(["verifications", "task_2", "sent"]) in repo.asset_graph.get_all_asset_keys()


def test_a_process_loading_the_workspace_for_one_job_builds_that_job_only(tmp_path, monkeypatch):
    """What a run worker and the CLI's ``run`` do: load ``definitions.py`` and ask for a job by name."""
    root = make_project(tmp_path / "p", tasks={f"t{i}.json": stored(f"task_{i}") for i in range(4)})
    for name in ("definitions.py", "workspace.yaml"):
        (root / name).write_text((REPO / name).read_text())
    built = counting_builds(monkeypatch)
    found = location_job(str(root / "workspace.yaml"), "task_2")
    assert found.job_def.name == "task_2" and built == ["task_2"]


def test_of_two_files_with_one_id_the_job_is_the_one_the_location_keeps(tmp_path, monkeypatch):
    tasks = {"a_broken.json": {"id": "same", "type": "task", "steps": [{"id": "x", "type": "nope"}]},
             "b.json": stored("same"), "c.json": stored("same")}
    root = make_project(tmp_path / "p", tasks=tasks)
    job = build_repository(root / "tasks").get_job("same")
    assert "b.json" in job.description  # a file that does not compile does not claim the name
    eager = build_definitions(root / "tasks").get_repository_def().get_job("same")
    assert job.get_job_snapshot_id() == eager.get_job_snapshot_id()


def test_a_custom_job_naming_loads_the_whole_location(tmp_path, monkeypatch):
    class Prefixed(TaskTranslator):
        def get_job_name(self, plan):
            return f"eval_{super().get_job_name(plan)}"

    root = make_project(tmp_path / "p", tasks={f"t{i}.json": stored(f"task_{i}") for i in range(3)})
    built = counting_builds(monkeypatch)
    repo = build_repository(root / "tasks", translator=Prefixed())
    assert repo.get_job("eval_task_1").name == "eval_task_1"
    assert sorted(built) == ["task_0", "task_1", "task_2"]


def test_the_declared_id_is_read_as_the_compiler_reads_it(tmp_path):
    (tmp_path / "stored.json").write_text(json.dumps(stored("refund-1")))
    (tmp_path / "plain.json").write_text(json.dumps(STEPS))
    (tmp_path / "ce.yaml").write_text("task_id: hello-python\nsuccess_criteria: []\n")
    (tmp_path / "bad.json").write_text("{")
    assert declared_task_id(tmp_path / "stored.json") == "refund-1"
    assert declared_task_id(tmp_path / "ce.yaml") == "hello-python"
    assert declared_task_id(tmp_path / "plain.json") is None  # its stem names the task
    assert declared_task_id(tmp_path / "bad.json") is None  # the compiler says why
