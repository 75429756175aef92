"""The Dagster code location of this checkout: one job per task document in tasks/.

``dagster dev -w workspace.yaml`` and ``dagster job execute -f definitions.py`` load this file;
``dg dev``, ``dg check defs`` and ``dg list defs`` load the dg project ``evals/``, whose
component (``evals/defs/tasks/defs.yaml``) declares the same folder with the same defaults, so
both build the same definitions. Lazy (``build_repository``): the task folder is compiled when
Dagster first asks for a definition. ``AGENTENV_STRICT=1`` makes a broken task file fail the
load instead of becoming a ``<file>__invalid`` job.
"""

from pathlib import Path

from agentenv_dagster import build_repository

defs = build_repository(Path(__file__).parent / "tasks")
