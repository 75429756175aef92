"""Reading a dataset's verifications back: each row's latest, or each (row, replicate)'s."""

from __future__ import annotations

import dagster as dg
import pytest

from agentenv_dagster.orchestration.rows import latest_metadata, latest_replicates

KEY = dg.AssetKey(["verifications", "t", "v"])
LABELS = ("score", "passed", "results")


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
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
