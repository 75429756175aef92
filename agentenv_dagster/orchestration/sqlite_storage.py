"""The project's local Dagster storage: Dagster's SQLite storage, with an event log that
writes each event at a fraction of the cost.

A dataset run materializes one partition per row: a thousand events where Dagster's SQLite
event log, per event, builds a new SQLAlchemy engine for the run's database and for the asset
index, opens and closes a connection to each (the close checkpoints the WAL into the database
file) and waits for the disk twice (``synchronous=FULL`` in WAL mode fsyncs every commit).
This event log keeps one open connection for each of the few database files written lately
and sets ``synchronous=NORMAL``, which SQLite recommends with WAL: a crash of the process loses
nothing, a power cut may lose the last commits but never corrupts the database. Because a
commit now lands in the ``-wal`` file and not in the database file, the watcher that streams
a run's events to the UI also watches the ``-wal`` file. Measured on this machine (1,000
partitioned materializations): about 12.5 ms of CPU an event in Dagster's, 2.7 ms here.

An op that materializes a partition per row yields them in one burst, then a check evaluation
a row; inside ``batched_writes()`` the storage holds a thread's materializations and check
evaluations and writes them together (one transaction per database, the asset's
latest-materialization entry updated once), about a quarter of the storage's CPU an event.
Any other use of the storage writes what is held first, so every read, and the order of the
events, is as if each had been written at once. The op's checks then find the rows' latest
materializations (``latest_materializations``) from the event log's columns, not by reading
the events back (500 rows: ~15 ms of CPU, not ~300 ms); a dataset's suite reads each row's
latest verification back as the few metadata entries it needs, unpacked from the stored JSON
(``materialization_metadata``), not as whole events. A new run's database is a copy of an
empty one Dagster made once (its tables, WAL, the migration stamp: ~15 ms at every run's start).
A pool's slot is taken in one statement: Dagster's select-then-update relies on a row lock
SQLite does not have, and two runs reaching a pool with one free slot could both take it. The
run storage keeps its SQLAlchemy engine rather than making one a query (a run's lookup: 2.7 ms
→ 0.7 ms), and stops reading the runs table's schema once the columns it checks are there.
Production uses PostgreSQL (``deploy/dagster.yaml``), where none of the above applies. What
applies there too: a process that imports this module reads Dagster's migration scripts once,
not each time one of Dagster's SQL storages opens a database (``migration_scripts``; the
multiprocess executor's forkserver imports it for its step processes).

``.dagster_home/dagster.yaml`` (written on first use) selects it::

    storage:
      custom:
        module: agentenv_dagster.orchestration.sqlite_storage
        class: LocalSqliteStorage
        config: {base_dir: /abs/path/of/.dagster_home}
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import threading
import weakref
from collections import OrderedDict
from contextlib import contextmanager, suppress
from datetime import timezone
from pathlib import Path
from typing import Any, Callable, Collection, Iterator

import sqlalchemy as db
import yaml
from dagster import (
    AssetKey,
    BoolMetadataValue,
    FloatMetadataValue,
    IntMetadataValue,
    JsonMetadataValue,
    TextMetadataValue,
)
from dagster._core.events import DagsterEventType
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from dagster._core.storage.event_log.schema import (
    AssetCheckExecutionsTable,
    ConcurrencySlotsTable,
    SqlEventLogStorageTable,
)
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    SqliteEventLogStorage,
    SqliteEventLogStorageWatchdog,
)
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage, _event_logs_directory
from dagster._serdes import ConfigurableClassData, deserialize_value
from dagster._utils.concurrency import ConcurrencySlotStatus
from dagster.version import __version__ as dagster_version
from dagster_shared.serdes.serdes import unpack_value
from sqlalchemy.pool import NullPool, StaticPool
from watchdog.events import PatternMatchingEventHandler
from watchdog.observers import Observer

from .migration_scripts import read_dagster_scripts_once

MODULE = __name__
log = logging.getLogger(__name__)


OPEN_DATABASES = 8  # a run's database and the asset index, for the few runs a process writes at once
HELD_EVENTS = 500  # inside batched_writes(), written together at most this many at a time
HELD_TYPES = (DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_CHECK_EVALUATION)


class LocalSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log: an open connection per recently written database file,
    ``synchronous=NORMAL``, and a run watcher that sees commits to the WAL."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines: OrderedDict[str, db.engine.Engine] = OrderedDict()
        self._held = threading.local()  # .events: this thread's held events inside batched_writes()
        self._metadata_read: dict[tuple[int, tuple[str, ...]], tuple[str, dict[str, Any]]] = {}
        super().__init__(base_dir, inst_data=inst_data)
        self._run_template()  # made as the storage opens, with its index: the runs forked from this process find it
        _OPEN.add(self)

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData | None, config_value: Any) -> "LocalSqliteEventLogStorage":
        return cls(inst_data=inst_data, **config_value)

    def _engine(self, shard: str) -> db.engine.Engine:
        """The shard's engine: one connection (``StaticPool``), used under ``_db_lock`` only,
        kept open while the shard is among the last ``OPEN_DATABASES`` used."""
        conn_string = self.conn_string_for_shard(shard)
        engine = self._engines.get(conn_string)
        if engine is None:
            engine = db.create_engine(conn_string, poolclass=StaticPool, connect_args={
                "timeout": SQLITE_BUSY_TIMEOUT_SECONDS, "check_same_thread": False})
            db.event.listen(engine, "connect", _synchronous_normal)
            self._engines[conn_string] = engine
            while len(self._engines) > OPEN_DATABASES:
                self._engines.popitem(last=False)[1].dispose()
        else:
            self._engines.move_to_end(conn_string)
        return engine

    @contextmanager
    def batched_writes(self) -> Iterator[None]:
        """Hold this thread's asset materializations and check evaluations and write them
        together (at the end, at ``HELD_EVENTS``, or before anything else touches the storage)."""
        if getattr(self._held, "events", None) is not None:  # nested: the outer one writes
            yield
            return
        self._held.events = []
        try:
            yield
        finally:
            self._write_held()
            self._held.events = None

    def store_event(self, event: EventLogEntry) -> None:
        held = getattr(self._held, "events", None)
        if held is None or event.dagster_event_type not in HELD_TYPES or not event.run_id:
            super().store_event(event)
            return
        held.append(event)
        if len(held) >= HELD_EVENTS:
            self._write_held()

    def _write_held(self) -> None:
        """Store the held events as Dagster's ``store_event`` would one by one: each in its
        run's database and in the asset index; a materialization with its tags, the asset's
        entry (its latest materialization) from the last of them; a check evaluation as its
        check's execution."""
        events = getattr(self._held, "events", None)
        if not events:
            return
        self._held.events = []  # taken before connecting: _connect writes what is held first
        by_run: dict[str, list[EventLogEntry]] = {}
        for event in events:
            by_run.setdefault(event.run_id, []).append(event)
        for run_id, of_run in by_run.items():
            rows = [self._event_to_row(e) for e in of_run]
            with self.run_connection(run_id) as conn:
                conn.execute(SqlEventLogStorageTable.insert(), rows)
            with self.index_transaction() as conn:
                insert = SqlEventLogStorageTable.insert()  # one statement: SQLAlchemy compiles it once
                ids = [conn.execute(insert, row).inserted_primary_key[0] for row in rows]
                stored = list(zip(of_run, ids, rows))
                materialized = [(e, i) for e, i, _ in stored if e.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION]
                if materialized:
                    self._store_asset_event_tags(conn, [e for e, _ in materialized], [i for _, i in materialized])
                latest = {e.get_dagster_event().asset_key: (e, i) for e, i in materialized}
                for event, event_id in latest.values():
                    self._store_asset_event(conn, event, event_id)
                for event, event_id, row in stored:
                    if event.dagster_event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
                        _record_check_execution(conn, event, event_id, row)

    def latest_materializations(self, asset_key: AssetKey, partitions: list[str]) -> dict[str, tuple[int, str, float]]:
        """Each of ``partitions``' latest materialization of ``asset_key`` as (storage id, run id,
        timestamp): what ``fetch_materializations`` says of them, from the event log's columns,
        not its events (reading 500 rows' events back, ~0.3 s of CPU, is their metadata)."""
        latest = self._latest_event_ids_by_partition_subquery(
            asset_key, [DagsterEventType.ASSET_MATERIALIZATION], asset_partitions=partitions)
        table = SqlEventLogStorageTable.c
        query = db.select(table.partition, table.id, table.run_id, table.timestamp).where(
            table.id.in_(db.select(latest.c.id)))
        with self.index_connection() as conn:
            found = conn.execute(query).fetchall()
        # stored as naive UTC (Dagster's ``_event_insert_timestamp``), to the microsecond
        return {partition: (storage_id, run_id, stamp.replace(tzinfo=timezone.utc).timestamp())
                for partition, storage_id, run_id, stamp in found}

    def materialization_metadata(self, storage_ids: list[int], labels: Collection[str]) -> dict[str, dict[str, Any]]:
        """Each of these materializations' partition and its metadata entries named in
        ``labels``, unpacked from the stored event's JSON alone, not the whole event built (a
        dataset's suite reads a thousand: ~0.5 s of CPU that way, ~0.2 s this way). Each is
        read once by this storage (a stored event does not change): a suite's process reads the
        rows ahead as they land, and its run then reads only the last ones."""
        asked = tuple(labels)
        unread = [i for i in storage_ids if (i, asked) not in self._metadata_read]
        if unread:
            table = SqlEventLogStorageTable.c
            with self.index_connection() as conn:
                found = conn.execute(
                    db.select(table.id, table.partition, table.event).where(table.id.in_(unread))).fetchall()
            if len(self._metadata_read) + len(found) > METADATA_READ_KEPT:
                self._metadata_read.clear()
            self._metadata_read.update({(i, asked): (partition, _metadata(event, asked)) for i, partition, event in found})
        read = [self._metadata_read[i, asked] for i in sorted(storage_ids) if (i, asked) in self._metadata_read]
        return dict(read)

    def _claim_concurrency_slot(self, concurrency_key: str, run_id: str, step_key: str) -> ConcurrencySlotStatus:
        """Take a free slot of the pool in one statement. Dagster selects a free slot, then
        updates it: SQLite ignores the select's ``FOR UPDATE``, so two runs that reach a pool
        at once could both take its last slot, and a limit of 1 would run two steps."""
        slots = ConcurrencySlotsTable.c
        free_slot = (db.select(slots.id)
                     .where(slots.concurrency_key == concurrency_key, slots.step_key.is_(None), slots.deleted.is_(False))
                     .limit(1).scalar_subquery())
        with self.index_connection() as conn:
            taken = conn.execute(ConcurrencySlotsTable.update()
                                 .where(slots.id == free_slot, slots.step_key.is_(None))
                                 .values(run_id=run_id, step_key=step_key)).rowcount
        return ConcurrencySlotStatus.CLAIMED if taken else ConcurrencySlotStatus.BLOCKED

    def _initdb(self, engine: db.engine.Engine, for_index_shard: bool = False) -> None:
        """A new run's database is a copy of an empty one made once (``_run_template``):
        Dagster makes each run's tables, switches the file to WAL and stamps its migration,
        ~15 ms (half of it waiting for the disk) at the start of every run."""
        template = None if for_index_shard else self._run_template()
        if template is None or not _copied(template, engine.url.database):
            super()._initdb(engine, for_index_shard)

    def _run_template(self) -> str | None:
        """An empty run database, as Dagster's ``_initdb`` makes one, in the storage folder
        (named for this Dagster version, and not ``*.db``: Dagster takes those for runs); None
        when it cannot be made (a folder this process only reads): runs start Dagster's way."""
        path = os.path.join(self._base_dir, f".run-template-{dagster_version}.sqlite")
        if os.path.exists(path):
            return path
        made = f"{path}.{os.getpid()}.tmp"
        try:
            engine = db.create_engine(f"sqlite:///{made}", poolclass=NullPool)
            try:
                super()._initdb(engine)
            finally:
                engine.dispose()  # the last connection's close checkpoints the WAL into the file
            os.replace(made, path)
        except (OSError, db.exc.SQLAlchemyError) as exc:
            log.debug("no run database template in %s: %s", self._base_dir, exc)
            with suppress(OSError):
                os.unlink(made)
            return None
        return path

    @contextmanager
    def _connect(self, shard: str) -> Iterator[db.engine.Connection]:
        self._write_held()  # what this thread holds goes first: reads see it, events keep their order
        with self._db_lock:
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn:
                with conn.begin():
                    yield conn

    def watch(self, run_id: str, cursor: str | None, callback) -> None:
        """As Dagster's, with a handler that also fires on the run's ``-wal`` file."""
        if not self._obs:
            self._obs = Observer()
            self._obs.start()
        handler = _RunWatchdog(self, run_id, callback, cursor)
        self._watchers[run_id][callback] = (handler, self._obs.schedule(handler, self._base_dir, recursive=True))

    def wipe(self) -> None:
        self._close_all()
        super().wipe()

    def dispose(self) -> None:
        self._close_all()
        super().dispose()

    def _close_all(self) -> None:
        with self._db_lock:
            while self._engines:
                self._engines.popitem()[1].dispose()


