"""Dagster's migration scripts, read once a process.

Each time Dagster opens one of its SQL storages (the runs, the schedules, the event log, and
every new run's own SQLite database) it compares the database's revision with the newest of
its Alembic migration scripts, and stamps a new database with it. Each time, Alembic reads the
script folder again, executing every script file: ~45 ms on this machine, five times in a CLI
run (~0.3 s of a 10 s run), and as often in each shard's process and the suite asset's. The
scripts cannot change under a running process, so Dagster's folder is read once, when the
local storage is imported, and kept: the processes forked after that (the shards, the suite
asset's process, the step processes of the executor's forkserver, which imports the storage)
inherit the reading and make none. Any other script folder (an application's own) is read as
before.
"""

from __future__ import annotations

from alembic.script import ScriptDirectory
from dagster._core.storage.event_log.sqlite import sqlite_event_log
from dagster._core.storage.sql import ALEMBIC_SCRIPTS_LOCATION, get_alembic_config


def read_dagster_scripts_once() -> None:
    """Read Dagster's folder now; from then on in this process ``ScriptDirectory.from_config``
    answers it with that reading (calling this again changes nothing)."""
    if getattr(ScriptDirectory.from_config, "reads_dagster_scripts_once", False):
        return
    read = ScriptDirectory.from_config.__func__
    dagsters = read(ScriptDirectory, get_alembic_config(sqlite_event_log.__file__))
    dagsters.revision_map.heads  # the reading itself (Alembic keeps it on the ScriptDirectory)

    def from_config(cls, config):
        if cls is ScriptDirectory and config.get_main_option("script_location") == ALEMBIC_SCRIPTS_LOCATION:
            return dagsters
        return read(cls, config)

    from_config.reads_dagster_scripts_once = True
    ScriptDirectory.from_config = classmethod(from_config)
