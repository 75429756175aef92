"""The project's local instance: Dagster's SQLite storage with a cheaper event log, the same
files and the same answers (runs, partitioned materializations, from a ref in another
process)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import dagster as dg
import sqlalchemy as db
from dagster._core.definitions.asset_checks.asset_check_evaluation import AssetCheckEvaluationTargetMaterializationData
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite import sqlite_run_storage
from dagster._core.storage.sql import check_alembic_revision, get_alembic_config
from dagster._utils.concurrency import ConcurrencySlotStatus

from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.orchestration.sqlite_storage import LocalSqliteEventLogStorage
from projects import in_forked_child

KEY = dg.AssetKey(["verifications", "t", "v"])
CHECK = dg.AssetCheckKey(KEY, "passed")
BURST = (dg.DagsterEventType.ASSET_MATERIALIZATION, dg.DagsterEventType.ASSET_CHECK_EVALUATION)


@dg.op
def grade(context):
    """What a dataset op yields: a materialization a row, then the row's check evaluation."""
    for row in ("r1", "r2", "r3"):
        yield dg.AssetMaterialization(asset_key=KEY, partition=row, metadata={"score": 0.5})
    for index, row in enumerate(("r1", "r2", "r3")):
        target = AssetCheckEvaluationTargetMaterializationData(storage_id=100 + index, run_id=context.run_id,
                                                               timestamp=0.0)
        yield dg.AssetCheckEvaluation(asset_key=KEY, check_name="passed", passed=row != "r2", partition=row,
                                      target_materialization_data=target)
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


def test_a_watcher_streams_events_written_through_an_open_connection(tmp_path, monkeypatch):
    """What the UI's live run view relies on: the writer keeps its connection open, so its
    commits land in the run's WAL (not the database file) and the watcher must still see them."""
    import threading
    import time
    import uuid

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    run_id = str(uuid.uuid4())
    seen: list[str] = []
    arrived = threading.Event()

    def callback(entry, _cursor):
        seen.append(entry.dagster_event.message)
        if seen[-1] == "third":  # (the watcher may hand over "first" too, with "second", before "third" is in)
            arrived.set()

    with dg.DagsterInstance.get() as webserver, dg.DagsterInstance.get() as worker:
        run = worker.run_storage.add_run(dg.DagsterRun(job_name="graded", run_id=run_id))
        worker.report_engine_event("first", run)  # creates the run's database
        webserver.event_log_storage.watch(run_id, None, callback)
        db_file = tmp_path / "history" / "runs" / f"{run_id}.db"
        before = db_file.stat().st_mtime_ns
        worker.report_engine_event("second", run)
        worker.report_engine_event("third", run)
        deadline = time.monotonic() + 20
        while not arrived.is_set() and time.monotonic() < deadline:
            arrived.wait(0.1)
        assert db_file.stat().st_mtime_ns == before  # the commits went to the WAL only
        webserver.event_log_storage.end_watch(run_id, callback)
    assert seen[-2:] == ["second", "third"]


def test_no_open_database_is_carried_across_a_fork(tmp_path, monkeypatch):
    """SQLite's rule for ``fork()`` (shard runs fork from the CLI): the kept connections close
    before any fork, so the child inherits no descriptor of a database, and the parent reopens."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))

    def open_databases() -> list[str]:
        targets = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:  # the listing's own descriptor, gone by now
                pass
        return sorted(t for t in targets if t.startswith(str(tmp_path)) and t.endswith(".db"))

    with dg.DagsterInstance.get() as instance:
        first = graded.execute_in_process(instance=instance)
        assert open_databases()  # the event log keeps its connections open between events
        assert in_forked_child(lambda: "\n".join(open_databases())) == ""
        second = graded.execute_in_process(instance=instance)  # the parent reopens as it writes
        assert second.success and len(instance.all_logs(first.run_id)) > 3


def _graded_events(tmp_path) -> list:
    """Every event of a run of ``graded``: three partition materializations and their checks
    among the step's other events."""
    home = tmp_path / "source"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        result = graded.execute_in_process(instance=instance)
        return instance.all_logs(result.run_id)