def _check_execution_statements() -> dict[bool, tuple[Any, Any]]:
    """(update, insert) of a check's execution, by whether it is of a partition; built once
    with bound parameters, so SQLAlchemy compiles each once."""
    table = AssetCheckExecutionsTable
    fields = ("execution_status", "evaluation_event", "evaluation_event_timestamp", "evaluation_event_storage_id",
              "materialization_event_storage_id", "partition")
    keys = ("asset_key", "check_name", "run_id")
    statements = {}
    for partitioned in (False, True):
        where = [getattr(table.c, k) == db.bindparam(f"k_{k}") for k in keys]
        where.append(table.c.partition == db.bindparam("k_partition") if partitioned else table.c.partition.is_(None))
        update = table.update().where(*where).values({f: db.bindparam(f"v_{f}") for f in fields})
        insert = table.insert().values({**{k: db.bindparam(f"k_{k}") for k in keys},
                                        **{f: db.bindparam(f"v_{f}") for f in fields}})
        statements[partitioned] = (update, insert)
    return statements


CHECK_EXECUTION = _check_execution_statements()


METADATA_READ_KEPT = 10_000  # materializations' metadata a storage keeps once read (a dataset's rows)


def _metadata(event: str, labels: Collection[str]) -> dict[str, Any]:
    """A stored materialization's metadata entries named in ``labels``; an event stored in
    another shape than this Dagster's (``metadata_entries``, deprecated for 2.0) is read
    Dagster's way."""
    try:
        entries = json.loads(event)["dagster_event"]["event_specific_data"]["materialization"]["metadata_entries"]
        return {e["label"]: _unpacked(e["entry_data"]) for e in entries if e["label"] in labels}
    except (KeyError, TypeError):
        metadata = deserialize_value(event, EventLogEntry).asset_materialization.metadata
        return {label: value for label, value in metadata.items() if label in labels}


