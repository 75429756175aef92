"""The code location ``dg dev``, ``dg check defs``, ``dg list defs`` and ``dg launch`` load:
every component declared under ``evals/defs/`` (the task folder, ``defs/tasks/defs.yaml``).
``dagster dev -w workspace.yaml`` loads the root ``definitions.py``, the same definitions
built in Python."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
