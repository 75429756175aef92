"""Load-time resolution of everything a task names relative to its own YAML file.

Prompt files are read and inlined, template directories and the Dockerfile become absolute
paths (``$VAR`` expanded; an undefined variable or a missing Dockerfile is a load error, not a
cryptic failure at sandbox setup), the replay script and dataset files are read and checked.
Each resolver returns the updated model and the problems it found, located by field.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ...errors import SpecError
from ..documents import load_json
from .agents import AgentConfig, ReplayAgentConfig, ReplayEpisode
from .base import FieldErrors, validate_each, validate_model
from .dataset import check_row_ids, load_dataset_rows
from .experiment import ExperimentDefinition
from .sandbox import SandboxConfig
from .task import TaskDefinition
from .templates import TemplateDirSource, TemplateSource

ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")

Problems = list[SpecError]


def resolve_task(task: TaskDefinition, base_dir: Path) -> tuple[TaskDefinition, Problems]:
    """``task`` with everything relative to ``base_dir`` (its YAML's directory) resolved."""
    update, problems = _inline_prompt(task.initial_prompt_file, base_dir, "initial_prompt_file")
    if task.reference is not None:
        directory = str(_beside(task.reference.directory, base_dir))
        update["reference"] = task.reference.model_copy(update={"directory": directory})
    for name, resolver in (("agent", _resolve_agent), ("sandbox", _resolve_sandbox)):
        value, found = resolver(getattr(task, name), base_dir)
        update[name] = value
        problems.extend(_under(name, found))
    problems.extend(_under("dataset", _check_dataset(task, base_dir)))
    if task.dataset is not None and task.dataset.paths is not None:
        paths = [str(_beside(path, base_dir)) for path in task.dataset.paths]
        update["dataset"] = task.dataset.model_copy(update={"paths": paths})
    return task.model_copy(update=update), problems


def resolve_experiment(experiment: ExperimentDefinition, base_dir: Path) -> tuple[ExperimentDefinition, Problems]:
    """Variant prompt files and template directories are relative to the experiment YAML."""
    problems: Problems = []
    defaults = experiment.defaults
    if defaults is not None and defaults.template_sources:
        sources, found = _resolve_template_sources(defaults.template_sources, base_dir)
        defaults = defaults.model_copy(update={"template_sources": sources})
        problems.extend(_under("defaults.template_sources", found))
    variants = []
    for index, variant in enumerate(experiment.variants):
        update, found = _inline_prompt(variant.initial_prompt_file, base_dir, "variant initial_prompt_file")
        problems.extend(_under(f"variants.{index}", found))
        if variant.template_sources:
            update["template_sources"], found = _resolve_template_sources(variant.template_sources, base_dir)
            problems.extend(_under(f"variants.{index}.template_sources", found))
        variants.append(variant.model_copy(update=update))
    return experiment.model_copy(update={"defaults": defaults, "variants": variants}), problems


def _inline_prompt(file: str | None, base_dir: Path, label: str) -> tuple[dict[str, Any], Problems]:
    """The update that replaces ``initial_prompt_file`` by the file's stripped text."""
    if file is None:
        return {}, []
    path = _beside(file, base_dir)
    if not path.is_file():
        return {}, [SpecError(f"{label} not found: {path}", field="initial_prompt_file")]
    return {"initial_prompt": path.read_text(encoding="utf-8").strip(), "initial_prompt_file": None}, []


def _beside(path: str, base_dir: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else (base_dir / candidate).resolve()


def _under(prefix: str, problems: Problems) -> Problems:
    return [SpecError(p.message, field=f"{prefix}.{p.field}" if p.field else prefix) for p in problems]


def _resolve_agent(agent: AgentConfig | None, base_dir: Path) -> tuple[AgentConfig | None, Problems]:
    if isinstance(agent, ReplayAgentConfig) and agent.script is not None:
        path = _beside(agent.script, base_dir)
        return agent.model_copy(update={"script": str(path)}), _check_replay_script(path)
    prompt_file = getattr(agent, "system_prompt_file", None)
    if agent is None or prompt_file is None:
        return agent, []
    path = _beside(prompt_file, base_dir)
    if not path.is_file():
        return agent, [SpecError(f"system_prompt_file not found: {path}", field="system_prompt_file")]
    content = path.read_text(encoding="utf-8").strip() or None
    if content is None and getattr(agent, "system_prompt_mode", "append") == "replace":
        return agent, [SpecError(
            f"system_prompt_file {path} is empty; system_prompt_mode='replace' requires a "
            "prompt to replace the Claude Code default with",
            field="system_prompt_file",
        )]
    return agent.model_copy(update={"system_prompt": content, "system_prompt_file": None}), []


def _check_replay_script(path: Path) -> Problems:
    """The script file holds ``{"episodes": [...]}``, each episode shaped as an inline one."""
    if not path.is_file():
        return [SpecError(f"replay script not found: {path}", field="script")]
    try:
        episodes = load_json(path)["episodes"]
        validate_each(episodes, lambda _, episode: validate_model(ReplayEpisode, episode))
    except FieldErrors as exc:
        return [SpecError(f"replay script {path}: episodes.{e.field}: {e.message}", field="script") for e in exc.errors]
    except SpecError as exc:
        return [SpecError(f"replay script {exc}", field="script")]
    except (KeyError, TypeError) as exc:
        return [SpecError(f"replay script {path} must be a JSON object with an 'episodes' list ({exc})", field="script")]
    return []


def _resolve_sandbox(sandbox: SandboxConfig, base_dir: Path) -> tuple[SandboxConfig, Problems]:
    problems: Problems = []
    update: dict[str, Any] = {}
    if sandbox.template_sources:
        update["template_sources"], found = _resolve_template_sources(sandbox.template_sources, base_dir)
        problems.extend(_under("template_sources", found))
    if sandbox.docker.dockerfile_path is not None:
        dockerfile = _beside(os.path.expandvars(sandbox.docker.dockerfile_path), base_dir)
        if dockerfile.is_file():
            update["docker"] = sandbox.docker.model_copy(update={"dockerfile_path": str(dockerfile)})
        else:
            problems.append(SpecError(f"Dockerfile not found: {dockerfile}", field="docker.dockerfile_path"))
    return sandbox.model_copy(update=update), problems


def _resolve_template_sources(sources: list[TemplateSource], base_dir: Path) -> tuple[list[TemplateSource], Problems]:
    """template_dir paths become absolute; an undefined ``$VAR`` in one is an error."""
    resolved: list[Any] = []
    problems: Problems = []
    for index, source in enumerate(sources):
        if not isinstance(source, TemplateDirSource):
            resolved.append(source)
            continue
        undefined = [a or b for a, b in ENV_VAR.findall(source.path) if (a or b) not in os.environ]
        if undefined:
            problems.append(SpecError(
                f"Template path {source.path!r} references undefined environment variable(s): "
                f"{', '.join('$' + name for name in undefined)}. Set them before loading the task "
                "(e.g. in .env) so the template directory can be resolved.",
                field=f"{index}.path",
            ))
            resolved.append(source)
        else:
            path = _beside(os.path.expandvars(source.path), base_dir)
            resolved.append(source.model_copy(update={"path": str(path)}))
    return resolved, problems


def _check_dataset(task: TaskDefinition, base_dir: Path) -> Problems:
    """The rows load and their ids are usable, so a broken dataset fails at load."""
    if task.dataset is None:
        return []
    try:
        rows = load_dataset_rows(task.dataset, base_dir)
        check_row_ids(rows, task.dataset, task.task_id)
    except (OSError, ValueError) as exc:
        return [SpecError(str(exc), field="paths" if task.dataset.paths else "rows")]
    return []

