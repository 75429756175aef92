"""snapshot_env through Dagster: the snapshotted universe is a materialization downstream of the
universe the run loaded, and loading it back into a fresh env round-trips."""

from __future__ import annotations

import dagster as dg

from agentenv_dagster import build_definitions
from agentenv_dagster.config import load_config
from agentenv_dagster.runtime.base import artifact_store
from projects import leaked_servers, make_project

SNAPSHOT = [
    {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "inbox", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox"},
    {"id": "snap", "type": "snapshot_env", "env_id": "email", "snapshot_id": "inbox_after"},
]
RELOAD = [
    {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "load", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox_after"},
    {"id": "snap", "type": "snapshot_env", "env_id": "email", "snapshot_id": "inbox_again"},
]


def test_a_snapshot_is_a_materialization_downstream_of_what_the_run_loaded(tmp_path):
    project = make_project(tmp_path / "p", tasks={"snapshot.json": SNAPSHOT, "reload.json": RELOAD})
    defs = build_definitions(project / "tasks")
    key = dg.AssetKey(["artifacts", "snapshot", "snap"])
    spec = defs.resolve_asset_graph().get(key)
    assert dg.AssetKey(["artifacts", "inbox"]) in spec.parent_keys  # loaded universe -> snapshot
    with dg.instance_for_test() as instance:
        assert defs.get_job_def("snapshot").execute_in_process(instance=instance).success
        metadata = instance.get_latest_materialization_event(key).asset_materialization.metadata
        assert (metadata["universe_id"].value, metadata["universe_version"].value) == ("inbox_after", 1)
        assert defs.get_job_def("reload").execute_in_process(instance=instance).success
    store = artifact_store(load_config(project))
    before, after = store.get("inbox_after", 1), store.get("inbox_again", 1)
    assert sorted(before.files) == sorted(after.files)
    assert all(before.files[name].read_bytes() == after.files[name].read_bytes() for name in before.files)
    assert leaked_servers(project / ".agentenv" / "state") == []
