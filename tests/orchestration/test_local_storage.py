"""The project's local instance: Dagster's SQLite storage with a cheaper event log, the same
files and the same answers (runs, partitioned materializations, from a ref in another
process)."""

from __future__ import annotations

import subprocess
import sys

import dagster as dg
import sqlalchemy as db

from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.orchestration.sqlite_storage import LocalSqliteEventLogStorage

KEY = dg.AssetKey(["verifications", "t", "v"])


@dg.op
def grade(context):
    for row in ("r1", "r2", "r3"):
        yield dg.AssetMaterialization(asset_key=KEY, partition=row, metadata={"score": 0.5})
    yield dg.Output(None)


@dg.job
def graded():
    grade()


def test_the_local_instance_stores_and_answers_like_dagsters_sqlite(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    with dg.DagsterInstance.get() as instance:
        log = instance.event_log_storage
        assert isinstance(log, LocalSqliteEventLogStorage)
        result = graded.execute_in_process(instance=instance)
        assert result.success
        assert instance.get_materialized_partitions(KEY) == {"r1", "r2", "r3"}
        assert (tmp_path / "history" / "runs" / f"{result.run_id}.db").is_file()  # Dagster's own layout
        with log.index_connection() as conn:
            assert conn.execute(db.text("PRAGMA synchronous")).scalar() == 1  # NORMAL
            assert conn.execute(db.text("PRAGMA journal_mode")).scalar() == "wal"
        run_id = result.run_id
    # another process (a run worker, a shard) opens it from the same dagster.yaml
    probe = ("import dagster as dg; i = dg.DagsterInstance.get(); "
             f"print(len(i.all_logs('{run_id}')), sorted(i.get_materialized_partitions(dg.AssetKey(['verifications','t','v']))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={"DAGSTER_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    count, partitions = done.stdout.strip().split(" ", 1)
    assert int(count) > 3 and partitions == "['r1', 'r2', 'r3']"


def test_a_moved_project_instance_follows_its_folder(tmp_path, monkeypatch):
    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.execute import project_dagster_home

    old, new = tmp_path / "old" / ".dagster_home", tmp_path / "new" / ".dagster_home"
    new.mkdir(parents=True)
    (new / "dagster.yaml").write_text(dagster_yaml(old))  # as written before the project moved
    monkeypatch.setenv("DAGSTER_HOME", str(new))
    project_dagster_home(load_config(tmp_path))
    assert f"base_dir: {new.resolve()}" in (new / "dagster.yaml").read_text()
    (new / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # the user's own: kept
    project_dagster_home(load_config(tmp_path))
    assert (new / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
