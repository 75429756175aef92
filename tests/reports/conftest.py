"""Fixtures: the sample run from `report_samples`, fresh for each test, and the real runs of
`viewer_runs`, once a session."""

from __future__ import annotations

import pytest
import viewer_runs
from report_samples import sample_results, sample_summary

from agentenv_dagster.reports.models import EvaluationResult, RunSummary


@pytest.fixture
def results() -> list[EvaluationResult]:
    return sample_results()


@pytest.fixture
def summary(results) -> RunSummary:
    return sample_summary(results)


@pytest.fixture(scope="session")
def ticket_run(tmp_path_factory) -> viewer_runs.Run:
    """The viewer fixtures' experiment, run once by the CLI (tests using it share an xdist group)."""
    return viewer_runs.ticket_experiment(tmp_path_factory.mktemp("tickets"))


@pytest.fixture(scope="session")
def unjudged_run(tmp_path_factory) -> viewer_runs.Run:
    return viewer_runs.unjudged(tmp_path_factory.mktemp("unjudged"))
