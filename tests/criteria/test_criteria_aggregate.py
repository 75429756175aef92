"""Suite-level aggregation of one criterion: score statistics, classification metrics, thresholds."""

from __future__ import annotations

import pytest

from agentenv_dagster.criteria import CriterionResult, aggregate


def labelled(expected, observed):
    return CriterionResult("classification_match", "row", 1.0 if expected == observed else 0.0,
                           result_kind="classification", expected_label=expected, observed_label=observed)


def basic(score):
    return CriterionResult("file_exists", "row", score)


MISLABELLED = [labelled("positive", "positive"), labelled("negative", "negative"), labelled("negative", "positive")]


def test_three_row_mislabelled_example():
    result = aggregate(MISLABELLED)
    m = result.metrics
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert (m["recall.positive"], m["recall.negative"]) == (1.0, 0.5)
    assert (m["precision.positive"], m["precision.negative"]) == (0.5, 1.0)
    assert m["f1.positive"] == pytest.approx(2 / 3) and m["f1.negative"] == pytest.approx(2 / 3)
    assert m["macro_f1"] == pytest.approx(2 / 3) and m["weighted_f1"] == pytest.approx(2 / 3)
    assert m["micro_f1"] == pytest.approx(m["accuracy"])
    assert result.details["labels"] == ["negative", "positive"]
    assert result.details["confusion"] == [
        {"expected": "negative", "observed": "negative", "count": 1},
        {"expected": "negative", "observed": "positive", "count": 1},
        {"expected": "positive", "observed": "positive", "count": 1},
    ]
    assert result.details["total_pairs"] == 3
    assert result.details["per_label"][0] == {
        "label": "negative", "precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3), "support": 2}


def test_rows_without_labels_get_baseline_stats_only():
    result = aggregate([basic(1.0), basic(0.5), basic(0.0)])
    assert result.metrics == {"count": 3.0, "mean": 0.5, "median": 0.5, "std": pytest.approx(0.408248, abs=1e-6),
                              "min": 0.0, "max": 1.0}
    assert result.details == {}
    assert aggregate([basic(0.7)]).metrics["std"] == 0.0


def test_empty_or_ungraded_rows_have_no_aggregate():
    assert aggregate([]) is None
    assert aggregate([CriterionResult("llm_judge", "row", None)]) is None


def test_baseline_and_classification_merge():
    metrics = aggregate(MISLABELLED).metrics
    assert metrics["mean"] == pytest.approx(2 / 3) and "accuracy" in metrics and metrics["count"] == 3.0


def test_perfect_predictions_score_one_everywhere():
    metrics = aggregate([labelled("yes", "yes"), labelled("no", "no")]).metrics
    assert all(metrics[k] == 1.0 for k in metrics if "." in k or k.endswith("f1") or k == "accuracy")


def test_a_label_with_no_support_and_sentinels():
    result = aggregate([labelled("positive", "(other)"), labelled("positive", "(none)"), labelled("positive", "positive")])
    m = result.metrics
    assert (m["recall.(other)"], m["precision.(other)"], m["f1.(none)"]) == (0.0, 0.0, 0.0)
    assert result.details["labels"] == ["(none)", "(other)", "positive"]
    assert m["recall.positive"] == pytest.approx(1 / 3) and m["precision.positive"] == 1.0


def test_thresholds_gate_the_aggregate():
    assert aggregate(MISLABELLED).passed is True  # no thresholds
    met = aggregate(MISLABELLED, {"accuracy": 0.6, "recall.positive": 0.9})
    assert met.passed and [c.passed for c in met.checks] == [True, True]
    failing = aggregate(MISLABELLED, {"accuracy": 0.6, "recall.negative": 0.9})
    assert not failing.passed
    recall = failing.checks[1]
    assert (recall.metric, recall.min_value, recall.actual_value, recall.passed) == ("recall.negative", 0.9, 0.5, False)
    missing = aggregate(MISLABELLED, {"f1.macro": 0.5})
    assert (missing.checks[0].actual_value, missing.passed, missing.metric("f1.macro")) == (None, False, 0.0)


def test_default_aggregate_works_for_any_criterion():
    result = aggregate([basic(1.0), basic(1.0)], {"mean": 1.0, "min": 1.0})
    assert result.passed and result.criterion_type == "file_exists"


def test_the_metrics_a_criterion_names_as_gateable_are_the_ones_its_aggregate_computes():
    """What the load-time warning on ``suite_thresholds`` accepts is what ``aggregate`` emits."""
    from agentenv_dagster.criteria import parse_criterion

    label = parse_criterion({"type": "classification_match", "path": "l.txt", "description": "d",
                             "expected_label": "positive", "allowed_labels": ["positive", "negative"]})
    computed = aggregate(MISLABELLED, suite_metrics={"completion_rate": 1.0}).metrics
    assert set(computed) <= set(label.suite_metrics())
    assert set(label.suite_metrics()) - set(computed) == {  # the sentinels, counted when a row answers off-label
        f"{metric}.{sentinel}" for metric in ("precision", "recall", "f1") for sentinel in ("(none)", "(other)")}
    exists = parse_criterion({"type": "file_exists", "path": "a", "description": "d"})
    assert set(exists.suite_metrics()) == set(aggregate([basic(1.0)], suite_metrics={"completion_rate": 1.0}).metrics)
