"""The Dagster code location of this checkout: one job per task document in tasks/."""

from pathlib import Path

from agentenv_dagster import build_definitions

defs = build_definitions(Path(__file__).parent / "tasks")
