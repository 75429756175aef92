"""Classifier criteria: one (expected, observed) label pair per row, for suite-level metrics.

``classification_match`` reads the label the agent wrote to a file; ``skill_triggered`` labels
whether the agent engaged a skill (``yes``/``no``) from its tool calls.
"""

from __future__ import annotations

import re

from pydantic import Field

from . import paths
from .base import (
    CheckerMisuseError,
    Criterion,
    CriterionContext,
    CriterionResult,
    LivePolarity,
    StopEarly,
    ToolCall,
)
from .paths import SandboxPath
from .registry import criterion

NONE_LABEL = "(none)"
OTHER_LABEL = "(other)"
YES, NO = "yes", "no"
AVERAGES = ("macro", "weighted", "micro")
CLASSIFICATION_METRICS = ("accuracy", *(f"{average}_f1" for average in AVERAGES))
PER_LABEL_METRICS = ("precision", "recall", "f1")

# Both separators, doubled backslashes from JSON escaping, and overlapping hits (skills/skills/x/).
SKILL_PATH = re.compile(r"(?=skills[\\/]+([A-Za-z0-9][A-Za-z0-9_-]*)[\\/]+)")
# Tools whose engagement counts only when the call succeeded: a failed Read of SKILL.md read
# nothing. Bash is not gated: a failed pipeline may still have printed the skill file.
SUCCESS_GATED_TOOLS = frozenset({"Skill", "Read", "Glob", "Grep"})


class ClassificationCriterion(Criterion):
    def labels(self) -> list[str] | None:
        """The labels its rows are counted under (each with a precision, recall and F1); None
        when a row's own value may add one."""
        raise NotImplementedError

    def suite_metrics(self) -> list[str]:
        labels = self.labels()
        per_label = [f"{metric}.{label}" for label in (labels if labels is not None else ["<label>"])
                     for metric in PER_LABEL_METRICS]
        return [*super().suite_metrics(), *CLASSIFICATION_METRICS, *per_label]

    def unknown_suite_metrics(self) -> list[str]:
        """With labels from the rows, any label's metric may be computed (``f1.macro`` is still
        never: that one is ``macro_f1``)."""
        unknown = super().unknown_suite_metrics()
        if self.labels() is not None:
            return unknown
        return [name for name in unknown
                if name.partition(".")[0] not in PER_LABEL_METRICS or name.partition(".")[2] in AVERAGES]

    def labelled(self, score: float, observed: str, expected: str, source: str) -> CriterionResult:
        details = f"observed={observed!r}, expected={expected!r} ({source})"
        return self.result(score, details=details, result_kind="classification",
                           observed_label=observed, expected_label=expected)


@criterion("classification_match")
class ClassificationMatch(ClassificationCriterion):
    """Binary: the label in ``path`` equals ``expected_label``; stray answers become sentinels."""

    blocking = True

    # the sandbox file holding the agent's label
    path: SandboxPath
    # the right label (usually `${row.label}`)
    expected_label: str
    # the labels there are; any other answer counts as a wrong label of its own
    allowed_labels: list[str] = Field(min_length=1)
    # compare labels case-sensitively
    case_sensitive: bool = False

    def labels(self) -> list[str] | None:
        """The allowed labels, the sentinels and the expected one; None when a row gives it."""
        if "${" in self.expected_label:
            return None
        return list(dict.fromkeys([*self.allowed_labels, NONE_LABEL, OTHER_LABEL, self.canonical(self.expected_label)]))

    def canonical(self, text: str) -> str:
        """Stripped; without case sensitivity, spelled as the allowed label it equals."""
        label = text.strip()
        if not self.case_sensitive:
            spelled = {allowed.lower(): allowed for allowed in reversed(self.allowed_labels)}
            return spelled.get(label.lower(), label)
        return label

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = paths.resolve_one(ctx.sandbox_dir, self.path)
        text = paths.read_text(found) if found is not None and found.is_file() else ""
        observed = self.canonical(text)
        if not observed:
            observed = NONE_LABEL
        elif observed not in self.allowed_labels:
            observed = OTHER_LABEL
        expected = self.canonical(self.expected_label)
        score = 1.0 if observed == expected else 0.0
        return self.labelled(score, observed, expected, f"file '{self.path}'")


def engaged_skills(call: ToolCall) -> set[str]:
    """Skills one call engaged: a ``Skill`` call's skill (namespace stripped), and any
    ``skills/<name>/`` path in a string parameter (how agents without a Skill tool read one)."""
    if call.name in SUCCESS_GATED_TOOLS and call.status != "success":
        return set()
    names: set[str] = set()
    if call.name == "Skill":
        skill = call.parameters.get("skill") or call.skill
        if isinstance(skill, str) and skill:
            names.add(skill.split(":")[-1])
    for value in call.parameters.values():
        if isinstance(value, str):
            names.update(SKILL_PATH.findall(value))
    return names


@criterion("skill_triggered")
class SkillTriggered(ClassificationCriterion):
    """Binary: whether ``skill_name`` was engaged anywhere in the run agrees with whether this
    row expects it (``expected_skill == skill_name``; ``""`` on negative rows)."""

    requires_agent = True

    # the skill whose use is checked
    skill_name: str
    # the skill this row expects (`""` on rows that expect none)
    expected_skill: str
    # arm early stop on this criterion
    stop_early: StopEarly | None = None

    def labels(self) -> list[str] | None:
        return [YES, NO]

    def engaged(self, calls: list[ToolCall]) -> bool:
        return any(self.skill_name in engaged_skills(call) for call in calls)

    def live_polarities(self) -> frozenset[LivePolarity]:
        """A positive row can only live-pass, a distractor row only live-fail."""
        return frozenset({"pass" if self.expected_skill == self.skill_name else "fail"})

    def live_verdict(self, calls: list[ToolCall]) -> bool | None:
        """Undecided until the skill is engaged; then a pass on a positive row, a fail on a distractor."""
        if not self.engaged(calls):
            return None
        return self.expected_skill == self.skill_name

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if ctx.tool_calls is None:
            return self.missing_telemetry()
        if ctx.offered_skills is not None and self.skill_name not in ctx.offered_skills:
            raise CheckerMisuseError(
                f"skill_triggered names skill '{self.skill_name}' but the agent was offered only "
                f"{sorted(ctx.offered_skills)}: the positive control cannot run")
        observed = YES if self.engaged(ctx.tool_calls) else NO
        expected = YES if self.expected_skill == self.skill_name else NO
        score = 1.0 if observed == expected else 0.0
        return self.labelled(score, observed, expected, f"skill_name={self.skill_name!r}")
