"""task.json: `EvaluationResult`, the authoritative record of one replicate, and its parts.

Field names follow upstream's REPORT_SCHEMA verbatim so tools written for Coder Eval read our
files unchanged.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    model_serializer,
    model_validator,
)

from .telemetry import TokenUsage, TurnRecord, now, sum_priced

StatusCategory = Literal["succeeded", "failed", "error", "ungraded"]


class FinalStatus(StrEnum):
    """Terminal status of one replicate; its category decides how it counts in a run."""

    SUCCESS = "SUCCESS"
    FAILURE = "FAILURE"
    ERROR = "ERROR"
    BUILD_FAILED = "BUILD_FAILED"
    TIMEOUT = "TIMEOUT"
    MAX_TURNS_EXHAUSTED = "MAX_TURNS_EXHAUSTED"
    TOKEN_BUDGET_EXCEEDED = "TOKEN_BUDGET_EXCEEDED"
    COST_BUDGET_EXCEEDED = "COST_BUDGET_EXCEEDED"
    NOT_GRADED = "NOT_GRADED"

    @property
    def category(self) -> StatusCategory:
        return _STATUS_STYLE[self][0]

    @property
    def icon(self) -> str:
        """One character for tables and CLI lines."""
        return _STATUS_STYLE[self][1]


# BUILD_FAILED is an environment fault, so it counts as an error rather than a task failure.
_STATUS_STYLE: dict[FinalStatus, tuple[StatusCategory, str]] = {
    FinalStatus.SUCCESS: ("succeeded", "+"),
    FinalStatus.FAILURE: ("failed", "-"),
    FinalStatus.TIMEOUT: ("failed", "T"),
    FinalStatus.MAX_TURNS_EXHAUSTED: ("failed", "M"),
    FinalStatus.TOKEN_BUDGET_EXCEEDED: ("failed", "#"),
    FinalStatus.COST_BUDGET_EXCEEDED: ("failed", "$"),
    FinalStatus.ERROR: ("error", "!"),
    FinalStatus.BUILD_FAILED: ("error", "B"),
    FinalStatus.NOT_GRADED: ("ungraded", "?"),
}


ResultKind = Literal["basic", "judge", "classification"]
_KIND_BY_CRITERION_TYPE: dict[str, ResultKind] = {
    "llm_judge": "judge",
    "agent_judge": "judge",
    "classification_match": "classification",
    "skill_triggered": "classification",
}
_KIND_FIELDS = ("observed_label", "expected_label", "findings", "token_usage", "transcript_path")
Verdict = Literal["pass", "fail", "info", "not evaluated"]


class CriterionResultRow(BaseModel):
    """One criterion's result in task.json; one class for all three upstream result kinds.

    Unknown keys are kept so rows written by newer checkers round-trip.
    """

    model_config = ConfigDict(extra="allow")

    criterion_type: str
    description: str = ""
    score: float | None = Field(default=None, ge=0.0, le=1.0)
    details: str | None = None
    error: str | None = None
    evaluation_status: Literal["evaluated", "not_evaluated"] = "evaluated"
    pass_threshold: float = Field(default=0.9, ge=0.0, le=1.0)
    gating: bool = True
    result_kind: ResultKind = "basic"
    observed_label: str | None = None
    expected_label: str | None = None
    findings: list[str] | None = None
    token_usage: TokenUsage | None = None
    transcript_path: str | None = None
    # ours: on a run the stop_early watcher cut, an unarmed criterion is shown but does not gate
    advisory: bool = False

    @model_validator(mode="before")
    @classmethod
    def _infer_result_kind(cls, data: Any) -> Any:
        """Legacy rows lack `result_kind`; upstream infers it from the criterion type."""
        if isinstance(data, dict) and not data.get("result_kind"):
            kind = _KIND_BY_CRITERION_TYPE.get(data.get("criterion_type", ""), "basic")
            return {**data, "result_kind": kind}
        return data

    @model_serializer(mode="wrap")
    def _drop_unused_kind_fields(self, handler: Any) -> dict[str, Any]:
        """Basic rows look like upstream's; a judge transcript lives beside task.json, not in it."""
        data = handler(self)
        data.pop("transcript", None)
        if not data.get("advisory"):
            data.pop("advisory", None)
        return {k: v for k, v in data.items() if not (k in _KIND_FIELDS and v is None)}

    @property
    def verdict(self) -> Verdict:
        """What reports show: informational criteria never read as failed."""
        if self.evaluation_status == "not_evaluated" or self.score is None:
            return "not evaluated"
        if not self.gating:
            return "info"
        return "pass" if self.score >= self.pass_threshold else "fail"


