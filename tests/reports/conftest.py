"""Fixtures: the sample run from `report_samples`, fresh for each test."""

from __future__ import annotations

import pytest
from report_samples import sample_results, sample_summary

from agentenv_dagster.reports.models import EvaluationResult, RunSummary


@pytest.fixture
def results() -> list[EvaluationResult]:
    return sample_results()


@pytest.fixture
def summary(results) -> RunSummary:
    return sample_summary(results)
