"""The criterion contract: what a checker reads, what it returns, and how results combine.

A criterion type is a pydantic model of its task-file fields plus ``async check(ctx)``;
``evaluate`` wraps ``check`` so that any fault in a checker scores 0.0 with the error
recorded, except a ``CheckerMisuseError`` (the task definition is wrong) or a
``JudgeInfrastructureError`` (the judge's API failed): neither may count against the agent.
A check that overruns the task's time limit (``CriterionContext.time_limit``) is such a
fault; one that works on the sandbox's files synchronously runs on a worker thread, so the
limit holds while it works.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EvaluationStatus = Literal["evaluated", "not_evaluated"]
ResultKind = Literal["basic", "classification", "judge"]
LivePolarity = Literal["pass", "fail"]


class CheckerMisuseError(Exception):
    """A task-definition fault found while checking: the task is an ERROR, not a FAILURE."""


class JudgeInfrastructureError(Exception):
    """A judge's model could not be used (an API error left after retries, no connection):
    the task is an ERROR, not a FAILURE."""


@dataclass
class ToolCall:
    """One tool call of the agent's run (Coder Eval's ``CommandTelemetry``), crashed turns included."""

    name: str
    parameters: dict
    status: str | None  # "success" | "error" | "unknown" (closed by a crash) | None (in flight)
    duration_seconds: float | None = None
    result: str | None = None
    skill: str | None = None


@dataclass
class CriterionContext:
    """Everything a checker may read. ``tool_calls`` is None when the run has no agent
    telemetry at all (agentless task, lost trajectory), which agent criteria report as an error;
    ``offered_skills`` is None when the agent's offered skills are unknown."""

    sandbox_dir: Path
    task_dir: Path
    reference_dir: Path | None
    tool_calls: list[ToolCall] | None
    final_text: str
    expected_commands: int | None = None
    row: dict | None = None
    env: dict[str, str] = field(default_factory=dict)
    offered_skills: frozenset[str] | None = None
    # Runs run_command criteria where the agent ran (its container); None = on the host.
    # Anything with ``async run(command, timeout, env) -> exit_code/stdout/stderr/timed_out``.
    shell: Any = None
    # The ``AgentEnvConfig`` in force (judges read [model] from it); None = the config found
    # from ``task_dir`` upwards (or AGENT_ENV_CONFIG), as the CLI would find it.
    config: Any = None
    # The conversation for ``include_dialog``: ``[{"user": ..., "agent": ...}]`` per turn;
    # None = one turn built from ``final_text`` (the prompt is not known to the checker).
    dialog: list[dict[str, str]] | None = None
    # Seconds the criteria may take in all, from ``started`` (the task's time limit); None: no limit.
    time_limit: float | None = None
    started: float = field(default_factory=time.monotonic)

    def time_left(self) -> float | None:
        return None if self.time_limit is None else max(0.0, self.started + self.time_limit - time.monotonic())


@dataclass
class CriterionResult:
    """One criterion's verdict; ``to_dict()`` is its row in task.json. ``weight`` is kept for
    ``weighted_score`` but is not part of the row (``gating`` carries what readers need)."""

    criterion_type: str
    description: str
    score: float | None
    weight: float = 1.0
    details: str = ""
    error: str | None = None
    evaluation_status: EvaluationStatus = "evaluated"
    pass_threshold: float = 0.9
    result_kind: ResultKind = "basic"
    observed_label: str | None = None
    expected_label: str | None = None
    findings: list[str] = field(default_factory=list)
    token_usage: dict[str, Any] | None = None
    transcript_path: str | None = None
    # The judge exchange (prompt, replies, verdict); kept in the row, written beside task.json
    # as judge-N.yaml by ``write_judge_transcripts``, never inside task.json.
    transcript: dict[str, Any] | None = None
    # On a run the stop_early watcher cut, an unarmed criterion is graded but does not gate.
    advisory: bool = False

    @property
    def gating(self) -> bool:
        return self.weight > 0

    @property
    def graded(self) -> bool:
        return self.score is not None

    @property
    def passed(self) -> bool | None:
        return None if self.score is None else self.score >= self.pass_threshold

    def to_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "criterion_type": self.criterion_type,
            "description": self.description,
            "score": self.score,
            "details": self.details,
            "error": self.error,
            "evaluation_status": self.evaluation_status,
            "pass_threshold": self.pass_threshold,
            "gating": self.gating,
            "result_kind": self.result_kind,
        }
        if self.result_kind == "classification":
            row.update(observed_label=self.observed_label, expected_label=self.expected_label)
        if self.result_kind == "judge":
            row.update(findings=list(self.findings), token_usage=self.token_usage, transcript_path=self.transcript_path)
            if self.transcript is not None:
                row["transcript"] = self.transcript
        if self.advisory:
            row["advisory"] = True
        return row