class CommandRunResult(BaseModel):
    """A pre_run/post_run command's outcome; `exit_code` is None when it never finished."""

    command: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_seconds: float = 0.0
    error: str | None = None


class EarlyStopInfo(BaseModel):
    """Why and when the stop_early watcher cut the run; its presence is the stopped flag."""

    reason: Literal["criterion_passed", "criterion_failed", "decision_budget_exceeded"]
    deciding_criterion_type: str
    deciding_criterion_description: str = ""
    armed_criteria: list[str] = Field(default_factory=list)
    sdk_turn_index: int = 0
    tool_call_index: int = Field(default=1, ge=1)
    elapsed_seconds: float = 0.0
    turns_remaining_at_stop: int | None = None
    gate_threshold: float = 1.0


class TaskConfigRecord(BaseModel):
    """The resolved task as run, its source text, and which layer set each field."""

    resolved: dict[str, Any] = Field(default_factory=dict)
    source_yaml: str = ""
    source_file: str | None = None
    lineage: dict[str, dict[str, Any]] = Field(default_factory=dict)


class EvaluationResult(BaseModel):
    """task.json: the authoritative record of one replicate.

    A runner fills what it knows; `iteration_count`, `total_token_usage`,
    `total_assistant_turns`, `actual_commands` and `model_used` default to what the
    iterations say. `replicate_index` is ours: it names the `<NN>` folder and the row.
    """

    task_id: str
    task_description: str = ""
    variant_id: str = "default"
    replicate_index: int = Field(default=0, ge=0)
    agent_type: str = "unknown"
    model_used: str | None = None
    started_at: datetime = Field(default_factory=now)
    completed_at: datetime | None = None
    duration_seconds: float = 0.0
    final_status: FinalStatus
    weighted_score: float | None = Field(default=None, ge=0.0, le=1.0)
    max_turns_exhausted: bool = False
    iteration_count: int = 0
    success_criteria_results: list[CriterionResultRow] = Field(default_factory=list)
    post_failure_criteria_results: list[CriterionResultRow] = Field(default_factory=list)
    iterations: list[TurnRecord] = Field(
        default_factory=list, validation_alias=AliasChoices("iterations", "turns")
    )
    error_message: str | None = None
    error_details: dict[str, Any] | None = None
    error_log_tail: str | None = None
    environment_info: dict[str, Any] = Field(default_factory=dict)
    agent_config: dict[str, Any] | None = None
    sdk_options: dict[str, Any] | None = None
    sandbox_path: str | None = None
    task_config: TaskConfigRecord | None = None
    total_token_usage: TokenUsage | None = None
    command_stats: dict[str, Any] | None = None
    total_assistant_turns: int | None = None
    expected_commands: int | None = None
    actual_commands: int | None = None
    commands_efficiency: float | None = None
    pre_run_results: list[CommandRunResult] = Field(default_factory=list)
    post_run_results: list[CommandRunResult] = Field(default_factory=list)
    simulation: dict[str, Any] | None = None
    early_stop: EarlyStopInfo | None = None

    @model_validator(mode="after")
    def _derive_from_iterations(self) -> EvaluationResult:
        """Fill the totals a runner left unset from the turns, so they cannot disagree."""
        given, turns = self.model_fields_set, self.iterations
        if not turns:
            return self
        usages = [t.token_usage for t in turns if t.token_usage is not None]
        derived = {
            "iteration_count": len(turns),
            "total_token_usage": sum(usages, TokenUsage()) if usages else None,
            "total_assistant_turns": sum(t.assistant_turn_count for t in turns),
            "actual_commands": sum(len(t.commands) for t in turns),
            "model_used": next((t.model_used for t in turns if t.model_used), None),
        }
        for name, value in derived.items():
            if name not in given:
                setattr(self, name, value)
        return self

    @property
    def has_final_reply(self) -> bool:
        """Upstream's rule: some turn's result message carries non-blank text."""
        return any(
            t.result_summary is not None and (t.result_summary.result or "").strip()
            for t in self.iterations
        )

    @property
    def judge_cost_usd(self) -> float | None:
        return sum_priced(
            c.token_usage.total_cost_usd for c in self.success_criteria_results if c.token_usage
        )

    @property
    def cost_complete(self) -> bool:
        """False when any spend (agent turn or judge call) went unpriced."""
        usages = [self.total_token_usage, *(t.token_usage for t in self.iterations)]
        usages += [c.token_usage for c in self.success_criteria_results]
        return not any(u.unpriced for u in usages if u is not None)
