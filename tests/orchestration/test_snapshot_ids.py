"""A reload of the code location answers the webserver's job list with the snapshot ids the
last load hashed, building snapshots only for tasks that changed, and every id it answers is
the one Dagster would have hashed."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from dagster._core.remote_representation.external_data import JobDataSnap, RepositorySnap
from dagster._core.remote_representation.job_index import JobIndex
from dagster._core.snap import JobSnap

from agentenv_dagster import build_repository
from projects import SHARED, make_project

CORPUS = SHARED / "corpus" / "coder_eval"


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p")
    for path in sorted(CORPUS.rglob("*.yaml"))[:40]:  # datasets, sandboxes, criteria of every kind
        shutil.copy(path, root / "tasks" / f"corpus_{path.parent.name}_{path.name}")
    return root


class SnapshotsBuilt:
    """Counts the job snapshots Dagster builds (it builds one to hash a job's id)."""

    def __init__(self, monkeypatch):
        self.jobs: list[str] = []
        original = JobSnap.from_job_def.__func__

        def counting(cls, job_def):
            self.jobs.append(job_def.name)
            return original(cls, job_def)

        monkeypatch.setattr(JobSnap, "from_job_def", classmethod(counting))


def load(root):
    """What the code server sends first: each job's name and snapshot id."""
    repo = build_repository(root / "tasks")
    repo.load_all_definitions()
    return repo, {ref.name: ref.snapshot_id for ref in RepositorySnap.from_def(repo, defer_snapshots=True).job_refs}


def is_task_job(name: str) -> bool:
    """Not Dagster's asset job, nor the placeholder of a file that does not compile (hashed
    on every load: they are few, and say what to fix)."""
    return not name.startswith("__") and not name.endswith("__invalid")


def hashed(repo) -> dict[str, str]:
    """The ids Dagster hashes from each job's snapshot."""
    return {job.name: JobIndex(JobSnap.from_job_def(job), None).job_snapshot_id for job in repo.get_all_jobs()}


def test_a_reload_answers_the_ids_of_the_last_load_without_building_snapshots(project, monkeypatch):
    _, first = load(project)
    built = SnapshotsBuilt(monkeypatch)
    repo, again = load(project)
    task_jobs = [name for name in again if is_task_job(name)]
    assert len(task_jobs) > 20
    assert again == first
    assert not set(built.jobs) & set(task_jobs)
    assert again == hashed(repo)


def test_a_changed_task_is_hashed_again_and_only_it(project, monkeypatch):
    load(project)
    path = project / "tasks" / "reply_to_dana.json"
    document = json.loads(path.read_text())
    prompt = next(step for step in document if step["type"] == "prompt_agent")
    prompt["prompt"] += " Sign it 'Sam'."
    path.write_text(json.dumps(document))
    built = SnapshotsBuilt(monkeypatch)
    repo, ids = load(project)
    assert [name for name in built.jobs if is_task_job(name)] == ["reply_to_dana"]
    assert ids == hashed(repo)


def test_a_wrong_remembered_id_is_forgotten_once_the_snapshot_is_built(project, caplog):
    _, first = load(project)
    (saved,) = (project / ".agentenv" / "state" / "snapshot_ids").glob("*.json")
    data = json.loads(saved.read_text())
    key = next(k for k, v in data["ids"].items() if v == first["reply_to_dana"])
    data["ids"][key] = "0" * 40
    saved.write_text(json.dumps(data))

    repo, ids = load(project)
    assert ids["reply_to_dana"] == "0" * 40  # what a stale file would make the webserver show
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        JobDataSnap.from_job_def(repo.get_job("reply_to_dana"), include_parent_snapshot=True)  # the job is opened
    assert "job 'reply_to_dana': remembered snapshot id 0000" in caplog.text
    assert key not in json.loads(saved.read_text())["ids"]
    _, fixed = load(project)
    assert fixed == first


def test_an_unreadable_file_means_hashing_every_job(project):
    _, first = load(project)
    (saved,) = (project / ".agentenv" / "state" / "snapshot_ids").glob("*.json")
    saved.write_text("{not json")
    repo, ids = load(project)
    assert ids == first == hashed(repo)
    assert json.loads(saved.read_text())["ids"]  # written again