class StopEarly(BaseModel):
    """Arms a live-observable criterion for early stop; its presence is the arming."""

    model_config = ConfigDict(extra="forbid")

    # `stop`: end the run as soon as the armed criteria are sure to pass
    on_pass: Literal["continue", "stop"] = "continue"
    # still undecided after this many tool calls: the criterion counts as failed
    decide_within: int | None = Field(default=None, ge=1)


# What every criterion's suite aggregate computes (``aggregate.py``): the ``suite_thresholds`` names it may gate on.
SCORE_METRICS = ("count", "mean", "median", "std", "min", "max", "completion_rate")


class Criterion(BaseModel):
    """Fields every criterion type shares; subclasses add theirs and implement ``check``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type_name: ClassVar[str] = ""
    requires_agent: ClassVar[bool] = False
    # Reads or walks the sandbox synchronously: ``evaluate`` runs it on a worker thread.
    blocking: ClassVar[bool] = False

    # the criterion type
    type: str
    # what the criterion checks, as reports show it
    description: str
    # its weight in the task's score; 0 = informational, never gates
    weight: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    # the score at which it passes
    pass_threshold: float = Field(default=0.9, ge=0, le=1)
    # gates on the dataset's aggregate (`accuracy`, `macro_f1`, `mean`, ...)
    suite_thresholds: dict[str, float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_type(cls, data: Any) -> Any:
        """Constructing a model directly may omit ``type``; a task file always names it."""
        if isinstance(data, dict) and "type" not in data and cls.type_name:
            return {"type": cls.type_name, **data}
        return data

    @field_validator("type")
    @classmethod
    def _own_type(cls, value: str) -> str:
        if cls.type_name and value != cls.type_name:
            raise ValueError(f"type must be '{cls.type_name}', got '{value}'")
        return value

    @model_validator(mode="after")
    def _informational_cannot_gate(self) -> Criterion:
        """A weight-0 criterion is informational; arming it for a gate would let it fail a run."""
        if self.weight == 0:
            for name in ("stop_early", "suite_thresholds"):
                if getattr(self, name, None) is not None:
                    raise ValueError(f"a criterion with weight 0 is informational and may not set {name}")
        return self

    def suite_metrics(self) -> list[str]:
        """The metrics its suite aggregate computes: what ``suite_thresholds`` may name."""
        return list(SCORE_METRICS)

    def unknown_suite_metrics(self) -> list[str]:
        """The ``suite_thresholds`` names its aggregate never computes. Upstream reads a missing
        metric as not met, so a gate on one always fails (a misspelling, or ``f1.macro`` for
        ``macro_f1``)."""
        known = set(self.suite_metrics())
        return [name for name in self.suite_thresholds or {} if name not in known]

    def live_polarities(self) -> frozenset[LivePolarity]:
        """The verdicts ``live_verdict`` can reach on a growing trajectory for these fields;
        empty for a criterion that cannot be observed live (it has no ``stop_early`` block)."""
        return frozenset()

    async def evaluate(self, ctx: CriterionContext) -> CriterionResult:
        """Run the checker within the time left; a fault in it (an overrun included) is the
        agent's 0.0, a misuse of it propagates."""
        try:
            checking = _on_worker_thread(self.check, ctx) if self.blocking else self.check(ctx)
            return await asyncio.wait_for(checking, ctx.time_left())
        except (CheckerMisuseError, JudgeInfrastructureError):
            raise
        except TimeoutError as exc:
            if ctx.time_left() != 0:  # the checker's own timeout, not the task's deadline
                return self.result(0.0, details="Check failed", error=f"{type(exc).__name__}: {exc}")
            return self.result(0.0, details="Check timed out",
                               error=f"the check did not finish within the task's time limit ({ctx.time_limit:g} s)")
        except Exception as exc:  # noqa: BLE001 - any checker fault is scored, by contract
            return self.result(0.0, details="Check failed", error=f"{type(exc).__name__}: {exc}")

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        """Grade the run from what ``ctx`` holds (the sandbox folder, the agent's tool calls
        and final text, the row); return ``self.result(score, details=...)``. A fault raised
        here scores 0.0 with the error recorded; raise ``CheckerMisuseError`` for a task
        definition that cannot be checked.

        ```python
        async def check(self, ctx):
            found = (ctx.sandbox_dir / self.path).is_file()
            return self.result(1.0 if found else 0.0, details=f"{self.path} {'exists' if found else 'is missing'}")
        ```
        """
        raise NotImplementedError(f"criterion type '{self.type}' does not implement check()")

    def result(self, score: float | None, details: str = "", error: str | None = None, **extra: Any) -> CriterionResult:
        """A result stamped with this criterion's identity, threshold and weight."""
        return CriterionResult(
            criterion_type=self.type, description=self.description, score=score, details=details,
            error=error, pass_threshold=self.pass_threshold, weight=self.weight, **extra,
        )

    def missing_telemetry(self) -> CriterionResult:
        """The shared answer of agent criteria when the run left no tool-call telemetry."""
        return self.result(0.0, details="No turn records available",
                           error="turn_records not provided to checker (no agent telemetry for this run)")


