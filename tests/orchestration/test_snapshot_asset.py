"""snapshot_env through Dagster: a snapshot that names its universe materializes that
universe's asset, ``["artifacts", <snapshot_id>]``, downstream of the universe the run loaded;
a task loading the snapshot has it upstream, and the load round-trips."""

from __future__ import annotations

import dagster as dg
import pytest

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
    {"id": "grade", "type": "verify_mcp_tool_schema", "env_id": "email", "verifier_id": "still_there"},
]
UNNAMED = [
    {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "inbox", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox"},
    {"id": "snap", "type": "snapshot_env", "env_id": "email"},
]


def artifact(*path: str) -> dg.AssetKey:
    return dg.AssetKey(["artifacts", *path])


def test_the_lineage_reads_loaded_universe_then_snapshot_then_the_task_that_loads_it(tmp_path):
    project = make_project(tmp_path / "p", tasks={"snapshot.json": SNAPSHOT, "reload.json": RELOAD,
                                                  "unnamed.json": UNNAMED})
    graph = build_definitions(project / "tasks").resolve_asset_graph()

    assert graph.get(artifact("inbox_after")).parent_keys == {artifact("inbox")}
    assert graph.get(artifact("inbox_again")).parent_keys == {artifact("inbox_after")}  # reload's own load
    assert artifact("inbox_after") in graph.get(dg.AssetKey(["verifications", "reload", "still_there"])).parent_keys
    # a named universe is the snapshot's only asset; an unnamed one (a per-run id) stays task-scoped
    assert not graph.has(artifact("snapshot", "snap"))
    assert graph.get(artifact("unnamed", "snap")).parent_keys == {artifact("inbox")}


@pytest.mark.slow
def test_a_run_materializes_the_universe_version_and_the_reload_observes_it(tmp_path):
    project = make_project(tmp_path / "p", tasks={"snapshot.json": SNAPSHOT, "reload.json": RELOAD})
    defs = build_definitions(project / "tasks")
    with dg.instance_for_test() as instance:
        for _ in range(2):  # every snapshot is a new version of the one universe
            assert defs.resolve_job_def("snapshot").execute_in_process(instance=instance).success
        events = instance.fetch_materializations(artifact("inbox_after"), limit=10, ascending=True).records
        assert [{k: v.value for k, v in e.asset_materialization.metadata.items()} for e in events] == [
            {"version": 1, "written_by_step": "snap"}, {"version": 2, "written_by_step": "snap"},
        ]
        assert instance.fetch_materializations(artifact("snapshot", "snap"), limit=1).records == []

        reload = defs.resolve_job_def("reload").execute_in_process(instance=instance)
        assert reload.success
        [seen] = instance.fetch_observations(artifact("inbox_after"), limit=10).records
        assert seen.run_id == reload.run_id
        assert {k: v.value for k, v in seen.asset_observation.metadata.items()} == {"loaded_by_step": "load", "version": 2}
        verification = instance.get_latest_materialization_event(dg.AssetKey(["verifications", "reload", "still_there"]))
        assert verification.asset_materialization.metadata["passed"].value is True
    store = artifact_store(load_config(project))
    before, after = store.get("inbox_after", 2), store.get("inbox_again", 1)
    assert sorted(before.files) == sorted(after.files)
    assert all(before.files[name].read_bytes() == after.files[name].read_bytes() for name in before.files)
    assert leaked_servers(project / ".agentenv" / "state") == []


def test_a_universe_written_back_to_what_was_loaded_adds_versions_not_a_cycle(tmp_path, caplog):
    refresh = [*SNAPSHOT[:2], {**SNAPSHOT[2], "snapshot_id": "inbox"}]
    there = [*SNAPSHOT[:1], {**SNAPSHOT[1], "artifact_id": "x"}, {**SNAPSHOT[2], "snapshot_id": "y"}]
    back = [*SNAPSHOT[:1], {**SNAPSHOT[1], "artifact_id": "y"}, {**SNAPSHOT[2], "snapshot_id": "x"}]
    project = make_project(tmp_path / "p", tasks={"refresh.json": refresh, "there.json": there, "back.json": back})
    graph = build_definitions(project / "tasks").resolve_asset_graph()

    assert graph.get(artifact("inbox")).parent_keys == set()
    # y -> x -> y would be a cycle: the edge that closes it (in id order) is left out, said so
    assert (graph.get(artifact("x")).parent_keys, graph.get(artifact("y")).parent_keys) == ({artifact("y")}, set())
    assert "left out artifact 'x' -> 'y', which would close a cycle" in caplog.text
    assert graph.toposorted_asset_keys