def _stored(log: LocalSqliteEventLogStorage) -> dict:
    """What the UI and the asset queries read back about ``KEY``."""
    records = log.get_event_records(dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_MATERIALIZATION,
                                                          asset_key=KEY), ascending=True)
    (asset,) = log.get_asset_records([KEY])
    return {
        "events": [(e.dagster_event_type, e.dagster_event.partition if e.dagster_event else None, e.message)
                   for e in (r.event_log_entry for r in log.get_records_for_run(records[0].run_id, limit=100).records)],
        "materializations": [(r.partition_key, r.asset_materialization.metadata["score"].value) for r in records],
        "partitions": log.get_materialized_partitions(KEY),
        "latest": asset.asset_entry.last_materialization_record.storage_id == records[-1].storage_id,
        "latest_by_partition": {k: v - records[0].storage_id for k, v in log.get_latest_storage_id_by_partition(
            KEY, dg.DagsterEventType.ASSET_MATERIALIZATION).items()},
        "checks": sorted((c.partition, c.status.value, c.event.dagster_event.event_specific_data.passed,
                          c.event.dagster_event.event_specific_data.target_materialization_data.storage_id)
                         for c in log.get_asset_check_execution_history(CHECK, limit=10)),
        "check_partitions": sorted((i.partition_key, i.latest_execution_status.value, i.latest_target_materialization_storage_id)
                                   for i in log.get_asset_check_partition_info([CHECK])),
    }


@dg.op
def regrade_r2():
    yield dg.AssetMaterialization(asset_key=KEY, partition="r2", metadata={"score": 1.0})
    yield dg.Output(None)


@dg.job
def regraded():
    regrade_r2()


def test_the_latest_materialization_of_each_partition_is_answered_as_dagster_reads_it_from_the_events(tmp_path):
    """What a dataset op's checks point at: (storage id, run id, timestamp) of each row's latest
    materialization, from the event log's columns, as ``fetch_materializations`` has them."""
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        first = graded.execute_in_process(instance=instance).run_id
        again = regraded.execute_in_process(instance=instance).run_id
        latest = instance.event_log_storage.latest_materializations(KEY, ["r1", "r2", "r3", "never"])
        records = {}
        for row in ("r1", "r2", "r3"):
            (record,) = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=KEY, asset_partitions=[row]), limit=1).records
            records[row] = record
        assert set(latest) == {"r1", "r2", "r3"}
        assert {row: run_id for row, (_, run_id, _) in latest.items()} == {"r1": first, "r2": again, "r3": first}
        for row, (storage_id, run_id, timestamp) in latest.items():
            assert (storage_id, run_id) == (records[row].storage_id, records[row].run_id)
            assert abs(timestamp - records[row].timestamp) < 1e-5  # stored to the microsecond
        assert instance.event_log_storage.latest_materializations(KEY, ["r1"]) == {"r1": latest["r1"]}
        instance.wipe_assets([KEY])
        assert instance.event_log_storage.latest_materializations(KEY, ["r1", "r2", "r3"]) == {}


def test_a_burst_of_materializations_and_checks_written_together_reads_back_as_written_one_by_one(tmp_path):
    events = _graded_events(tmp_path)
    one_by_one = LocalSqliteEventLogStorage(str(tmp_path / "one"))
    together = LocalSqliteEventLogStorage(str(tmp_path / "together"))
    another_process = LocalSqliteEventLogStorage(str(tmp_path / "together"))  # another reader of the same files
    for event in events:
        one_by_one.store_event(event)
    burst = [i for i, e in enumerate(events) if e.dagster_event_type in BURST]
    assert len(burst) == 6 and burst == list(range(burst[0], burst[-1] + 1))
    with together.batched_writes():
        for event in events[:burst[-1] + 1]:
            together.store_event(event)
        assert another_process.get_materialized_partitions(KEY) == set()  # held, not yet written
        assert another_process.get_asset_check_execution_history(CHECK, limit=10) == []
    assert another_process.get_materialized_partitions(KEY) == {"r1", "r2", "r3"}
    for event in events[burst[-1] + 1:]:
        together.store_event(event)
    assert _stored(together) == _stored(one_by_one)
    assert _stored(together)["materializations"] == [("r1", 0.5), ("r2", 0.5), ("r3", 0.5)]
    assert _stored(together)["check_partitions"] == [("r1", "SUCCEEDED", 100), ("r2", "FAILED", 101),
                                                     ("r3", "SUCCEEDED", 102)]


