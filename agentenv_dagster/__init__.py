"""agentenv_dagster: compile agent-env and Coder Eval task documents into Dagster jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .orchestration.component import TaskFolderComponent
    from .orchestration.definitions import build_definitions
    from .orchestration.location import build_repository

__all__ = ["TaskFolderComponent", "build_definitions", "build_repository"]

_LAZY = {
    "TaskFolderComponent": ".orchestration.component",
    "build_definitions": ".orchestration.definitions",
    "build_repository": ".orchestration.location",
}


def __getattr__(name: str):
    # Lazy: the CLI's validate and the step code must not pay for importing Dagster.
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)


def __dir__() -> list[str]:
    # `dg list components` finds the component by scanning dir() of this package (the
    # `dagster_dg_cli.registry_modules` entry point): list the lazy names too.
    return sorted({*globals(), *__all__})
