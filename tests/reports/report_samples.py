"""A small run covering every report path: success with a judge, a failed dataset row carrying
hostile text, an errored task with post-failure evidence, and an ungraded task."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from agentenv_dagster.reports.models import (
    CommandRunResult,
    CommandTelemetry,
    CriterionResultRow,
    EvaluationResult,
    ResultSummary,
    RunSummary,
    TaskConfigRecord,
    TokenUsage,
    TurnRecord,
)

START = datetime(2025, 10, 9, 15, 30, 45, tzinfo=timezone.utc)
# Built at run time so the literal marker never appears in the page source: it shows up only
# if the hostile script actually ran.
HOSTILE_SCRIPT = "<script>document.title = 'PW' + 'NED';</script>"
HOSTILE_IMG = "<img src=x onerror=\"document.body.dataset.owned = 'PW' + 'NED'\">"


def turn(iteration: int, *, cost: float | None) -> TurnRecord:
    return TurnRecord(
        iteration=iteration,
        user_input="Create hello.py that prints hello",
        agent_output="I created hello.py",
        commands=[
            CommandTelemetry(
                tool_name="Bash",
                tool_id="toolu_1",
                parameters={"command": "python hello.py"},
                result_status="success",
                result_summary="hello",
            ),
            CommandTelemetry(tool_name="Write", parameters={"file_path": "hello.py"}, result_status="success"),
        ],
        duration_seconds=3.5,
        token_usage=TokenUsage(
            uncached_input_tokens=1200,
            output_tokens=300,
            cache_creation_input_tokens=100,
            cache_read_input_tokens=400,
            total_cost_usd=cost,
        ),
        model_used="claude-sonnet-4-5",
        assistant_turn_count=3,
        num_turns=3,
        result_summary=ResultSummary(is_error=False, subtype="success", result="done"),
    )


def sample_results() -> list[EvaluationResult]:
    success = EvaluationResult(
        task_id="hello_world",
        task_description="Write a hello world script",
        agent_type="claude-code",
        final_status="SUCCESS",
        weighted_score=0.85,
        duration_seconds=12.25,
        task_config=TaskConfigRecord(
            resolved={"tags": ["smoke"], "run_limits": {"expected_turns": 4}},
            source_file="tasks/hello.yaml",
        ),
        success_criteria_results=[
            CriterionResultRow(
                criterion_type="file_exists", description="hello.py exists", score=1.0, details="1 file matched"
            ),
            CriterionResultRow(
                criterion_type="llm_judge",
                description="Code is idiomatic",
                score=0.7,
                pass_threshold=0.7,
                details="rationale: fine",
                findings=["uses print"],
                token_usage=TokenUsage(uncached_input_tokens=50, output_tokens=10, total_cost_usd=0.002),
                transcript_path="judge-0.yaml",
            ),
            CriterionResultRow(
                criterion_type="commands_efficiency", description="few commands", score=0.5, gating=False
            ),
        ],
        iterations=[turn(1, cost=0.01)],
        pre_run_results=[CommandRunResult(command="pip install -q requests", exit_code=0, stdout="ok")],
        post_run_results=[CommandRunResult(command="ls", exit_code=0, stdout="hello.py\n", duration_seconds=0.1)],
    )
    failed_row = EvaluationResult(
        task_id="sentiment/row-3",
        variant_id="opus",
        replicate_index=1,
        final_status="FAILURE",
        weighted_score=0.0,
        duration_seconds=4.0,
        error_message="criteria not met | see details",
        success_criteria_results=[
            CriterionResultRow(
                criterion_type="classification_match",
                description="label is positive",
                score=0.0,
                details=f"observed (other)\n{HOSTILE_SCRIPT}",
                expected_label="positive",
                observed_label="(other)",
            )
        ],
        iterations=[turn(1, cost=None)],
        post_run_results=[CommandRunResult(command="cat out.txt", exit_code=1, stdout=HOSTILE_IMG, stderr="boom")],
    )
    errored = EvaluationResult(
        task_id="broken_env",
        final_status="BUILD_FAILED",
        weighted_score=0.0,
        error_message="docker build failed",
        error_log_tail="Step 3/7 : RUN false\nreturned a non-zero code: 1",
        post_failure_criteria_results=[
            CriterionResultRow(criterion_type="file_exists", description="out exists", score=0.0),
            CriterionResultRow(
                criterion_type="llm_judge", description="quality", evaluation_status="not_evaluated"
            ),
        ],
    )
    ungraded = EvaluationResult(task_id="exec_only", final_status="NOT_GRADED", iterations=[turn(1, cost=0.02)])
    return [success, failed_row, errored, ungraded]



def sample_summary(results: list[EvaluationResult]) -> RunSummary:
    return RunSummary.from_results(
        "2025-10-09_15-30-45",
        START,
        START + timedelta(seconds=42),
        results,
        skipped=[{"path": "tasks/bad.yaml", "reason": "ValidationError: field 'promt'"}],
        max_parallel=2,
    )
