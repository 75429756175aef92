"""The lazy code location: a run builds the one job it runs; the rest waits to be asked for.

:func:`build_repository` returns ``build_definitions``' definitions behind Dagster's lazy ``RepositoryData``: a process
asking for one job by name (a run worker, a step process, the CLI's ``run``) builds that task alone, the same job with
the same snapshot; anything else (what the code server and the daemon need) builds the whole folder once.
"""

from __future__ import annotations

import threading
from operator import attrgetter, methodcaller
from pathlib import Path
from typing import Any, Callable

import dagster as dg

from ..compiler import compile_paths, task_sources
from ..config import load_config
from ..errors import SpecError
from ..naming import job_name
from ..spec.documents import load_json, load_yaml
from .translator import TaskTranslator


def build_repository(
    tasks_dir: str | Path,
    *,
    project_dir: str | Path | None = None,
    translator: TaskTranslator | None = None,
    strict: bool = False,
    name: str = "__repository__",  # the name Dagster gives a Definitions' repository
) -> dg.RepositoryDefinition:
    """``build_definitions(tasks_dir)`` as a lazily built repository. Named like the
    repository of a ``Definitions`` so runs, sensor and schedule state carry over."""
    data = TaskRepositoryData(tasks_dir, project_dir=project_dir, translator=translator, strict=strict)
    return dg.RepositoryDefinition(name, repository_data=data, description=f"agent-env tasks in `{data.tasks_dir}`")


def _whole_location(read: Callable[[dg.RepositoryDefinition], Any]) -> Callable[[TaskRepositoryData], Any]:
    """A ``RepositoryData`` method answered by ``read`` of the whole location."""
    return lambda data: read(data.full)


class TaskRepositoryData(dg.RepositoryData):
    """One job on demand (by name, from its file alone), or the whole location at once."""

    def __init__(
        self, tasks_dir: str | Path, *, project_dir: str | Path | None = None,
        translator: TaskTranslator | None = None, strict: bool = False,
    ):
        self.tasks_dir = Path(tasks_dir).resolve()
        self.project_dir = Path(project_dir).resolve() if project_dir else self.tasks_dir.parent
        self.translator = translator or TaskTranslator()
        self.strict = strict
        self._full: dg.RepositoryDefinition | None = None
        self._jobs: dict[str, dg.JobDefinition] = {}
        self._lock = threading.RLock()

    # -- the whole location ---------------------------------------------------------------
    @property
    def full(self) -> dg.RepositoryDefinition:
        """Every definition, built once by ``build_definitions``."""
        with self._lock:
            if self._full is None:
                from .definitions import build_definitions  # definitions imports this module

                self._full = build_definitions(
                    self.tasks_dir, project_dir=self.project_dir, translator=self.translator, strict=self.strict,
                ).get_repository_def()
            return self._full

    # -- one job ----------------------------------------------------------------------------
    def get_job(self, job_name: str) -> dg.JobDefinition:
        return self._one_job(job_name) or self.full.get_job(job_name)

    def has_job(self, job_name: str) -> bool:
        return self._one_job(job_name) is not None or self.full.has_job(job_name)

    def _one_job(self, name: str) -> dg.JobDefinition | None:
        """The job ``name`` built from the first source that compiles to it, as ``build_definitions`` builds it; None
        when the whole location decides: it is built already, a custom naming or ``[experiments]`` need every plan,
        strict mode judges every file, or no file compiles to ``name`` (a broken file's placeholder, Dagster's jobs)."""
        from .definitions import build_job, strict_from_env  # definitions imports this module

        with self._lock:
            if self._full is not None:
                return None
            if name in self._jobs:
                return self._jobs[name]
            config = load_config(self.project_dir)
            if (type(self.translator).get_job_name is not TaskTranslator.get_job_name or config.experiments
                    or self.strict or strict_from_env()):
                return None
            for path in task_sources(self.tasks_dir, config):
                if job_name(declared_task_id(path) or path.stem) != name:
                    continue
                plans = [p for p in compile_paths([path], config).plans if self.translator.get_job_name(p) == name]
                if plans:
                    try:
                        job = build_job(plans[0], self.translator, config=config)
                    except (dg.DagsterInvalidDefinitionError, dg.DagsterInvariantViolationError):
                        return None  # the whole location reports it
                    self._jobs[name] = job
                    return job
            return None

    # -- everything else: the whole location (RepositoryData derives names and lookups from these)
    get_all_jobs = _whole_location(methodcaller("get_all_jobs"))
    get_top_level_resources = _whole_location(methodcaller("get_top_level_resources"))
    get_env_vars_by_top_level_resource = _whole_location(methodcaller("get_env_vars_by_top_level_resource"))
    get_all_schedules = _whole_location(attrgetter("schedule_defs"))
    get_all_sensors = _whole_location(attrgetter("sensor_defs"))
    get_source_assets_by_key = _whole_location(attrgetter("source_assets_by_key"))
    get_assets_defs_by_key = _whole_location(attrgetter("assets_defs_by_key"))
    get_asset_checks_defs_by_key = _whole_location(attrgetter("asset_checks_defs_by_key"))
    get_component_tree = _whole_location(methodcaller("get_component_tree"))


def declared_task_id(path: Path) -> str | None:
    """The id a task file declares (``id`` of the stored JSON form, a Coder Eval ``task_id``), read without validating
    the rest; None when it declares none (its stem names the task) or cannot be read (the compiler will say why)."""
    coder_eval = path.suffix in (".yaml", ".yml")
    try:
        data = load_yaml(path) if coder_eval else load_json(path)
    except SpecError:
        return None
    declared = data.get("task_id" if coder_eval else "id") if isinstance(data, dict) else None
    return str(declared) if declared else None