# The metadata values a verification carries, by their stored class, and the field holding the
# value. JSON comes back as it was stored: serdes unpacks the objects in it, then packs them again.
_PLAIN_VALUES = {
    "BoolMetadataEntryData": (BoolMetadataValue, "value"), "FloatMetadataEntryData": (FloatMetadataValue, "value"),
    "IntMetadataEntryData": (IntMetadataValue, "value"), "TextMetadataEntryData": (TextMetadataValue, "text"),
    "JsonMetadataEntryData": (JsonMetadataValue, "data"),
}


def _unpacked(packed: dict[str, Any]) -> Any:
    """``unpack_value(packed)``, built directly for a plain value (a quarter of the CPU: a
    suite reads three a row), Dagster's way for any other."""
    kind, field = _PLAIN_VALUES.get(packed.get("__class__"), (None, ""))
    if kind is None or packed.keys() != {"__class__", field}:
        return unpack_value(packed)
    return kind(packed[field])


def _record_check_execution(conn: db.engine.Connection, event: EventLogEntry, event_id: int, row: dict) -> None:
    """Dagster's ``_update_asset_check_evaluation`` on the given connection: the evaluation
    completes its planned execution (same check, run and partition), or is one of its own."""
    evaluation = event.get_dagster_event().event_specific_data
    target = evaluation.target_materialization_data
    params = {
        "k_asset_key": evaluation.asset_key.to_string(), "k_check_name": evaluation.check_name,
        "k_run_id": event.run_id, "k_partition": evaluation.partition,
        "v_execution_status": (AssetCheckExecutionRecordStatus.SUCCEEDED if evaluation.passed
                               else AssetCheckExecutionRecordStatus.FAILED).value,
        "v_evaluation_event": row["event"],  # the event's JSON, as its row in the event log has it
        "v_evaluation_event_timestamp": row["timestamp"],
        "v_evaluation_event_storage_id": event_id,
        "v_materialization_event_storage_id": target.storage_id if target else None,
        "v_partition": evaluation.partition,
    }
    update, insert = CHECK_EXECUTION[evaluation.partition is not None]
    if not conn.execute(update, params).rowcount:
        conn.execute(insert, params)


