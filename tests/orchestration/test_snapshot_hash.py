"""A task job's snapshot id hashed from the parts task jobs share is the id Dagster hashes
from the job itself, for every task of this repo and of the upstream corpus."""

from __future__ import annotations

import shutil

from dagster._core.snap import JobSnap
from dagster._serdes import create_snapshot_id

from agentenv_dagster import build_repository
from agentenv_dagster.orchestration.snapshot_hash import SnapshotHasher
from agentenv_dagster.orchestration.snapshot_ids import TaskJob
from projects import SHARED, make_project


def test_every_task_job_hashes_to_dagsters_own_id(tmp_path):
    root = make_project(tmp_path / "p")
    shutil.copytree(SHARED / "corpus", root / "tasks" / "corpus")
    repo = build_repository(root / "tasks")
    jobs = [job for job in repo.get_all_jobs() if isinstance(job, TaskJob)]
    assert len(jobs) > 50
    assert {job.config_mapping is None for job in jobs} == {True, False}  # dataset partitions, step defaults

    hasher = SnapshotHasher()
    ids = {job.name: hasher.snapshot_id(job) for job in jobs}
    assert hasher.trusted
    assert ids == {job.name: create_snapshot_id(JobSnap.from_job_def(job)) for job in jobs}
