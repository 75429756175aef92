"""TaskFolderComponent: a folder of task documents as a Dagster Component.

Declared in a ``defs.yaml`` like ``DbtProjectComponent`` (``dg scaffold defs`` writes one, ``dg check
defs`` reports a bad attribute at its line); it builds what :func:`build_definitions` builds, from
paths relative to the ``defs.yaml``'s folder (``{{ context.project_root }}`` names the project's root).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Annotated, Literal

import dagster as dg
from dagster.components import scaffold_component
from pydantic import ConfigDict, TypeAdapter, ValidationError

from ..config import EXECUTORS
from .definitions import build_definitions
from .translator import TaskTranslator

Executor = Literal[EXECUTORS]


def _existing(kind: str):
    """A resolver of a path relative to the defs.yaml that must name an existing ``kind``."""

    def resolve(context: dg.ResolutionContext, value: str | None) -> Path | None:
        value = context.resolve_value(value, as_type=str)
        if value is None:
            return None
        path = context.resolve_source_relative_path(value)
        if not (path.is_dir() if kind == "folder" else path.is_file()):
            raise ValueError(f"no such {kind}: {path}")
        return path

    return resolve


def _checked(kind: object):
    """A resolver checking the rendered value against ``kind`` (Dagster's model takes any string, for templates)."""
    adapter = TypeAdapter(kind)

    def resolve(context: dg.ResolutionContext, value: object) -> object:
        try:
            return adapter.validate_python(context.resolve_value(value))
        except ValidationError as exc:
            raise ValueError("; ".join(error["msg"] for error in exc.errors())) from None

    return resolve


class Experiment(dg.Resolvable, dg.Model):
    """An experiment file and the Coder Eval tasks it runs (a job each, partitioned by
    variant x row), like an entry of ``[experiments]`` in ``.agentenv/config.toml``."""

    file: Annotated[Path, dg.Resolver(_existing("file"), model_field_type=str,
                                      description="The experiment YAML (relative to this defs.yaml).")]
    tasks: Annotated[list[str], dg.Resolver.default(description="The ids of the Coder Eval tasks it runs.")]


def _translator(context: dg.ResolutionContext, pointer: str | None) -> TaskTranslator | None:
    """``module:Class`` of a :class:`TaskTranslator` subclass, imported and instantiated."""
    pointer = context.resolve_value(pointer, as_type=str)
    if pointer is None:
        return None
    module_name, _, class_name = pointer.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"translator {pointer!r} is not 'module.path:ClassName'")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"translator {pointer!r} cannot be imported: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, TaskTranslator)):
        raise ValueError(f"translator {pointer!r} is not a subclass of agentenv_dagster TaskTranslator")
    return cls()


class TaskFolderScaffolder(dg.Scaffolder):
    """``dg scaffold defs agentenv_dagster.TaskFolderComponent <path>``: a ``defs.yaml`` reading ``tasks/`` at the
    project's root (created when missing), every other attribute at its default and listed in a comment."""

    def scaffold(self, request: dg.ScaffoldRequest) -> None:
        if request.scaffold_format != "yaml":
            scaffold_component(request)  # a component.py, as Dagster scaffolds any component
            return
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(SCAFFOLD_YAML.format(type_name=request.type_name))
        if request.project_root is not None:
            (request.project_root / "tasks").mkdir(exist_ok=True)


SCAFFOLD_YAML = """\
type: {type_name}

attributes:
  # agent-env JSON and Coder Eval YAML task documents: a job each
  tasks_dir: "{{{{ context.project_root }}}}/tasks"
  # where .agentenv/config.toml is (default: the project's root)
  # project_dir: "{{{{ context.project_root }}}}"
  # a job per Coder Eval task under each variant (default: the config's [experiments])
  # experiments:
  #   - file: "{{{{ context.project_root }}}}/experiments/prompts.yaml"
  #     tasks: [my-task]
  # agentenv | in_process | multiprocess | celery | k8s (default: the config's, else per task)
  # executor: agentenv
  # a broken task file fails the load instead of becoming a <file>__invalid job
  # (AGENTENV_STRICT=1 turns it on too)
  # strict: false
  # a TaskTranslator subclass that names the jobs, assets and checks
  # translator: my_project.naming:MyTranslator
"""


@dg.scaffold_with(TaskFolderScaffolder)
class TaskFolderComponent(dg.Component, dg.Resolvable, dg.Model):
    """A job per agent-env or Coder Eval task document in a folder, with its assets and checks.

    What ``agentenv_dagster.build_definitions`` builds: each task's job and the verification
    and artifact assets it materializes, their pass/fail checks, the sensors and the schedules.
    """

    tasks_dir: Annotated[Path, dg.Resolver(
        _existing("folder"), model_field_type=str,
        description="The folder of task documents (relative to this defs.yaml; '{{ context.project_root }}/tasks' "
                    "for the project's tasks/).")]
    project_dir: Annotated[Path | None, dg.Resolver(
        _existing("folder"), model_field_type=str | None,
        description="Where .agentenv/config.toml is (default: the project's root).")] = None
    experiments: Annotated[list[Experiment] | None, dg.Resolver.default(
        description="Experiment files and the Coder Eval tasks each runs (default: the config's [experiments]).",
    )] = None
    executor: Annotated[Executor | None, dg.Resolver(
        _checked(Executor | None), model_field_type=Executor | None,
        description="The executor of every job (default: the config's [dagster] executor, else the side-by-side "
                    "executor, in_process for a chain of steps); AGENTENV_DAGSTER_EXECUTOR overrides it.",
    )] = None
    strict: Annotated[bool, dg.Resolver(
        _checked(bool), model_field_type=bool,
        description="A task file that does not compile fails the load (for CI) instead of becoming a "
                    "<file>__invalid job; AGENTENV_STRICT=1 turns it on too.",
    )] = False
    translator: Annotated[
        TaskTranslator | None,
        dg.Resolver(_translator, model_field_type=str | None,
                    description="module:Class of a TaskTranslator subclass that names the jobs, assets and checks."),
    ] = None

    model_config = ConfigDict(arbitrary_types_allowed=True)  # the translator; extra="forbid" stays

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        experiments = None if self.experiments is None else {str(e.file): e.tasks for e in self.experiments}
        return build_definitions(
            self.tasks_dir, project_dir=self.project_dir or context.project_root, translator=self.translator,
            strict=self.strict, experiments=experiments, executor=self.executor,
        )
