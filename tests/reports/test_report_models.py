"""The task.json / run.json schema: upstream field names, computed fields, categories, exit codes."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from report_samples import START, turn
from pydantic import ValidationError

from agentenv_dagster.reports.models import (
    CriterionResultRow,
    EvaluationResult,
    FinalStatus,
    RunSummary,
    TokenUsage,
    exit_code,
)

TASK_JSON_KEYS = {
    "task_id", "task_description", "variant_id", "replicate_index", "agent_type", "model_used",
    "started_at", "completed_at", "duration_seconds", "final_status", "weighted_score",
    "max_turns_exhausted", "iteration_count", "success_criteria_results",
    "post_failure_criteria_results", "iterations", "error_message", "error_details",
    "error_log_tail", "environment_info", "agent_config", "sdk_options", "sandbox_path",
    "task_config", "total_token_usage", "command_stats", "total_assistant_turns",
    "expected_commands", "actual_commands", "commands_efficiency", "pre_run_results",
    "post_run_results", "simulation", "early_stop",
}  # fmt: skip
RUN_JSON_KEYS = {
    "run_id", "start_time", "end_time", "total_duration_seconds", "tasks_run", "tasks_succeeded",
    "tasks_failed", "tasks_error", "tasks_not_graded", "tasks_measured",
    "tasks_token_budget_exceeded", "tasks_cost_budget_exceeded", "skipped_tasks", "max_parallel",
    "task_results", "framework_version", "environment_info",
    # computed on serialization
    "pass_rate", "error_share", "tasks_graded", "total_cost_usd", "agent_cost_usd",
    "eval_overhead_cost_usd", "tasks_cost_incomplete", "cost_complete",
}  # fmt: skip
ROW_KEYS = {
    "task_id", "replicate_index", "variant_id", "status", "weighted_score", "duration",
    "iteration_count", "tags", "task_path", "model_used", "reference_similarity", "input_tokens",
    "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "total_tokens",
    "total_cost_usd", "agent_cost_usd", "judge_cost_usd", "simulator_cost_usd", "cost_complete",
    "expected_commands", "actual_commands", "commands_efficiency", "agent_config", "sdk_options",
    "installed_tools", "total_turns", "visible_turns", "expected_turns", "max_turns_exhausted",
    "has_final_reply", "stopped_early", "early_stop_reason", "turns_remaining_at_stop", "iterations",
}  # fmt: skip


@pytest.mark.parametrize(
    ("status", "category", "icon"),
    [
        ("SUCCESS", "succeeded", "+"),
        ("FAILURE", "failed", "-"),
        ("TIMEOUT", "failed", "T"),
        ("MAX_TURNS_EXHAUSTED", "failed", "M"),
        ("TOKEN_BUDGET_EXCEEDED", "failed", "#"),
        ("COST_BUDGET_EXCEEDED", "failed", "$"),
        ("ERROR", "error", "!"),
        ("BUILD_FAILED", "error", "B"),
        ("NOT_GRADED", "ungraded", "?"),
    ],
)
def test_final_status_category_and_icon(status, category, icon):
    assert (FinalStatus(status).category, FinalStatus(status).icon) == (category, icon)


def test_every_status_is_classified():
    assert len(FinalStatus) == 9
    assert all(s.category and s.icon for s in FinalStatus)


def test_token_usage_serializes_input_tokens_but_not_total_tokens():
    usage = TokenUsage(uncached_input_tokens=10, cache_creation_input_tokens=2, cache_read_input_tokens=3, output_tokens=5)
    dumped = usage.model_dump()
    assert dumped["input_tokens"] == 15
    assert "total_tokens" not in dumped
    assert usage.total_tokens == 20
    assert TokenUsage.model_validate_json(usage.model_dump_json()) == usage


def test_legacy_input_tokens_are_adopted_as_uncached():
    assert TokenUsage.model_validate({"input_tokens": 7, "output_tokens": 1}).uncached_input_tokens == 7


def test_criterion_row_infers_result_kind_and_keeps_basic_rows_lean():
    judge = CriterionResultRow.model_validate({"criterion_type": "llm_judge", "score": 0.5, "transcript": {"x": 1}})
    label = CriterionResultRow.model_validate({"criterion_type": "skill_triggered", "score": 1.0})
    basic = CriterionResultRow(criterion_type="file_exists", description="d", score=1.0)
    assert (judge.result_kind, label.result_kind, basic.result_kind) == ("judge", "classification", "basic")
    assert "transcript" not in judge.model_dump()
    assert set(basic.model_dump()) == {
        "criterion_type", "description", "score", "details", "error", "evaluation_status",
        "pass_threshold", "gating", "result_kind",
    }  # fmt: skip
    assert (basic.pass_threshold, basic.gating, basic.evaluation_status) == (0.9, True, "evaluated")


def test_criterion_row_keeps_unknown_keys_for_round_trips():
    row = CriterionResultRow.model_validate({"criterion_type": "pytest", "score": 1.0, "passed_tests": 4})
    assert row.model_dump()["passed_tests"] == 4


@pytest.mark.parametrize(
    ("row", "verdict"),
    [
        ({"score": 0.95}, "pass"),
        ({"score": 0.5}, "fail"),
        ({"score": 0.5, "gating": False}, "info"),
        ({"score": None}, "not evaluated"),
        ({"score": 0.0, "evaluation_status": "not_evaluated"}, "not evaluated"),
    ],
)
def test_criterion_verdict(row, verdict):
    assert CriterionResultRow(criterion_type="x", **row).verdict == verdict


def test_task_json_has_upstream_field_names_and_round_trips(results):
    success = results[0]
    dumped = json.loads(success.model_dump_json())
    assert set(dumped) == TASK_JSON_KEYS
    assert dumped["final_status"] == "SUCCESS"
    assert EvaluationResult.model_validate_json(success.model_dump_json()) == success


def test_legacy_turns_alias_is_read_as_iterations(results):
    dumped = results[0].model_dump(mode="json")
    dumped["turns"] = dumped.pop("iterations")
    assert EvaluationResult.model_validate(dumped).iterations == results[0].iterations


def test_totals_default_to_what_the_iterations_say(results):
    success = results[0]
    assert (success.iteration_count, success.total_assistant_turns, success.actual_commands) == (1, 3, 2)
    assert success.model_used == "claude-sonnet-4-5"
    assert success.total_token_usage == success.iterations[0].token_usage
    explicit = EvaluationResult(task_id="t", final_status="SUCCESS", iterations=success.iterations, iteration_count=5)
    assert explicit.iteration_count == 5


def test_run_summary_counts_and_computed_fields(summary):
    dumped = json.loads(summary.model_dump_json())
    assert set(dumped) == RUN_JSON_KEYS
    assert (summary.tasks_run, summary.tasks_succeeded, summary.tasks_failed) == (4, 1, 1)
    assert (summary.tasks_error, summary.tasks_not_graded, summary.tasks_measured) == (1, 1, 3)
    assert dumped["tasks_graded"] == 3
    assert dumped["pass_rate"] == pytest.approx(1 / 3)
    assert dumped["error_share"] == pytest.approx(1 / 3)
    assert dumped["total_duration_seconds"] == 42.0
    assert dumped["skipped_tasks"] == [{"path": "tasks/bad.yaml", "reason": "ValidationError: field 'promt'"}]
    assert dumped["max_parallel"] == 2
    assert RunSummary.model_validate_json(summary.model_dump_json()) == summary


def test_run_summary_costs_are_floors_when_a_row_is_unpriced(summary):
    # Agent turns: 0.01 (success), unpriced (failed row), 0.02 (ungraded); judge: 0.002.
    assert summary.agent_cost_usd == pytest.approx(0.03)
    assert summary.eval_overhead_cost_usd == pytest.approx(0.002)
    assert summary.total_cost_usd == pytest.approx(0.032)
    assert (summary.tasks_cost_incomplete, summary.cost_complete) == (1, False)


def test_task_results_rows(summary):
    rows = {row["task_id"]: row for row in summary.task_results}
    assert all(set(row) == ROW_KEYS for row in rows.values())
    hello = rows["hello_world"]
    assert (hello["status"], hello["weighted_score"], hello["duration"]) == ("SUCCESS", 0.85, 12.25)
    assert (hello["input_tokens"], hello["total_tokens"]) == (1200, 2000)
    assert (hello["tags"], hello["task_path"], hello["expected_turns"]) == (["smoke"], "tasks/hello.yaml", 4)
    assert (hello["visible_turns"], hello["has_final_reply"], hello["total_turns"]) == (3, True, 3)
    assert hello["total_cost_usd"] == pytest.approx(0.012)
    assert hello["iterations"] == [
        {"iteration": 1, "duration_seconds": 3.5, "command_count": 2, "assistant_turn_count": 3,
         "crashed": False, "crash_reason": None}
    ]  # fmt: skip
    assert (rows["sentiment/row-3"]["variant_id"], rows["sentiment/row-3"]["replicate_index"]) == ("opus", 1)
    assert rows["exec_only"]["weighted_score"] is None


def test_not_graded_tasks_are_on_neither_side_of_the_pass_rate(results):
    graded = RunSummary.from_results("r", START, START, [results[0], results[3]])
    assert (graded.tasks_graded, graded.pass_rate, exit_code(graded)) == (1, 1.0, 0)


def test_pass_rate_is_null_when_nothing_was_measured(results):
    empty = RunSummary.from_results("r", START, START, [])
    crash = EvaluationResult(task_id="c", final_status="ERROR")
    execute_night = RunSummary.from_results("r", START, START, [results[3], crash])
    all_errors = RunSummary.from_results("r", START, START, [crash])
    assert (empty.pass_rate, empty.error_share) == (None, None)
    assert (execute_night.pass_rate, execute_night.error_share) == (None, None)
    assert (all_errors.pass_rate, all_errors.error_share) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        (["SUCCESS", "SUCCESS"], 0),
        (["SUCCESS", "NOT_GRADED"], 0),
        (["NOT_GRADED"], 0),
        ([], 0),
        (["SUCCESS", "FAILURE"], 1),
        (["SUCCESS", "TIMEOUT"], 1),
        (["SUCCESS", "ERROR"], 1),
        (["BUILD_FAILED"], 1),
    ],
)
def test_exit_code(statuses, code):
    results = [EvaluationResult(task_id=f"t{i}", final_status=s) for i, s in enumerate(statuses)]
    assert exit_code(RunSummary.from_results("r", START, START + timedelta(seconds=1), results)) == code


def test_missing_cost_never_changes_the_exit_code():
    unpriced = EvaluationResult(task_id="t", final_status="SUCCESS", weighted_score=1.0, iterations=[turn(1, cost=None)])
    summary = RunSummary.from_results("r", START, START, [unpriced])
    assert (summary.cost_complete, summary.total_cost_usd, exit_code(summary)) == (False, None, 0)


def test_task_counts_must_add_up():
    with pytest.raises(ValidationError, match=r"task counts do not add up: 1 succeeded .* != 3 run"):
        RunSummary(run_id="r", start_time=START, end_time=START, tasks_run=3, tasks_succeeded=1)
