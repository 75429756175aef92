"""What one stored Dagster event costs on the stock storage, against SQLite's own floor.

A dataset row stores a handful of Dagster events (its verification's and its results'
materializations, their check evaluations, and the planned materializations a range run
writes before it starts); this benchmark times that unit alone, in one process:

(a) Dagster: ``instance.report_runless_asset_event`` of a partitioned materialization with a
    score, on an instance with the stock settings (``DAGSTER_HOME`` with no storage
    configured: run-sharded SQLite event logs and an index database);
(b) baseline: the same event serialized with Dagster's ``serialize_value`` and inserted with
    Python's ``sqlite3`` into one table over one open connection, one commit an event (the
    floor of "one SQLite commit per event" on this disk).

It prints milliseconds of wall and CPU time per event for both, their ratio, and what the
stock cost alone comes to for ``--rows`` rows of ``--events-per-row`` events, spread over the
machine's cores.

    python bench/event_storage.py [--events 500] [--rows 1000] [--events-per-row 7]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time
from pathlib import Path

import dagster as dg


def materialization(i: int) -> dg.AssetMaterialization:
    return dg.AssetMaterialization(asset_key=["verifications", "bench"], partition=f"r{i:05d}",
                                   metadata={"score": 1.0, "passed": True, "criteria": 1})


def per_event(store, count: int) -> tuple[float, float]:
    """Wall and CPU milliseconds per call of ``store(i)``, after a few untimed ones."""
    for i in range(10):
        store(-1 - i)
    wall, cpu = time.perf_counter(), time.process_time()
    for i in range(count):
        store(i)
    return ((time.perf_counter() - wall) * 1000 / count, (time.process_time() - cpu) * 1000 / count)


def dagster_stock(home: Path, count: int) -> tuple[float, float]:
    os.environ["DAGSTER_HOME"] = str(home)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with dg.DagsterInstance.get() as instance:
        return per_event(lambda i: instance.report_runless_asset_event(materialization(i)), count)


def sqlite_floor(folder: Path, count: int) -> tuple[float, float]:
    connection = sqlite3.connect(folder / "events.db")
    connection.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, partition TEXT, event TEXT)")

    def store(i: int) -> None:
        connection.execute("INSERT INTO events (partition, event) VALUES (?, ?)",
                           (f"r{i:05d}", dg.serialize_value(materialization(i))))
        connection.commit()

    try:
        return per_event(store, count)
    finally:
        connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--events-per-row", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        home, floor = Path(scratch, "dagster_home"), Path(scratch, "floor")
        home.mkdir()
        floor.mkdir()
        floor_wall, floor_cpu = sqlite_floor(floor, args.events)
        stock_wall, stock_cpu = dagster_stock(home, args.events)
    print(f"{args.events} events each, ms per event:")
    print(f"  {'':<34}{'wall':>8}{'CPU':>8}")
    print(f"  {'sqlite3, one connection (floor)':<34}{floor_wall:>8.2f}{floor_cpu:>8.2f}")
    print(f"  {'Dagster, stock SQLite storage':<34}{stock_wall:>8.2f}{stock_cpu:>8.2f}")
    print(f"  stock / floor: wall {stock_wall / floor_wall:.1f}x, CPU {stock_cpu / floor_cpu:.1f}x")
    events = args.rows * args.events_per_row
    cores = os.cpu_count() or 1
    print(f"{args.rows} rows x {args.events_per_row} events = {events:,} events: "
          f"{events * stock_cpu / 1000:.1f} s of CPU on the stock storage "
          f"({events * stock_cpu / 1000 / cores:.1f} s of wall on {cores} cores at best)")


if __name__ == "__main__":
    main()
