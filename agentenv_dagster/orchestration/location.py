"""The lazy code location: a run or step process builds the one job it runs.

Dagster re-imports the code location in every run worker and, under the multiprocess
executor, in every step process. ``build_definitions`` compiles every task document and
builds every job on import: fine for a few tasks, minutes of repeated work for thousands.
:func:`build_repository` returns the same definitions behind Dagster's documented lazy
mechanism (a ``@repository`` returning a :class:`dagster.RepositoryData`): a process that
asks for one job compiles that job's file only; anything else (the job list, assets, checks,
sensors, schedules, resources: what the code server and the daemon need) loads the whole
folder once, through ``build_definitions``, so both paths give the same definitions.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Mapping, Sequence

import dagster as dg
import yaml

from ..compiler import compile_paths, task_sources
from ..config import AgentEnvConfig, load_config
from ..errors import TaskLoadError
from ..naming import job_name
from .translator import TaskTranslator

SINGLETON_REPOSITORY = "__repository__"  # the name Dagster gives a Definitions' repository
INVALID_SUFFIX = "__invalid"


def build_repository(
    tasks_dir: str | Path,
    *,
    project_dir: str | Path | None = None,
    translator: TaskTranslator | None = None,
    strict: bool = False,
    name: str = SINGLETON_REPOSITORY,
) -> dg.RepositoryDefinition:
    """``build_definitions(tasks_dir)`` as a lazily built repository. Named like the
    repository of a ``Definitions`` so runs, sensor and schedule state carry over."""
    data = TaskRepositoryData(tasks_dir, project_dir=project_dir, translator=translator, strict=strict)

    @dg.repository(name=name, description=f"agent-env tasks in `{data.tasks_dir}`")
    def _tasks():
        return data

    return _tasks


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
        self._config: AgentEnvConfig | None = None
        self._full: dg.RepositoryDefinition | None = None
        self._index: dict[str, list[Path]] | None = None
        self._jobs: dict[str, dg.JobDefinition] = {}
        self._lock = threading.RLock()
        self.jobs_built = 0  # jobs built one at a time (what a run or step process pays)

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
                self._jobs.clear()
            return self._full

    @property
    def config(self) -> AgentEnvConfig:
        if self._config is None:
            self._config = load_config(self.project_dir)
        return self._config

    # -- one job ----------------------------------------------------------------------------
    def get_job(self, job_name: str) -> dg.JobDefinition:
        with self._lock:
            if self._full is not None:
                return self._full.get_job(job_name)
            if job_name not in self._jobs:
                job = self._build_one(job_name)
                if job is None:  # not a task job (or not found cheaply): the whole location decides
                    return self.full.get_job(job_name)
                self._jobs[job_name] = job
            return self._jobs[job_name]

    def has_job(self, job_name: str) -> bool:
        if self._full is None and self._candidates(job_name):
            return True
        return self.full.has_job(job_name)

    def _build_one(self, name: str) -> dg.JobDefinition | None:
        """The job of the first file that compiles to ``name`` (as ``compile_paths`` picks
        between files claiming one name), bound to the location's resources."""
        from .definitions import broken_task_jobs, build_job, location_resources
        from .executors import job_executor

        for path in self._candidates(name):
            report = compile_paths([path], self.config)
            if report.errors and self.strict:
                raise TaskLoadError(report.errors)
            plans = [p for p in report.plans if self.translator.get_job_name(p) == name]
            if plans:
                job = build_job(plans[0], self.translator, job_executor(self.config, plans[0]))
            elif name.endswith(INVALID_SUFFIX) and report.errors:
                (job,) = broken_task_jobs(report.errors, set())
            else:
                continue
            self.jobs_built += 1
            # bound the way Definitions binds a location's jobs (resources, default loggers)
            return dg.Definitions(jobs=[job], resources=location_resources(self.config)).get_job_def(name)
        return None

    def _candidates(self, name: str) -> list[Path]:
        if type(self.translator).get_job_name is not TaskTranslator.get_job_name:
            return []  # a custom naming needs every plan: no cheap index
        if self._index is None:
            self._index = task_file_index(task_sources(self.tasks_dir, self.config))
        return self._index.get(name, [])

    # -- everything else: the whole location -------------------------------------------------
    def get_all_jobs(self) -> Sequence[dg.JobDefinition]:
        return self.full.get_all_jobs()

    def get_job_names(self) -> Sequence[str]:
        return self.full.job_names

    def get_top_level_resources(self) -> Mapping[str, dg.ResourceDefinition]:
        return self.full.get_top_level_resources()

    def get_env_vars_by_top_level_resource(self):
        return self.full.get_env_vars_by_top_level_resource()

    def get_all_schedules(self) -> Sequence[dg.ScheduleDefinition]:
        return self.full.schedule_defs

    def get_schedule_names(self) -> Sequence[str]:
        return [s.name for s in self.full.schedule_defs]

    def get_schedule(self, schedule_name: str) -> dg.ScheduleDefinition:
        return self.full.get_schedule_def(schedule_name)

    def has_schedule(self, schedule_name: str) -> bool:
        return self.full.has_schedule_def(schedule_name)

    def get_all_sensors(self) -> Sequence[dg.SensorDefinition]:
        return self.full.sensor_defs

    def get_sensor_names(self) -> Sequence[str]:
        return [s.name for s in self.full.sensor_defs]

    def get_sensor(self, sensor_name: str) -> dg.SensorDefinition:
        return self.full.get_sensor_def(sensor_name)

    def has_sensor(self, sensor_name: str) -> bool:
        return self.full.has_sensor_def(sensor_name)

    def get_source_assets_by_key(self):
        return self.full.source_assets_by_key

    def get_assets_defs_by_key(self):
        return self.full.assets_defs_by_key

    def get_asset_checks_defs_by_key(self):
        return self.full.asset_checks_defs_by_key

    def get_component_tree(self):
        return self.full.get_component_tree()


def task_file_index(paths: Sequence[Path]) -> dict[str, list[Path]]:
    """Job name -> the files that may compile to it, in discovery order, read cheaply (the
    task id only, no validation). A file also answers for its ``<stem>__invalid``
    placeholder; one whose id cannot be read answers for its stem."""
    index: dict[str, list[Path]] = {}
    for path in paths:
        names = {job_name(peek_task_id(path) or path.stem), job_name(path.stem) + INVALID_SUFFIX}
        for name in names:
            index.setdefault(name, []).append(path)
    return index


_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def peek_task_id(path: Path) -> str | None:
    """The id a document declares (``id`` of the stored JSON form, a Coder Eval
    ``task_id``), else None (the file's stem names the task, or the file is broken)."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_YAML_LOADER)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    task_id = data.get("id") if path.suffix == ".json" else data.get("task_id")
    return str(task_id) if task_id else None
