"""Dagster's private API is used in one module only: ``orchestration/dagster_internals.py``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from projects import REPO

ALLOWED = REPO / "agentenv_dagster" / "orchestration" / "dagster_internals.py"
SCANNED = ("agentenv_dagster", "tests", "bench", "scripts")
# dagster's and its libraries' private modules (dagster._core, dagster_graphql._…), dagster_shared
PRIVATE = re.compile(r"^(dagster(_\w+)?\._|dagster_shared(\.|$))")


def private_imports(path: Path) -> list[str]:
    """``line: module`` for each private Dagster module ``path`` imports, by statement or by
    ``importlib.import_module("…")``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names if PRIVATE.match(name)][:1]
    return found


def test_no_module_but_dagster_internals_imports_dagster_s_private_api():
    offenders = {str(path.relative_to(REPO)): found for folder in SCANNED for path in sorted((REPO / folder).rglob("*.py"))
                 if path != ALLOWED and (found := private_imports(path))}
    assert offenders == {}


@pytest.mark.parametrize(("source", "module"), [
    ("from dagster._core.events import DagsterEvent", "dagster._core.events"),
    ("import dagster._serdes", "dagster._serdes"),
    ("from dagster_shared import check", "dagster_shared"),
    ("from dagster import _check", "dagster._check"),
    ("from dagster_graphql._internal import x", "dagster_graphql._internal"),
    ("importlib.import_module('dagster._core.storage.tags')", "dagster._core.storage.tags"),
])
def test_the_scan_finds_each_way_of_importing_a_private_module(tmp_path, source, module):
    path = tmp_path / "m.py"
    path.write_text(f"import importlib\n{source}\n")
    assert private_imports(path) == [f"2: {module}"]


def test_public_modules_pass(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import dagster as dg\nfrom dagster_graphql import DagsterGraphQLClient\n"
                    "from dagster_celery.cli import get_validated_config\nfrom . import _private\n")
    assert private_imports(path) == []
