"""A task job's snapshot built from the parts task jobs share is the one Dagster builds
from the job itself, and hashes to the same id, for every task of this repo and of the
upstream corpus."""

from __future__ import annotations

import shutil

import pytest
from dagster._core.snap import JobSnap
from dagster._serdes import create_snapshot_id, serialize_value

from agentenv_dagster import build_repository
from agentenv_dagster.orchestration.snapshot_hash import SnapshotHasher
from agentenv_dagster.orchestration.snapshot_ids import TaskJob
from projects import make_project
from snapshot_tasks import write_task_variants


@pytest.mark.parametrize("tasks", ["own", "upstream"])
def test_every_task_job_hashes_to_dagsters_own_id(tmp_path, tasks, request):
    root = make_project(tmp_path / "p")
    if tasks == "upstream":
        shutil.copytree(request.getfixturevalue("upstream_corpus"), root / "tasks" / "corpus")
    else:
        write_task_variants(root / "tasks")
    repo = build_repository(root / "tasks")
    jobs = [job for job in repo.get_all_jobs() if isinstance(job, TaskJob)]
    assert len(jobs) > 20
    assert {job.config_mapping is None for job in jobs} == {True, False}  # dataset partitions, step defaults

    hasher = SnapshotHasher()
    built = {job.name: hasher.snapshot(job) for job in jobs}
    assert hasher.trusted
    for job in jobs:
        snapshot, snapshot_id = built[job.name]
        dagsters = JobSnap.from_job_def(job)
        assert serialize_value(snapshot) == serialize_value(dagsters), job.name
        assert snapshot_id == create_snapshot_id(dagsters), job.name
