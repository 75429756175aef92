"""The lazy code location: the task folder compiled when Dagster first asks for a definition.

``build_definitions`` compiles every task document as it is called; :func:`build_repository`
returns the same definitions behind Dagster's documented lazy mechanism (a ``@repository``
returning a :class:`dagster.RepositoryData`), so importing the code location costs nothing
until a definition is asked for, and a process that never asks (a step process of an
executor that does not need the whole location, a tool that imports ``definitions.py`` for
something else) pays nothing.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Mapping, Sequence

import dagster as dg

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
        self._full: dg.RepositoryDefinition | None = None
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

    def get_job(self, job_name: str) -> dg.JobDefinition:
        return self.full.get_job(job_name)

    def has_job(self, job_name: str) -> bool:
        return self.full.has_job(job_name)

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
