"""agentenv_dagster: compile agent-env and Coder Eval task documents into Dagster jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .orchestration.definitions import build_definitions
    from .orchestration.location import build_repository

__all__ = ["build_definitions", "build_repository"]


def __getattr__(name: str):
    # Lazy: the CLI's validate and the step code must not pay for importing Dagster.
    if name == "build_definitions":
        from .orchestration.definitions import build_definitions

        return build_definitions
    if name == "build_repository":
        from .orchestration.location import build_repository

        return build_repository
    raise AttributeError(name)
