"""Which dataset rows a run takes: --split, --sample, stratified sampling."""

from __future__ import annotations

import pytest

from agentenv_dagster.spec.coder_eval import Dataset
from agentenv_dagster.spec.coder_eval.dataset import SplitSelectorError, row_sampling, select_rows

ROWS = [{"id": f"r{i}", "expected_skill": "a" if i < 6 else "b", "split": "dev" if i % 2 else "test"}
        for i in range(8)]


def ids(rows):
    return [r["id"] for r in rows]


def test_split_keeps_the_matching_rows_and_refuses_an_empty_selection():
    rows, warnings = select_rows(ROWS, Dataset(rows=ROWS), split="dev")
    assert ids(rows) == ["r1", "r3", "r5", "r7"] and warnings == []
    with pytest.raises(SplitSelectorError, match="no row has split='train'"):
        select_rows(ROWS, Dataset(rows=ROWS), split="train")
    unlabelled = [{"id": "x"}, {"id": "y"}]
    assert ids(select_rows(unlabelled, Dataset(rows=unlabelled), split="dev")[0]) == ["x", "y"]
    partly = [*ROWS[:2], {"id": "z"}]
    rows, warnings = select_rows(partly, Dataset(rows=partly), split="dev")
    assert ids(rows) == ["r1"] and warnings == ["1 unlabelled row(s) dropped by --split dev"]


def test_sample_is_uniform_with_seed_0_and_keeps_dataset_order():
    first, _ = select_rows(ROWS, Dataset(rows=ROWS), sample=3)
    again, _ = select_rows(ROWS, Dataset(rows=ROWS), sample=3)
    assert len(first) == 3 and first == again
    assert ids(first) == sorted(ids(first), key=lambda i: int(i[1:]))


def test_the_sample_seed_picks_the_draw():
    draws = {tuple(ids(select_rows(ROWS, Dataset(rows=ROWS), sample=3, seed=seed)[0])) for seed in range(10)}
    assert len(draws) > 1  # another seed, another draw
    assert select_rows(ROWS, Dataset(rows=ROWS), sample=3, seed=0) == select_rows(ROWS, Dataset(rows=ROWS), sample=3)


def test_stratified_sampling_draws_per_stratum_and_keeps_small_strata_whole():
    dataset = Dataset(rows=ROWS, sample_per_stratum=2, sample_seed=7)
    rows, _ = select_rows(ROWS, dataset)
    by_stratum = {s: [r for r in rows if r["expected_skill"] == s] for s in "ab"}
    assert len(by_stratum["a"]) == 2 and ids(by_stratum["b"]) == ["r6", "r7"]
    assert rows == select_rows(ROWS, dataset)[0]  # seeded: the same draw every time


def test_the_code_location_s_draw_over_row_ids_is_the_cli_s_draw_over_rows():
    for seed in range(20):
        dataset = Dataset(rows=ROWS, sample_per_stratum=2, sample_seed=seed)
        assert row_sampling(ROWS, dataset).draw() == ids(select_rows(ROWS, dataset)[0])
    unseeded = row_sampling(ROWS, Dataset(rows=ROWS, sample_per_stratum=2))
    assert len({tuple(unseeded.draw()) for _ in range(30)}) > 1  # no sample_seed: a new draw each run
    assert row_sampling(ROWS, Dataset(rows=ROWS)) is None
