"""The Dagster code location of this checkout: one job per task document in tasks/.

Lazy (``build_repository``): the task folder is compiled when Dagster first asks for a
definition. ``build_definitions(...)`` returns the same definitions as an eager ``Definitions``.
"""

from pathlib import Path

from agentenv_dagster import build_repository

defs = build_repository(Path(__file__).parent / "tasks")
