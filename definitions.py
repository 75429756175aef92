"""The Dagster code location of this checkout: one job per task document in tasks/.

Lazy (``build_repository``): the code server loads every task once; a run worker or a
multiprocess step, which re-imports this file, builds only the job it runs.
``build_definitions(...)`` returns the same definitions as an eager ``Definitions``.
"""

from pathlib import Path

from agentenv_dagster import build_repository
from agentenv_dagster.runtime.collector import sweep_rarely

sweep_rarely()  # the processes that import this file serve it: fewer full GC sweeps (see the README's Scale)
defs = build_repository(Path(__file__).parent / "tasks")