async def _on_worker_thread(check, ctx: CriterionContext) -> CriterionResult:
    """``check(ctx)`` on a daemon thread with a loop of its own. Awaiting it can be cancelled
    at the deadline while the thread finishes on its own (its walks and reads are bounded),
    and it never holds up the interpreter's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[CriterionResult] = loop.create_future()

    def settle(result: CriterionResult | None, error: BaseException | None) -> None:
        if done.done():  # abandoned at the deadline
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def work() -> None:
        try:
            outcome: tuple = (asyncio.run(check(ctx)), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting loop as is
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the check ran: nobody waits for it
            pass

    threading.Thread(target=work, name="criterion-check", daemon=True).start()
    return await done


def weighted_score(results: list[CriterionResult]) -> float | None:
    """Σ wᵢsᵢ / Σ wᵢ over gating, graded criteria; None when no gating criterion was graded."""
    counted = [r for r in results if r.gating and r.graded]
    if not counted:
        return None
    total = math.fsum(r.weight for r in counted)
    return math.fsum(r.weight * r.score for r in counted) / total  # type: ignore[operator]


def task_passed(
    results: list[CriterionResult], *, armed: Sequence[bool] | None = None, gate_threshold: float = 1.0,
) -> bool | None:
    """Strict AND over gating criteria. On a run the stop_early watcher cut (``armed`` given,
    aligned with ``results``), only the armed subset gates instead: the weighted share of it that
    passed must reach ``gate_threshold`` (at 1.0, exactly a strict AND over the armed).
    None when a criterion that gates is not graded (never a guess)."""
    if armed is None:
        gating = [r for r in results if r.gating]
    else:
        gating = [r for r, is_armed in zip(results, armed, strict=True) if is_armed]
    if any(not r.graded for r in gating):
        return None
    if armed is None or not gating:
        return all(r.passed for r in gating)
    total = math.fsum(r.weight for r in gating)
    return math.fsum(r.weight for r in gating if r.passed) / total >= gate_threshold


async def evaluate_all(criteria: list[Criterion], ctx: CriterionContext) -> list[CriterionResult]:
    """Criteria run one after another, in task order: commands they run share the sandbox."""
    return [await criterion.evaluate(ctx) for criterion in criteria]
