"""A Coder Eval task definition (one task YAML) and its smaller blocks.

The top level is lenient on purpose (as upstream): an unknown top-level key is dropped with a
warning, because many checked-in tasks carry dead keys. Every nested block is strict. The
model-level rules run in upstream's order and stop at the first that fails.
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from ...errors import SpecError
from ...ids import safe_id
from .agents import AgentField, AnthropicAgentConfig, ReplayAgentConfig
from .base import Strict, note
from .criteria import agent_only_types, first_suite_thresholds, parse_success_criteria, reference_offenders
from .dataset import Dataset
from .limits import RunLimits
from .merge import APPEND
from .sandbox import SandboxConfig

TAG_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*(:[a-z0-9]+(-[a-z0-9]+)*)?$")

# Top-level keys that moved; named in the unknown-key warning instead of a "did you mean".
MOVED_TOP_LEVEL_KEYS = {
    "task_timeout": "run_limits.task_timeout",
    "max_turns": "run_limits.max_turns",
    "turn_timeout": "run_limits.turn_timeout",
}


class SimulationConfig(Strict):
    """A multi-turn dialog with a simulated user instead of one prompt."""

    # turn the simulated user on
    enabled: bool = False
    # who the simulated user is
    persona: str
    # what the simulated user wants from the agent
    goal: str
    # rules the simulated user keeps to
    constraints: list[str] = Field(default_factory=list)
    # the dialog's turns at most
    max_turns: int = Field(default=8, ge=1, le=100)
    # what the simulated user says to end the dialog
    stop_token: str = Field(default="<<<END>>>", min_length=1)
    # end the dialog once the criteria pass (needs per-turn checks)
    stop_on_criteria_pass: bool = False
    # a token budget for the whole dialog
    max_total_tokens: int | None = Field(default=None, gt=0)
    # run the dialog this many times (replicates)
    n_trials: int = Field(default=1, ge=1, le=100)
    # when the criteria run: at the dialog's end, after every turn, or both
    check_criteria: Literal["end_of_dialog", "every_turn", "both"] = "end_of_dialog"
    # ours: who plays the user (upstream: a tools-disabled Claude Code agent on the agent's
    # route). Default: the ``anthropic`` agent on the configured model; ``replay`` runs offline.
    simulator: Annotated[ReplayAgentConfig | AnthropicAgentConfig, Field(discriminator="type")] | None = None

    @field_validator("persona", "goal")
    @classmethod
    def _non_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value

    @model_validator(mode="after")
    def _early_end_needs_per_turn_checks(self) -> "SimulationConfig":
        if self.stop_on_criteria_pass and self.check_criteria == "end_of_dialog":
            raise SpecError(
                "simulation.stop_on_criteria_pass=True requires check_criteria='every_turn' or 'both' — "
                "set check_criteria accordingly, or disable stop_on_criteria_pass.",
                field="stop_on_criteria_pass",
            )
        return self


class ReferenceSource(Strict):
    """A reference solution: always a directory (relative to the task YAML), never shown to
    the agent, exposed to criteria as ``$REFERENCE_DIR``."""

    directory: str

    @model_validator(mode="before")
    @classmethod
    def _removed_forms(cls, data: Any) -> Any:
        if isinstance(data, dict):
            removed = [key for key in ("code", "file") if key in data]
            if removed:
                raise SpecError(
                    f"reference.{'/'.join(removed)} was removed — a reference is now always a DIRECTORY. "
                    "Move the solution into a directory and use `reference: {directory: <dir>}` "
                    "(a single-file reference is a directory containing one file). "
                    "See docs/TASK_DEFINITION_GUIDE.md#reference-solutions.",
                    field=removed[0],
                )
        return data

    @field_validator("directory")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("reference.directory must be a non-empty path relative to the task YAML directory.")
        return value.strip()


class PostRunCommand(Strict):
    """Runs after grading; never changes the verdict."""

    # a shell command, run in the sandbox
    command: str
    # seconds before the command is killed
    timeout: int = Field(default=30, ge=1, le=300)


class PreRunCommand(PostRunCommand):
    """Runs before the agent; a failure aborts the task (ERROR) unless ``fail_on_error: false``."""

    # a failing command aborts the task as an ERROR
    fail_on_error: bool = True


class TaskDefinition(BaseModel):
    """One evaluation task: prompt, agent, sandbox, caps and the criteria that grade it."""

    model_config = ConfigDict(allow_inf_nan=False)

    # the task's id: its job name (sanitized) and its rows' prefix (`<task_id>/<row_id>`)
    task_id: safe_id("task_id")  # it names the task's records and artifacts
    # what the task asks, for reports and the UI
    description: str
    # the prompt (`${row.field}` filled from a dataset row); exclusive with `initial_prompt_file`
    initial_prompt: str | None = None
    # a file holding the prompt, relative to the task YAML
    initial_prompt_file: str | None = None
    # kebab-case tags, optionally `key:value` (`schedule:daily` gives the task a schedule)
    tags: list[str] = Field(default_factory=list)
    # listed but never run, unless `--include-skipped`
    skip: bool = False
    # the agent under test, chosen by `type`; may be left to an experiment layer
    agent: AgentField = None
    # the workspace the agent works in: a temp folder or a container, and what is in it
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    # the checks that grade the run (at least one); weight 0 = informational
    success_criteria: Annotated[list[SerializeAsAny[BaseModel]], BeforeValidator(parse_success_criteria)]
    # caps on turns, time, tool calls, tokens and cost
    run_limits: RunLimits | None = None
    # a reference solution: never shown to the agent, given to criteria as `$REFERENCE_DIR`
    reference: ReferenceSource | None = None
    # the tool calls a good run needs, for `commands_efficiency` and the reports
    expected_commands: int | None = Field(default=None, ge=1)
    # commands run in the sandbox before the agent; a failure aborts the task unless `fail_on_error:
    # false`
    pre_run: Annotated[list[PreRunCommand], APPEND] = Field(default_factory=list)
    # commands run after grading; they never change the verdict
    post_run: Annotated[list[PostRunCommand], APPEND] = Field(default_factory=list)
    # rows to run the task over, one row-task each (a partition per row in Dagster)
    dataset: Dataset | None = None
    # set on a dataset's row-tasks (the dataset task's id); not written by authors
    suite_id: str | None = None
    # set on a dataset's row-tasks (the row's id); not written by authors
    row_id: str | None = None
    # a multi-turn dialog with a simulated user instead of one prompt
    simulation: SimulationConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _warn_on_unknown_fields(cls, data: Any, info: ValidationInfo) -> Any:
        """Unknown top-level keys are dropped (with a warning each), never an error."""
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    note(info, _unknown_top_level(str(key), list(cls.model_fields)), field=str(key))
        return data

    @field_validator("tags")
    @classmethod
    def _kebab_case_tags(cls, tags: list[str]) -> list[str]:
        for index, tag in enumerate(tags):
            if not TAG_PATTERN.match(tag):
                raise SpecError(
                    f"Tag '{tag}' must be lowercase kebab-case, optionally namespaced as "
                    "'key:value' (e.g., 'smoke', 'uipath-python', 'lifecycle:generate')",
                    field=str(index),
                )
        return tags

    @property
    def is_none_agent(self) -> bool:
        """The task runs no agent (``agent: {type: none}``)."""
        return self.agent is not None and self.agent.type == "none"

    @property
    def in_simulation(self) -> bool:
        return self.simulation is not None and self.simulation.enabled

    @model_validator(mode="after")
    def _prompt_fields(self) -> "TaskDefinition":
        if self.initial_prompt is not None and self.initial_prompt_file is not None:
            raise SpecError(
                "Only one of 'initial_prompt' or 'initial_prompt_file' can be provided, not both",
                field="initial_prompt_file",
            )
        if self.initial_prompt is None and self.initial_prompt_file is None and not (
            self.in_simulation or self.is_none_agent
        ):
            raise SpecError(
                "Either 'initial_prompt' or 'initial_prompt_file' must be provided "
                "(unless 'simulation.enabled' is true, in which case the simulator generates the opener, "
                "or 'agent.type' is 'none', in which case no agent runs)",
                field="initial_prompt",
            )
        return self

    @model_validator(mode="after")
    def _none_agent(self) -> "TaskDefinition":
        """A ``type: none`` task has nobody to read a prompt, hold a dialog or leave a trajectory."""
        if not self.is_none_agent:
            return self
        if self.initial_prompt is not None or self.initial_prompt_file is not None:
            raise SpecError(
                "A 'type: none' task must not set 'initial_prompt' / 'initial_prompt_file' "
                "(no agent runs to read it). Remove the prompt or pick a real agent type.",
                field="initial_prompt" if self.initial_prompt is not None else "initial_prompt_file",
            )
        if self.in_simulation:
            raise SpecError(
                "A 'type: none' task cannot enable 'simulation' (no agent for the simulator to talk to). "
                "Remove the simulation block or pick a real agent type.",
                field="simulation.enabled",
            )
        offending = agent_only_types(self.success_criteria)
        if offending:
            raise SpecError(
                f"A 'type: none' task cannot use criteria that require an agent trajectory: {offending}. "
                "Use agent-independent criteria (run_command, file_exists, file_contains, json_check, "
                "file_matches_regex, file_check, ...).",
                field="success_criteria",
            )
        return self

    @model_validator(mode="after")
    def _reference_consumers_have_a_reference(self) -> "TaskDefinition":
        """``include_reference: true`` is not an offender: it is documented to no-op without one."""
        offenders = reference_offenders(self.success_criteria) if self.reference is None else []
        if offenders:
            raise SpecError(
                "These criteria consume the reference solution but the task defines no "
                f"'reference:' block: {offenders}. Add `reference: {{directory: <path>}}`.",
                field="reference",
            )
        return self

    @model_validator(mode="after")
    def _warn_on_unknown_suite_metrics(self, info: ValidationInfo) -> "TaskDefinition":
        """A warning, not an error: upstream loads such a task, and its gate fails at the end."""
        for index, criterion in enumerate(self.success_criteria):
            for metric in getattr(criterion, "unknown_suite_metrics", list)():
                note(info, _unknown_suite_metric(criterion, metric),
                     field=f"success_criteria.{index}.suite_thresholds.{metric}")
        return self

    @model_validator(mode="after")
    def _suite_thresholds_need_a_dataset(self) -> "TaskDefinition":
        """An expanded row-task (``suite_id`` set) had its dataset cleared by design."""
        index = first_suite_thresholds(self.success_criteria)
        if index is not None and self.dataset is None and self.suite_id is None:
            kind = getattr(self.success_criteria[index], "type", None)
            raise SpecError(
                f"success_criteria[{kind!r}].suite_thresholds requires a dataset: block "
                "(thresholds are evaluated on aggregated across-row metrics)",
                field=f"success_criteria.{index}.suite_thresholds",
            )
        return self


def _unknown_suite_metric(criterion: Any, metric: str) -> str:
    known = criterion.suite_metrics()
    swapped = "_".join(reversed(metric.split(".", 1)))  # f1.macro -> macro_f1
    close = [swapped] if swapped in known else difflib.get_close_matches(metric, [k for k in known if "<" not in k], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return (f"{criterion.type} computes no suite metric '{metric}'{hint}, so this gate always fails; "
            f"it computes: {', '.join(known)}")


def _unknown_top_level(key: str, known: list[str]) -> str:
    moved = MOVED_TOP_LEVEL_KEYS.get(key)
    close = [moved] if moved else difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return (
        f"unknown top-level field will be ignored{hint}. If this is a typo, fix it; "
        "if the field is stale from a previous schema, remove it."
    )