_OPEN: "weakref.WeakSet[LocalSqliteEventLogStorage]" = weakref.WeakSet()


def _close_before_fork() -> None:
    """SQLite says not to carry an open database across ``fork()``: whatever forks this
    process (shard runs do), the kept connections close first and reopen on next use."""
    for storage in list(_OPEN):
        storage._close_all()


os.register_at_fork(before=_close_before_fork)
read_dagster_scripts_once()  # a CLI run read Dagster's migration scripts five times (~45 ms each); now once


class _RunWatchdog(SqliteEventLogStorageWatchdog):
    """Dagster's run watcher, matching the run's database file and its WAL."""

    def __init__(self, storage: LocalSqliteEventLogStorage, run_id: str, callback, cursor: str | None):
        super().__init__(storage, run_id, callback, cursor)
        path = storage.path_for_shard(run_id)
        PatternMatchingEventHandler.__init__(self, patterns=[path, f"{path}-wal"])

    def on_modified(self, event) -> None:
        self._process_log()


def _copied(template: str, target: str) -> bool:
    """Whether ``target`` was made now, a copy of ``template``: not when it exists (another
    process made it first, and it is initialized the usual way). The copy appears whole."""
    if os.path.exists(target):
        return False
    made = f"{target}.{os.getpid()}.tmp"
    shutil.copyfile(template, made)
    try:
        os.link(made, target)
    except FileExistsError:
        return False
    finally:
        os.unlink(made)
    return True


