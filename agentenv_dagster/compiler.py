"""Load, validate, plan: from task files to checked :class:`TaskPlan` objects.

A bad file never stops the others (dag-factory's per-file isolation); callers decide whether
a problem is fatal (strict: ``validate``, CI) or skipped and reported (the code location).
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from .config import AgentEnvConfig, ConfigError
from .errors import SpecError, TaskLoadError
from .naming import job_name, node_name
from .plan import TaskPlan
from .spec.loader import TaskDocument, load_task_file, parse_task_document, variant_key
from .spec.store import TaskStore
from .steps import BUILTIN_STEPS, StepRegistry
from .steps.execution import apply_seed

TASK_SUFFIXES = (".json", ".yaml", ".yml")
EXPERIMENT_SEPARATOR = "__"  # <task_id>__<experiment_id>: a task under an experiment (its job, its assets)


class SkippedTask(Exception):
    """A Coder Eval task marked ``skip: true``: listed, never compiled or run."""


def step_registry(config: AgentEnvConfig) -> StepRegistry:
    """Built-in steps plus ``[task_steps] impls``, importable from the project root (as a
    Dagster code location's working directory is). The project's custom criteria are
    registered on the way (:func:`load_extensions`), since steps parse criteria."""
    load_extensions(config)
    return BUILTIN_STEPS.with_impls(config.task_steps.impls)


def load_extensions(config: AgentEnvConfig) -> None:
    """Make the project root importable and import ``[criteria] modules``, whose
    ``@criterion`` classes register themselves. Importing again is a no-op."""
    if (config.task_steps.impls or config.criteria.modules) and str(config.root) not in sys.path:
        sys.path.append(str(config.root))
    for module in config.criteria.modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"[criteria] modules entry {module!r} cannot be imported: {exc}") from exc


def load_document(
    path: str | Path, registry: StepRegistry, *, overrides: Sequence[str] = (),
    grade_only_from: Path | None = None,
) -> tuple[TaskDocument, list[str]]:
    """A task document of either format, and its load warnings. A Coder Eval YAML is
    lowered to steps (``overrides`` are its ``-D`` values)."""
    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml"):
        return load_task_file(path, registry), []
    from .spec.coder_eval import apply_overrides, load_coder_eval_task

    loaded = load_coder_eval_task(path)
    if loaded.task.skip:
        raise SkippedTask(f"{path}: task '{loaded.task.task_id}' has skip: true; not compiled")
    if overrides:
        try:
            loaded = replace(loaded, task=apply_overrides(loaded.task, overrides))
        except ValueError as exc:
            raise TaskLoadError([SpecError(f"-D: {exc}", file=str(path))]) from None
    return coder_eval_document(loaded, registry, grade_only_from=grade_only_from), list(loaded.warnings)


def coder_eval_document(loaded, registry: StepRegistry, *, grade_only_from: Path | None = None) -> TaskDocument:
    """A loaded (and possibly variant-resolved) Coder Eval task, lowered to a task document."""
    from .spec.coder_eval.lowering import dataset_partitions, lower_task
    from .spec.coder_eval.variants import trials

    path = loaded.source
    steps = lower_task(loaded, grade_only_from=grade_only_from)
    document = parse_task_document(
        steps, source=str(path), default_id=loaded.task.task_id, registry=registry, format="coder-eval",
    )
    try:
        partitions, sampling = dataset_partitions(loaded)
    except (ValueError, OSError) as exc:
        raise TaskLoadError([SpecError(str(exc), file=str(path), field="dataset")]) from None
    count = trials(loaded.task)
    dataset = loaded.task.dataset
    return replace(document, partitions=partitions, sampling=sampling, replicates={"": count} if count > 1 else None,
                   max_sandboxes=dataset.max_sandboxes if dataset else None,
                   description=loaded.task.description.strip() or None)


def experiment_documents(
    loaded, experiment: Path, registry: StepRegistry, *, overrides: Sequence[str] = (),
    grade_only_from: Path | None = None,
) -> list[TaskDocument]:
    """A Coder Eval task under every variant of an experiment: one document per group of
    variants that lower to the same steps (one job holds one graph). Its partitions are rows x
    variants (the variants alone without a dataset), each variant running its own resolved
    steps. The first group's id is ``<task_id>__<experiment_id>``; a group whose variants
    change the steps (a ``simulation``, say) adds ``__<its first variant>``."""
    from .spec.coder_eval import load_coder_eval_experiment
    from .spec.coder_eval.variants import experiment_variants

    source = str(experiment)
    try:
        experiment_id = load_coder_eval_experiment(experiment).experiment.experiment_id
        variants = experiment_variants(loaded.task, experiment, overrides)
    except TaskLoadError:
        raise
    except ValueError as exc:
        raise TaskLoadError([SpecError(f"task '{loaded.task.task_id}': {exc}", file=source, field="variants")]) from None
    groups: dict[tuple, dict[str, TaskDocument]] = {}
    for variant_id, resolved, _ in variants:
        document = coder_eval_document(replace(loaded, task=resolved), registry, grade_only_from=grade_only_from)
        groups.setdefault(_shape(document), {})[variant_id] = document
    counts = {variant_id: count for variant_id, _, count in variants if count > 1}
    base = f"{loaded.task.task_id}{EXPERIMENT_SEPARATOR}{experiment_id}"
    documents = []
    for i, group in enumerate(groups.values()):
        name = f"{base}{EXPERIMENT_SEPARATOR}{next(iter(group))}" if i else base
        documents.append(_variant_group(group, name, counts))
    return documents


def _variant_group(documents: dict[str, TaskDocument], task_id: str, counts: dict[str, int]) -> TaskDocument:
    first = next(iter(documents.values()))
    rows = first.partitions
    partitions = ({variant_key(row, v): seed for row, seed in rows.items() for v in documents} if rows
                  else {v: {} for v in documents})
    return replace(first, task_id=task_id, partitions=partitions,
                   variant_steps={v: d.steps for v, d in documents.items()},
                   replicates={v: counts[v] for v in documents if v in counts} or None)


def _shape(document: TaskDocument) -> tuple[tuple[str, str, str], ...]:
    """What a job's graph is made of: each step's id, type and joins."""
    return tuple((s.id, s.type, repr(s.depends_on)) for s in document.steps)


def load_plan(
    path: str | Path, config: AgentEnvConfig, registry: StepRegistry | None = None, **options,
) -> TaskPlan:
    """One checked plan, or :class:`TaskLoadError` with every problem of the file."""
    document, _ = load_document(path, registry or step_registry(config), **options)
    return checked_plan(document)


def checked_plan(document: TaskDocument) -> TaskPlan:
    """The document's plan, once its joins are known to hold."""
    plan = TaskPlan(document)
    errors = plan.join_errors()
    if errors:
        raise TaskLoadError(errors)
    return plan


def discover(tasks_dir: str | Path) -> list[Path]:
    folder = Path(tasks_dir)
    return sorted(p for p in folder.rglob("*") if p.suffix in TASK_SUFFIXES and p.is_file())


def task_sources(tasks_dir: str | Path, config: AgentEnvConfig) -> list[Path]:
    """What a code location compiles: the task files, then the newest version of every task
    in the task store (``task create``). Of two sources of one task id the file is compiled
    first and wins (see :func:`compile_location`)."""
    return [*discover(tasks_dir), *TaskStore(config.state_dir / "tasks").latest_paths()]


@dataclass
class CompileReport:
    plans: list[TaskPlan] = field(default_factory=list)
    errors: list[SpecError] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def compile_location(tasks_dir: str | Path, config: AgentEnvConfig) -> CompileReport:
    """The task files and the stored tasks of a code location. A stored task whose id a
    file also defines is left out with a warning: the file in ``tasks/`` is what its job
    runs (``task run --id`` still runs the stored versions)."""
    files = discover(tasks_dir)
    report = compile_paths(task_sources(tasks_dir, config), config, shadowing=set(files))
    compile_experiments(report, config)
    return report


def compile_experiments(report: CompileReport, config: AgentEnvConfig) -> None:
    """``[experiments]``: each Coder Eval task listed, under its experiment, as a plan of its
    own (partitions variant x row). A problem is an error of the experiment file; the task's
    own job stays."""
    from .spec.coder_eval import load_coder_eval_task

    registry = step_registry(config)
    tasks = {plan.task_id: plan for plan in report.plans if plan.document.format == "coder-eval"}
    taken = {job_name(plan.task_id) for plan in report.plans}
    for relative, task_ids in config.experiments.items():
        experiment = config.root / relative
        for task_id in task_ids:
            if task_id not in tasks:
                report.errors.append(SpecError(
                    f"[experiments] no Coder Eval task '{task_id}' in the code location", file=str(experiment),
                    field="experiments"))
                continue
            try:
                loaded = load_coder_eval_task(Path(tasks[task_id].document.source))
                plans = [checked_plan(d) for d in experiment_documents(loaded, experiment, registry)]
            except TaskLoadError as exc:
                report.errors.extend(exc.errors)
                continue
            except Exception as exc:  # like a task file: one bad experiment never takes the others down
                report.errors.append(SpecError(
                    f"task '{task_id}': could not compile: {type(exc).__name__}: {exc}", file=str(experiment)))
                continue
            for plan in plans:
                name = job_name(plan.task_id)
                if name in taken:
                    report.errors.append(SpecError(f"'{plan.task_id}' compiles to job '{name}', already taken",
                                                   file=str(experiment)))
                    continue
                taken.add(name)
                report.plans.append(plan)


def compile_paths(paths: list[Path], config: AgentEnvConfig, *, shadowing: set[Path] | None = None) -> CompileReport:
    """Every file compiled independently; duplicate job names are errors of the later file,
    except that a file of ``shadowing`` only shadows a later one (a warning)."""
    registry = step_registry(config)
    report = CompileReport()
    seen: dict[str, str] = {}
    shadowing_names: set[str] = set()
    for path in paths:
        try:
            document, warnings = load_document(path, registry)
            report.warnings.extend(warnings)
            plan = checked_plan(document)
        except TaskLoadError as exc:
            report.errors.extend(exc.errors)
            continue
        except SkippedTask as skipped:
            report.warnings.append(str(skipped))
            continue
        except Exception as exc:  # a bug or an odd file must not take the others down
            report.errors.append(SpecError(f"could not compile: {type(exc).__name__}: {exc}", file=str(path)))
            continue
        name = job_name(plan.task_id)
        if name in shadowing_names and path not in shadowing:
            report.warnings.append(f"{path}: stored task '{plan.task_id}' is shadowed by {seen[name]}: "
                                   "its job runs the file")
            continue
        if name in seen:
            report.errors.append(SpecError(
                f"task '{plan.task_id}' compiles to job '{name}', already used by {seen[name]}",
                file=str(path),
            ))
            continue
        clashes = _node_name_clashes(plan)
        if clashes:
            report.errors.extend(clashes)
            continue
        seen[name] = str(path)
        if shadowing and path in shadowing:
            shadowing_names.add(name)
        report.plans.append(plan)
        report.warnings.extend(_registry_warnings(plan, config))
    return report


def _registry_warnings(plan: TaskPlan, config: AgentEnvConfig) -> list[str]:
    """Ids the local registry does not know: a run here would fail, production may differ.
    A ``<key>`` token is judged by the value the task gives it by default."""
    warnings = []
    for step in (apply_seed(s, plan.document.seed) for s in plan.steps):
        env_id = getattr(step, "env_id", None) if step.type == "deploy_env" else None
        if env_id and config.env_entry(env_id) is None:
            warnings.append(f"{plan.document.source}: step '{step.id}': env '{env_id}' is not in the local registry")
        agent_id = getattr(step, "a2a_agent_id", None) if step.type == "deploy_agent" else None
        if agent_id and config.agent_entry(agent_id) is None:
            warnings.append(
                f"{plan.document.source}: step '{step.id}': agent '{agent_id}' is not in the local registry"
            )
    return warnings


def _node_name_clashes(plan: TaskPlan) -> list[SpecError]:
    nodes: dict[str, str] = {}
    errors = []
    for step in plan.steps:
        name = node_name(step.id)
        if name in nodes:
            errors.append(SpecError(
                f"step id '{step.id}' and step id '{nodes[name]}' both become op '{name}'",
                file=plan.document.source, step_id=step.id, field="id",
            ))
        nodes[name] = step.id
    return errors
