"""Reading a dataset's verifications back: each row's latest, or each (row, replicate)'s; on
Dagster's SQLite storage (the events read back) and on the project's local one (only the
entries asked for unpacked from the stored JSON), which must agree."""

from __future__ import annotations

import dagster as dg
import pytest
import sqlalchemy

from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.orchestration.rows import latest_metadata, latest_replicates
from agentenv_dagster.orchestration.sqlite_storage import LocalSqliteEventLogStorage

KEY = dg.AssetKey(["verifications", "t", "v"])
LABELS = ("score", "passed", "results")


@pytest.fixture(params=["dagster", "local"])
def instance(request, tmp_path):
    if request.param == "dagster":
        with dg.instance_for_test() as instance:
            yield instance
        return
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert isinstance(instance.event_log_storage, LocalSqliteEventLogStorage)
        yield instance


def materialize(instance: dg.DagsterInstance, row: str, replicate: int, score: float) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(KEY, partition=row, metadata={
        "replicate": replicate, "score": score, "passed": score >= 0.5, "format": "rows",
        "results": dg.MetadataValue.json([{"criterion_type": "classification_match", "score": score}]),
        "criteria": dg.MetadataValue.table(records=[dg.TableRecord({"id": "c", "score": score})]),
    }))


def test_each_replicate_s_latest_even_when_other_rows_ran_more_often_since(instance):
    for row in ("a", "b", "c"):
        for replicate in (0, 1):
            materialize(instance, row, replicate, 0.0)
    for again in (0.3, 0.6, 1.0):  # row a re-run three times, then b once: c is not among the newest 6
        for replicate in (0, 1):
            materialize(instance, "a", replicate, again)
    materialize(instance, "b", 0, 0.5)
    materialize(instance, "b", 1, 0.7)
    found = latest_replicates(instance, KEY, ["a", "b", "c", "never"], 2, LABELS)
    latest = latest_metadata(instance, KEY, ["a", "b", "c"], LABELS)
    assert {k: v["score"].value for k, v in found.items()} == {
        ("a", 0): 1.0, ("a", 1): 1.0, ("b", 0): 0.5, ("b", 1): 0.7, ("c", 0): 0.0, ("c", 1): 0.0}
    assert {row: m["score"].value for row, m in latest.items()} == {"a": 1.0, "b": 0.7, "c": 0.0}
    # only the entries asked for, typed as Dagster types them
    assert latest["b"] == {"score": dg.FloatMetadataValue(0.7), "passed": dg.BoolMetadataValue(True),
                           "results": dg.JsonMetadataValue([{"criterion_type": "classification_match", "score": 0.7}])}


def test_the_local_storage_reads_what_dagster_reads_back(tmp_path):
    """Every entry of real stored materializations, unpacked from the JSON alone (the plain
    values built directly), is what the event Dagster builds holds: JSON whose keys serdes
    reads as its own, a missing score and a table too."""
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    every = ("replicate", "score", "passed", "format", "results", "criteria", "odd", "none")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        for i, row in enumerate(["a", "b", "c"]):
            materialize(instance, row, 0, i / 2)
        instance.report_runless_asset_event(dg.AssetMaterialization(KEY, partition="c", metadata={
            "odd": dg.MetadataValue.json({"rows": [{"__class__": "TableRecord", "data": {"x": 1}}, {"__set__": [1]}]}),
            "none": dg.MetadataValue.float(None), "replicate": 1, "format": dg.MetadataValue.text("rows")}))
        lean = latest_metadata(instance, KEY, ["a", "b", "c"], every)
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=KEY), limit=10).records
    newest = {}
    for r in reversed(records):  # newest last
        newest[r.partition_key] = dict(r.asset_materialization.metadata)
    assert lean == newest
    assert set(lean["a"]) == set(every) - {"odd", "none"} and set(lean["c"]) == {"odd", "none", "replicate", "format"}


def test_the_local_storage_reads_each_materialization_s_metadata_once(tmp_path):
    """A stored event does not change, so the local storage keeps what it has read: a suite's
    process forked ahead reads the rows as they land, and its run reads only the last ones."""
    (tmp_path / "dagster.yaml").write_text(dagster_yaml(tmp_path))
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        for i, row in enumerate(["a", "b"]):
            materialize(instance, row, 0, i / 2)
        first = latest_metadata(instance, KEY, ["a", "b"], LABELS)
        with instance.event_log_storage.index_connection() as conn:  # their events unreadable from now on
            conn.execute(sqlalchemy.text("UPDATE event_logs SET event = '{}' WHERE partition IN ('a', 'b')"))
        materialize(instance, "c", 0, 1.0)
        again = latest_metadata(instance, KEY, ["a", "b", "c"], LABELS)
    assert {row: again[row] for row in ("a", "b")} == first  # read before: not read again
    assert again["c"]["score"] == dg.FloatMetadataValue(1.0)  # new: read