def _synchronous_normal(dbapi_connection, _record) -> None:
    dbapi_connection.execute("PRAGMA synchronous=NORMAL")


class LocalSqliteRunStorage(SqliteRunStorage):
    """Dagster's SQLite run storage with one engine for its life, not one a query: SQLAlchemy
    compiles a statement once an engine, and a run's lookup took 2.7 ms, 0.7 ms with the engine
    kept (a run starts and ends with some forty queries). The schema facts it checks before
    most queries (a column a migration adds, an index built) are read until they hold, then
    remembered. A connection is still opened for each use (``NullPool``): none is shared
    between threads or carried into a forked process."""

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(conn_string, inst_data)
        self._kept_engine = db.create_engine(conn_string, poolclass=NullPool)
        self._holding: set[tuple[str, ...]] = set()

    @contextmanager
    def connect(self) -> Iterator[db.engine.Connection]:
        with self._kept_engine.connect() as conn:
            with conn.begin():
                yield conn

    def _holds(self, fact: tuple[str, ...], check: Callable[[], bool]) -> bool:
        if fact not in self._holding and check():
            self._holding.add(fact)
        return fact in self._holding

    def has_run_stats_index_cols(self) -> bool:
        return self._holds(("run_stats_index_cols",), super().has_run_stats_index_cols)

    def has_backfill_id_column(self) -> bool:
        return self._holds(("backfill_id_column",), super().has_backfill_id_column)

    def has_built_index(self, migration_name: str) -> bool:
        return self._holds(("built_index", migration_name), functools.partial(super().has_built_index, migration_name))

    def dispose(self) -> None:
        self._kept_engine.dispose()
        super().dispose()


class LocalSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage (runs, schedules, the same files) with the run storage and the
    event log above."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        super().__init__(base_dir, inst_data=inst_data)
        self._run_storage = LocalSqliteRunStorage(self._run_storage._conn_string)  # (its database made by Dagster's)
        self._event_log_storage = LocalSqliteEventLogStorage(_event_logs_directory(base_dir))

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Any) -> "LocalSqliteStorage":
        return cls.from_local(inst_data=inst_data, **config_value)


def local_storage_yaml(home: Path) -> str:
    """The ``storage:`` block of an instance in ``home`` (its absolute path: an instance opened
    with ``DagsterInstance.from_config(home)`` need not have ``DAGSTER_HOME`` set)."""
    return yaml.safe_dump({"storage": {"custom": {
        "module": MODULE, "class": "LocalSqliteStorage", "config": {"base_dir": str(home.resolve())}}}})
