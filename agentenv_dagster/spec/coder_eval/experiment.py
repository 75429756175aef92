"""An experiment file: defaults plus named variants, each a layer over every task it runs.

Merge order, lowest first: ``experiments/default.yaml`` defaults, this experiment's defaults,
the task YAML, the variant, then the CLI (``-D``). Agent and simulation blocks here are partial
dicts; their keys are checked now, their values when a task is resolved against them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, Field, field_validator, model_validator

from ...errors import SpecError
from ...ids import safe_id
from .agents import agent_models
from .base import FieldErrors, Strict, validate_each, validate_kind
from .limits import RunLimits
from .merge import MergeError, merge_layers
from .sandbox import SandboxConfig
from .task import PostRunCommand, PreRunCommand, SimulationConfig
from .templates import TemplateSources

EXPERIMENT_ID_PATTERN = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class PromptPrefix(Strict):
    type: Literal["prefix"] = "prefix"
    content: str
    separator: str = "\n\n"


class PromptSuffix(Strict):
    type: Literal["suffix"] = "suffix"
    content: str
    separator: str = "\n\n"


class PromptReplace(Strict):
    type: Literal["replace"] = "replace"
    pattern: str
    replacement: str
    regex: bool = False

    @model_validator(mode="after")
    def _valid_regex(self) -> "PromptReplace":
        if self.regex:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise SpecError(f"Invalid regex in prompt_mutations: {exc}", field="pattern") from None
        return self


class PromptTemplate(Strict):
    """Substitutes ``{name}`` placeholders."""

    type: Literal["template"] = "template"
    variables: dict[str, str]


class PromptRephrase(Strict):
    """Rewritten by an LLM following ``instructions`` (so not deterministic)."""

    type: Literal["rephrase"] = "rephrase"
    instructions: str
    model: str | None = None
    temperature: float = Field(default=0.2, ge=0.0, le=2.0)
    max_tokens: int = Field(default=4096, gt=0)


PromptMutation = PromptPrefix | PromptSuffix | PromptReplace | PromptTemplate | PromptRephrase
MUTATION_KINDS: dict[str, type[Strict]] = {
    "prefix": PromptPrefix, "suffix": PromptSuffix, "replace": PromptReplace,
    "template": PromptTemplate, "rephrase": PromptRephrase,
}


def _parse_mutations(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    return validate_each(value, lambda _, item: validate_kind(
        item, MUTATION_KINDS,
        unknown=lambda kind: f"unknown prompt mutation type {kind!r} (expected one of: {', '.join(MUTATION_KINDS)})",
    ))


PromptMutations = Annotated[list[PromptMutation] | None, BeforeValidator(_parse_mutations)]


class ExperimentVariant(Strict):
    # the variant's id: a partition key and a report folder
    variant_id: safe_id("variant_id")
    # what the variant changes
    description: str = ""
    # agent fields merged over the task's (and the defaults')
    agent: dict[str, Any] | None = None
    # simulation fields merged over the task's
    simulation: dict[str, Any] | None = None
    # run each row this many times
    repeats: int | None = Field(default=None, ge=1)
    # more template sources, after the task's and the defaults'
    template_sources: TemplateSources = None
    # changes to the task's prompt: prefix, suffix, replace, template, rephrase
    prompt_mutations: PromptMutations = None
    # the prompt instead of the task's
    initial_prompt: str | None = None
    # a file holding the prompt instead of the task's
    initial_prompt_file: str | None = None
    # run limits instead of the task's
    run_limits: RunLimits | None = None
    # the sandbox driver instead of the task's
    driver: Literal["tempdir", "docker"] | None = None

    @model_validator(mode="after")
    def _one_prompt_change(self) -> "ExperimentVariant":
        set_fields = [
            name for name in ("prompt_mutations", "initial_prompt", "initial_prompt_file")
            if getattr(self, name) is not None
        ]
        if len(set_fields) > 1:
            raise SpecError(f"Only one of {', '.join(set_fields)} can be provided, not multiple", field=set_fields[1])
        return self


class ExperimentDefaults(Strict):
    # run each row this many times, in every variant
    repeats: int | None = Field(default=None, ge=1)
    # agent fields merged over every task's
    agent: dict[str, Any] | None = None
    # simulation fields merged over every task's
    simulation: dict[str, Any] | None = None
    # more template sources for every task
    template_sources: TemplateSources = None
    # changes to every task's prompt
    prompt_mutations: PromptMutations = None
    # commands after every task's own `post_run`
    post_run: list[PostRunCommand] | None = None
    # commands before every task's own `pre_run`
    pre_run: list[PreRunCommand] | None = None
    # run limits for every task
    run_limits: RunLimits | None = None
    # the sandbox driver of every task
    driver: Literal["tempdir", "docker"] | None = None
    # sandbox fields merged over every task's
    sandbox: SandboxConfig | None = None


class ExperimentDefinition(Strict):
    # the experiment's id: part of its job's name (`<task>__<experiment>`)
    experiment_id: str
    # what the experiment compares
    description: str = ""
    # settings every variant starts from
    defaults: ExperimentDefaults | None = None
    # the variants; the first is the baseline the reports compare with
    variants: list[ExperimentVariant]

    @field_validator("experiment_id")
    @classmethod
    def _kebab_case(cls, value: str) -> str:
        if not EXPERIMENT_ID_PATTERN.match(value):
            raise ValueError(f"experiment_id '{value}' must be kebab-case (e.g., 'model-comparison')")
        return value

    @model_validator(mode="after")
    def _variants(self) -> "ExperimentDefinition":
        if not self.variants:
            raise SpecError("Experiment must have at least 1 variant", field="variants")
        ids = [variant.variant_id for variant in self.variants]
        if len(ids) != len(set(ids)):
            raise SpecError(f"Variant IDs must be unique, got duplicates in: {ids}", field="variants")
        return self

    @model_validator(mode="after")
    def _partial_blocks_use_known_keys(self) -> "ExperimentDefinition":
        """A typo in a partial agent / simulation block fails here, not when a task resolves."""
        default_agent = (self.defaults.agent if self.defaults else None) or {}
        layers = [("defaults", self.defaults)] + [(f"variants.{i}", v) for i, v in enumerate(self.variants)]
        problems = []
        for where, layer in layers:
            if layer is None:
                continue
            kind = (layer.agent or {}).get("type", default_agent.get("type"))
            for name, models in (("agent", agent_models(kind)), ("simulation", (SimulationConfig,))):
                problems.extend(_unknown_keys(getattr(layer, name), models, f"{where}.{name}"))
        if problems:
            raise FieldErrors(problems)
        return self


def _unknown_keys(partial: dict[str, Any] | None, models: tuple[type[BaseModel], ...], where: str) -> list[SpecError]:
    try:
        merge_layers(models, [partial or {}], context=where.rsplit(".", 1)[-1])
    except MergeError as exc:
        return [SpecError(str(exc), field=where)]
    return []
