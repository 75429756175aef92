"""One task under one experiment variant: the layered merge, lowest first.

    experiment defaults (the base experiment's, then the active one's) < the task's own,
    explicitly set fields < the variant < the CLI's ``-D``

so a task's own ``allowed_tools`` beats an experiment default. Lists replace, except
``template_sources`` (task, defaults, variant), ``pre_run`` (defaults first) and ``post_run``
(the task's first); prompt mutations apply defaults' then the variant's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

from .agents import agent_models, parse_agent_config
from .experiment import ExperimentDefinition, ExperimentVariant
from .limits import RunLimits
from .loader import load_coder_eval_experiment
from .merge import merge_layers
from .overrides import apply_overrides
from .sandbox import SandboxConfig
from .task import SimulationConfig, TaskDefinition


class VariantError(ValueError):
    pass


def experiment_variants(
    task: TaskDefinition, experiment: Path | None, overrides: Sequence[str] = (),
) -> list[tuple[str | None, TaskDefinition, int]]:
    """(variant id, resolved task, replicates) for each variant of ``experiment`` (with the
    ``default.yaml`` beside it as the lowest layer); the task alone, id None, without one. A
    simulation's ``n_trials`` are its replicates, taking precedence over ``repeats`` (as upstream)."""
    if experiment is None:
        resolved = apply_overrides(task, overrides) if overrides else task
        return [(None, resolved, trials(resolved))]
    active = load_coder_eval_experiment(experiment).experiment
    default = experiment.parent / "default.yaml"
    base = load_coder_eval_experiment(default).experiment if default.is_file() and default != experiment else None
    variants = []
    for variant in active.variants:
        resolved, repeats = resolve_for_variant(task, active, variant, base=base, overrides=overrides)
        variants.append((variant.variant_id, resolved, trials(resolved) if resolved.in_simulation else repeats))
    return variants


def trials(task: TaskDefinition) -> int:
    """A task's replicates of its own: a simulation runs ``n_trials`` conversations."""
    return task.simulation.n_trials if task.in_simulation else 1


def resolve_for_variant(
    task: TaskDefinition, experiment: ExperimentDefinition, variant: ExperimentVariant,
    *, base: ExperimentDefinition | None = None, overrides: Sequence[str] = (),
) -> tuple[TaskDefinition, int]:
    """The task as the variant runs it, and how many replicates (``repeats``)."""
    defaults = [d for d in (base.defaults if base else None, experiment.defaults) if d is not None]
    own = task.model_dump(mode="json", exclude_unset=True)
    data = task.model_dump(mode="json")

    agent_layers = [d.agent for d in defaults if d.agent] + [own.get("agent") or {}] + [variant.agent or {}]
    kind = next((layer["type"] for layer in reversed(agent_layers) if layer.get("type")), None)
    if kind is None:
        raise VariantError(f"variant '{variant.variant_id}': no layer sets agent.type")
    data["agent"] = merge_layers(agent_models(kind), agent_layers, context="agent")
    simulation_layers = [d.simulation for d in defaults if d.simulation] + [own.get("simulation") or {}] + [
        variant.simulation or {}]
    if any(simulation_layers):
        data["simulation"] = merge_layers((SimulationConfig,), simulation_layers, context="simulation")
    limits = [_set(d.run_limits) for d in defaults] + [own.get("run_limits") or {}] + [_set(variant.run_limits)]
    data["run_limits"] = merge_layers((RunLimits,), limits, context="run_limits") or None

    sandbox_layers = [_set(d.sandbox) for d in defaults] + [{"driver": d.driver} for d in defaults if d.driver]
    sandbox_layers += [{k: v for k, v in (own.get("sandbox") or {}).items() if k != "template_sources"}]
    sandbox_layers += [{"driver": variant.driver}] if variant.driver else []
    data["sandbox"] = merge_layers((SandboxConfig,), sandbox_layers, context="sandbox")
    data["sandbox"]["template_sources"] = [
        *((own.get("sandbox") or {}).get("template_sources") or []),
        *(s.model_dump(mode="json") for d in defaults for s in d.template_sources or []),
        *(s.model_dump(mode="json") for s in variant.template_sources or []),
    ] or None
    data["pre_run"] = [*(c.model_dump() for d in defaults for c in d.pre_run or []), *data["pre_run"]]
    data["post_run"] = [*data["post_run"], *(c.model_dump() for d in reversed(defaults) for c in d.post_run or [])]

    prompt = variant.initial_prompt if variant.initial_prompt is not None else data.get("initial_prompt")
    for mutation in [m for d in defaults for m in d.prompt_mutations or []] + list(variant.prompt_mutations or []):
        prompt = _mutate(prompt or "", mutation)
    data["initial_prompt"], data["initial_prompt_file"] = prompt, None
    data["agent"] = parse_agent_config(data["agent"])
    resolved = TaskDefinition.model_validate(data)
    if overrides:
        resolved = apply_overrides(resolved, overrides)
    repeats = variant.repeats or next((d.repeats for d in reversed(defaults) if d.repeats), None) or 1
    return resolved, repeats


def _set(model) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True) if model is not None else {}


def _mutate(prompt: str, mutation) -> str:
    kind = mutation.type
    if kind == "prefix":
        return f"{mutation.content}{mutation.separator}{prompt}"
    if kind == "suffix":
        return f"{prompt}{mutation.separator}{mutation.content}"
    if kind == "replace":
        return (re.sub(mutation.pattern, mutation.replacement, prompt) if mutation.regex
                else prompt.replace(mutation.pattern, mutation.replacement))
    if kind == "template":
        return prompt.format_map(_Keep(mutation.variables))
    raise VariantError("prompt mutation 'rephrase' needs an LLM to rewrite the prompt; it is not run offline")


class _Keep(dict):
    """``str.format_map`` that leaves unknown ``{name}`` placeholders as they are."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
