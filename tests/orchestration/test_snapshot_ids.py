"""A reload of the code location answers the webserver's job list with the snapshot ids the
last load hashed, building snapshots only for tasks that changed, and every id it answers is
the one Dagster would have hashed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from dagster._core.remote_representation.external_data import JobDataSnap, RepositorySnap
from dagster._core.remote_representation.job_index import JobIndex
from dagster._core.snap import JobSnap
from dagster._record import copy
from dagster._serdes import serialize_value

from agentenv_dagster import build_repository
from agentenv_dagster.orchestration.snapshot_hash import SnapshotHasher
from agentenv_dagster.orchestration.translator import TaskTranslator
from projects import make_project
from snapshot_tasks import write_task_variants


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p")
    write_task_variants(root / "tasks")  # datasets, experiments' steps, criteria of several kinds
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


def load(root, translator: TaskTranslator | None = None):
    """What the code server sends first: each job's name and snapshot id."""
    repo = build_repository(root / "tasks", translator=translator)
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


def test_a_wrong_remembered_id_is_corrected_once_the_snapshot_is_built(project, caplog):
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
    assert json.loads(saved.read_text())["ids"][key] == first["reply_to_dana"]
    _, fixed = load(project)
    assert fixed == first


def test_a_first_load_builds_dagsters_snapshot_of_one_job_of_each_kind(project, monkeypatch):
    """The rest are hashed from the parts their snapshots share (``snapshot_hash``): one job
    whose config maps to step defaults and one dataset job check that against Dagster."""
    built = SnapshotsBuilt(monkeypatch)
    repo, ids = load(project)
    assert len([name for name in ids if is_task_job(name)]) > 20
    assert len([name for name in built.jobs if is_task_job(name)]) == 2
    assert ids == hashed(repo)


def test_the_snapshots_the_webserver_and_daemon_fetch_are_built_once_and_are_dagsters(project, monkeypatch):
    """Both fetch every job's snapshot as they load the location (``ExternalJob``)."""
    built = SnapshotsBuilt(monkeypatch)
    repo, _ = load(project)
    fetched = [{job.name: serialize_value(JobDataSnap.from_job_def(job, include_parent_snapshot=True).job)
                for job in repo.get_all_jobs() if is_task_job(job.name)} for _client in ("webserver", "daemon")]
    assert len([name for name in built.jobs if is_task_job(name)]) == 2  # the check of each kind
    assert fetched[0] == fetched[1]
    assert fetched[0] == {name: serialize_value(JobSnap.from_job_def(repo.get_job(name))) for name in fetched[0]}


def test_after_a_reload_both_fetches_at_once_build_each_snapshot_once(project, monkeypatch):
    load(project)
    repo, _ = load(project)  # every id remembered: the snapshots are built as they are fetched
    jobs = [job for job in repo.get_all_jobs() if is_task_job(job.name)]
    shared_parts, built = SnapshotHasher._snapshot, []
    monkeypatch.setattr(SnapshotHasher, "_snapshot", lambda self, job: built.append(job.name) or shared_parts(self, job))
    with ThreadPoolExecutor(8) as pool:  # the webserver's four threads and the daemon's, in the same order
        list(pool.map(lambda job: JobDataSnap.from_job_def(job, include_parent_snapshot=True), jobs + jobs))
    assert sorted(built) == sorted(job.name for job in jobs)


@pytest.mark.parametrize("upgrade", ["changed the snapshot", "changed a signature"])
def test_a_shortcut_an_upgrade_broke_hands_the_load_back_to_dagster(project, monkeypatch, caplog, upgrade):
    """As after a Dagster upgrade that changed what a job snapshot holds, or an internal the
    shortcut calls: one warning, and every id is Dagster's own."""
    shared_parts = SnapshotHasher._snapshot

    def upgraded(self, job):
        if upgrade == "changed a signature":
            raise TypeError("build_node_defs_snapshot() missing 1 required positional argument")
        return copy(shared_parts(self, job), description="an upgrade's new field")

    monkeypatch.setattr(SnapshotHasher, "_snapshot", upgraded)
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        repo, ids = load(project)
    assert caplog.text.count("the load builds every job's snapshot Dagster's way") == 1
    assert ids == hashed(repo)


