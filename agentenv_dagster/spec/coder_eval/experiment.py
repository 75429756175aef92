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
    variant_id: safe_id("variant_id")
    description: str = ""
    agent: dict[str, Any] | None = None
    simulation: dict[str, Any] | None = None
    repeats: int | None = Field(default=None, ge=1)
    template_sources: TemplateSources = None
    prompt_mutations: PromptMutations = None
    initial_prompt: str | None = None
    initial_prompt_file: str | None = None
    run_limits: RunLimits | None = None
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
    repeats: int | None = Field(default=None, ge=1)
    agent: dict[str, Any] | None = None
    simulation: dict[str, Any] | None = None
    template_sources: TemplateSources = None
    prompt_mutations: PromptMutations = None
    post_run: list[PostRunCommand] | None = None
    pre_run: list[PreRunCommand] | None = None
    run_limits: RunLimits | None = None
    driver: Literal["tempdir", "docker"] | None = None
    sandbox: SandboxConfig | None = None


class ExperimentDefinition(Strict):
    experiment_id: str
    description: str = ""
    defaults: ExperimentDefaults | None = None
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