def test_what_is_held_is_written_before_any_read_or_other_write(tmp_path):
    events = _graded_events(tmp_path)
    log = LocalSqliteEventLogStorage(str(tmp_path / "log"))
    other = LocalSqliteEventLogStorage(str(tmp_path / "log"))
    first, *rest = [e for e in events if e.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION]
    step_success = next(e for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_SUCCESS)
    with log.batched_writes():
        log.store_event(first)
        assert log.get_materialized_partitions(KEY) == {"r1"}  # a read through the storage sees it
        log.store_event(rest[0])
        log.store_event(step_success)  # another event: what was held goes first
        assert other.get_materialized_partitions(KEY) == {"r1", "r2"}
        log.store_event(rest[1])
    run_order = [e.dagster_event_type for e in (r.event_log_entry for r in
                                                 other.get_records_for_run(first.run_id, limit=10).records)]
    assert run_order == [dg.DagsterEventType.ASSET_MATERIALIZATION] * 2 + [
        dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.ASSET_MATERIALIZATION]


def test_a_long_burst_is_written_in_parts(tmp_path, monkeypatch):
    from agentenv_dagster.orchestration import sqlite_storage

    monkeypatch.setattr(sqlite_storage, "HELD_EVENTS", 2)
    events = _graded_events(tmp_path)
    log = LocalSqliteEventLogStorage(str(tmp_path / "log"))
    other = LocalSqliteEventLogStorage(str(tmp_path / "log"))
    with log.batched_writes():
        for event in [e for e in events if e.dagster_event_type == dg.DagsterEventType.ASSET_MATERIALIZATION]:
            log.store_event(event)
        assert other.get_materialized_partitions(KEY) == {"r1", "r2"}
    assert other.get_materialized_partitions(KEY) == {"r1", "r2", "r3"}


def test_two_runs_reaching_a_pool_at_once_take_its_one_slot_once(tmp_path):
    """Two run processes (two storages on the same files) both assigned the pool's last slot,
    as happens when both check for a free slot before either queues its step; the second
    claims in between the first's finding the free slot and taking it."""
    run_a, run_b = LocalSqliteEventLogStorage(str(tmp_path)), LocalSqliteEventLogStorage(str(tmp_path))
    run_a.set_concurrency_slots("agentenv_agent_slow", 1)
    for log, run_id in ((run_a, "a"), (run_b, "b")):
        log.add_pending_step("agentenv_agent_slow", run_id, "ask", should_assign=True)
    claims = {}

    def b_claims_first(conn, cursor, statement, *args):
        if statement.startswith("UPDATE concurrency_slots") and "b" not in claims:
            claims["b"] = None  # b's own update passes through
            claims["b"] = run_b.claim_concurrency_slot("agentenv_agent_slow", "b", "ask").slot_status

    db.event.listen(db.engine.Engine, "before_cursor_execute", b_claims_first)
    try:
        claims["a"] = run_a.claim_concurrency_slot("agentenv_agent_slow", "a", "ask").slot_status
    finally:
        db.event.remove(db.engine.Engine, "before_cursor_execute", b_claims_first)
    assert claims == {"b": ConcurrencySlotStatus.CLAIMED, "a": ConcurrencySlotStatus.BLOCKED}
    run_b.free_concurrency_slots_for_run("b")
    assert run_a.claim_concurrency_slot("agentenv_agent_slow", "a", "ask").is_claimed  # a waits its turn


READINGS_PROBE = """
import sys
from pathlib import Path

import alembic.script.base as alembic_scripts
import dagster as dg
import sqlalchemy as db

readings = []
read = alembic_scripts.ScriptDirectory._load_revisions
alembic_scripts.ScriptDirectory._load_revisions = lambda self: (readings.append(self.dir), read(self))[1]

from agentenv_dagster.orchestration.execute import dagster_yaml


@dg.op
def noop():
    return None


@dg.job
def one_op():
    noop()


stamped = set()
for home in map(Path, sys.argv[1:]):
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run_id = one_op.execute_in_process(instance=instance).run_id
        for shard in (run_id, "index"):  # a new run's database, and the asset index
            with instance.event_log_storage._connect(shard) as conn:
                stamped.add(conn.execute(db.text("select version_num from alembic_version")).scalar())
head = alembic_scripts.ScriptDirectory.from_config(
    dg._core.storage.sql.get_alembic_config(dg._core.storage.event_log.sqlite.sqlite_event_log.__file__)
).as_revision_number("head")
print(len(readings), sorted(stamped) == [head])
"""