class TaggingTranslator(TaskTranslator):
    def get_job_tags(self, plan):
        return {**super().get_job_tags(plan), "team": "evals"}


def test_two_locations_of_one_folder_keep_their_own_ids(project, monkeypatch):
    load(project)
    load(project, TaggingTranslator())
    assert len(list((project / ".agentenv" / "state" / "snapshot_ids").glob("*.json"))) == 2
    built = SnapshotsBuilt(monkeypatch)
    repo, ids = load(project)
    tagged_repo, tagged_ids = load(project, TaggingTranslator())
    assert not [name for name in built.jobs if is_task_job(name)]
    assert ids == hashed(repo) and tagged_ids == hashed(tagged_repo)
    assert ids["reply_to_dana"] != tagged_ids["reply_to_dana"]


def test_an_unreadable_file_means_hashing_every_job(project):
    _, first = load(project)
    (saved,) = (project / ".agentenv" / "state" / "snapshot_ids").glob("*.json")
    saved.write_text("{not json")
    repo, ids = load(project)
    assert ids == first == hashed(repo)
    assert json.loads(saved.read_text())["ids"]  # written again


RELOAD = """mutation { reloadRepositoryLocation(repositoryLocationName: "agentenv_tasks") {
  __typename ... on WorkspaceLocationEntry { loadStatus } } }"""
JOB_SNAPSHOT = """{ pipelineOrError(params: {repositoryLocationName: "agentenv_tasks",
  repositoryName: "__repository__", pipelineName: "reply_to_dana"}) { ... on Pipeline { pipelineSnapshotId } } }"""
RUN_SNAPSHOT = """query ($id: ID!) { runOrError(runId: $id) { ... on Run { pipelineSnapshotId } } }"""


@pytest.mark.slow
def test_after_the_uis_reload_a_launch_runs_the_snapshot_the_webserver_showed(tmp_path):
    """The UI's Reload starts a code server that answers from the remembered ids (it learns
    nothing new, so it leaves the file alone); a launch from it stores the job snapshot its
    run executes under the id the webserver listed, with no snapshot mismatch logged."""
    from dagster_graphql import DagsterGraphQLClient

    from agentenv_dagster.orchestration.execute import dagster_yaml
    from agentenv_dagster.runtime.processes import is_running, terminate
    from projects import REPO
    from test_dagster_dev import LAUNCHPAD_QUERY, free_port, launch_and_wait, wait_until

    project = make_project(tmp_path / "p")
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(REPO / name, project / name)
    (project / ".dagster_home").mkdir()
    (project / ".dagster_home" / "dagster.yaml").write_text(dagster_yaml(project / ".dagster_home"))
    port, log = free_port(), tmp_path / "dev.log"
    dev = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)], cwd=project,
        env={**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}, stdout=log.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)

        def listed() -> str | None:
            try:
                return client._execute(JOB_SNAPSHOT)["pipelineOrError"].get("pipelineSnapshotId")
            except Exception:  # the webserver or the location is not up yet
                return None

        first = wait_until(listed, 180, "the job list")
        (saved,) = wait_until(lambda: list((project / ".agentenv" / "state" / "snapshot_ids").glob("*.json")),
                              60, "the remembered ids")
        written = saved.stat().st_mtime_ns
        assert client._execute(RELOAD)["reloadRepositoryLocation"] == {
            "__typename": "WorkspaceLocationEntry", "loadStatus": "LOADED"}
        assert listed() == first
        prefilled = yaml.safe_load(client._execute(LAUNCHPAD_QUERY)["runConfigSchemaOrError"]["rootDefaultYaml"])
        run_id = launch_and_wait(client, "reply_to_dana", prefilled)
        run = client._execute(RUN_SNAPSHOT, {"id": run_id})["runOrError"]
        assert run["pipelineSnapshotId"] == first
        assert saved.stat().st_mtime_ns == written
    finally:
        terminate(dev.pid, grace_seconds=20)
        dev.wait(timeout=30)
    wait_until(lambda: not is_running(dev.pid), 30, "dagster dev to stop")
    assert "Snapshot mismatch" not in log.read_text()