def test_a_process_reads_dagsters_migration_scripts_once(tmp_path):
    """Dagster compares (and stamps) the revision of every database it opens, reading its
    migration scripts each time: with the local storage, a process reads them once, for two
    instances and their runs' new databases alike, and the databases carry the newest
    revision all the same."""
    done = subprocess.run([sys.executable, "-c", READINGS_PROBE, str(tmp_path / "a"), str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "True"]


def test_other_migration_script_folders_are_read_each_time(tmp_path):
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from agentenv_dagster.orchestration.migration_scripts import read_dagster_scripts_once

    read_dagster_scripts_once()  # as importing the local storage does
    kept = ScriptDirectory.from_config.__func__
    read_dagster_scripts_once()
    assert ScriptDirectory.from_config.__func__ is kept  # not wrapped twice
    (tmp_path / "versions").mkdir()
    own = Config()
    own.set_main_option("script_location", str(tmp_path))
    assert ScriptDirectory.from_config(own) is not ScriptDirectory.from_config(own)
    dagsters = Config()
    dagsters.set_main_option("script_location", "dagster:_core/storage/alembic")
    assert ScriptDirectory.from_config(dagsters) is ScriptDirectory.from_config(dagsters)


def test_each_run_s_database_is_a_copy_of_one_dagster_made_once(tmp_path, monkeypatch):
    """Dagster initializes a template once (its tables, WAL, the migration stamp) and each new
    run's database is a copy, read and written as Dagster's own; a run database another process
    made first is initialized the usual way."""
    initialized = []
    initdb = SqliteEventLogStorage._initdb
    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", lambda self, engine, for_index_shard=False: initialized.append(
        os.path.basename(engine.url.database)) or initdb(self, engine, for_index_shard))
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    runs = tmp_path / "history" / "runs"
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        first, second = (graded.execute_in_process(instance=instance).run_id for _ in range(2))
        assert [name for name in initialized if name != "index.db"] == [f".run-template-{dg.__version__}.sqlite.{os.getpid()}.tmp"]
        elsewhere = str(uuid.uuid4())
        runs.joinpath(f"{elsewhere}.db").write_bytes(b"")  # (SQLite makes an empty file first)
        assert graded.execute_in_process(instance=instance, run_id=elsewhere).success
        assert initialized[-1] == f"{elsewhere}.db"
        for run_id in (first, second, elsewhere):
            assert len(instance.all_logs(run_id, of_type=set(BURST))) == 6
            engine = db.create_engine(f"sqlite:///{runs / f'{run_id}.db'}")
            with engine.connect() as conn:
                revision, head = check_alembic_revision(get_alembic_config(sqlite_event_log.__file__), conn)
                assert revision == head and conn.execute(db.text("PRAGMA journal_mode")).scalar() == "wal"
            engine.dispose()
        assert instance.get_materialized_partitions(KEY) == {"r1", "r2", "r3"}
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith("index.db")) == sorted(
        [f".run-template-{dg.__version__}.sqlite", f"{first}.db", f"{second}.db", f"{elsewhere}.db"])


def test_without_a_template_runs_start_dagster_s_way(tmp_path, monkeypatch):
    """A storage folder where the template cannot be made (one this process only reads, say)
    still opens, and its runs' databases are made by Dagster as before."""
    initdb = SqliteEventLogStorage._initdb

    def no_template(self, engine, for_index_shard=False):
        if ".run-template-" in engine.url.database:
            raise OSError("read-only file system")
        return initdb(self, engine, for_index_shard)

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", no_template)
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        run_id = graded.execute_in_process(instance=instance).run_id
        assert len(instance.all_logs(run_id, of_type=set(BURST))) == 6
    runs = tmp_path / "history" / "runs"
    assert sorted(p.name for p in runs.iterdir() if not p.name.startswith("index.db")) == [f"{run_id}.db"]


def test_runs_are_looked_up_on_one_kept_engine_and_the_schema_read_until_it_holds(tmp_path, monkeypatch):
    """Dagster's SQLite run storage makes a new engine for every query (and so compiles every
    statement again) and reads the runs table's columns before most run queries; the local one
    keeps its engine, holds no connection between uses, and stops reading the schema once the
    columns are there."""
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    engines, inspected = [], []
    new_engine, inspect = sqlite_run_storage.create_engine, db.inspect
    monkeypatch.setattr(sqlite_run_storage, "create_engine", lambda *a, **k: engines.append(a) or new_engine(*a, **k))
    monkeypatch.setattr(db, "inspect", lambda subject: inspected.append(subject) or inspect(subject))
    with dg.DagsterInstance.get() as instance:
        runs = [graded.execute_in_process(instance=instance).run_id for _ in range(2)]
        engines.clear()
        read = len(inspected)
        assert [instance.get_run_by_id(run_id).status for run_id in runs * 5] == [dg.DagsterRunStatus.SUCCESS] * 10
        assert engines == [] and len(inspected) == read
        assert not any(os.readlink(f"/proc/self/fd/{fd}").endswith("runs.db")
                       for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
