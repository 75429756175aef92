"""The project's extensions: custom criteria registered from ``[criteria] modules``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import ConfigError, load_config
from agentenv_dagster.criteria import CRITERION_TYPES
from agentenv_dagster.errors import TaskLoadError

CRITERION_MODULE = '''
from agentenv_dagster.criteria import Criterion, criterion

@criterion("always_half_{n}")
class AlwaysHalf(Criterion):
    async def check(self, ctx):
        return self.result(0.5, details="half")
'''

TASK = '''
task_id: custom-criterion
description: a task graded by a project's own criterion
agent: {{type: none}}
sandbox: {{driver: tempdir, python: null}}
success_criteria:
  - {{type: always_half_{n}, description: half}}
'''


def _project(root: Path, n: str, modules: str) -> Path:
    (root / ".agentenv").mkdir(parents=True)
    (root / ".agentenv" / "config.toml").write_text(f"[criteria]\nmodules = [{modules}]\n")
    (root / f"project_criteria_{n}.py").write_text(CRITERION_MODULE.format(n=n))
    (root / "tasks").mkdir()
    (root / "tasks" / "t.yaml").write_text(TASK.format(n=n))
    return root


def test_a_task_may_use_a_criterion_its_project_registers(tmp_path: Path):
    root = _project(tmp_path, "a", '"project_criteria_a"')
    try:
        plan = load_plan(root / "tasks" / "t.yaml", load_config(root))
        assert "always_half_a" in CRITERION_TYPES
        assert [step.type for step in plan.steps if step.type == "success_criteria"] == ["success_criteria"]
    finally:
        CRITERION_TYPES.pop("always_half_a", None)
        sys.modules.pop("project_criteria_a", None)


def test_a_criteria_module_that_does_not_import_is_a_config_error(tmp_path: Path):
    root = _project(tmp_path, "b", '"no_such_module_here"')
    with pytest.raises(ConfigError, match=r"^\[criteria\] modules entry 'no_such_module_here' cannot be imported: "):
        load_plan(root / "tasks" / "t.yaml", load_config(root))


def test_without_the_module_listed_the_type_is_unknown(tmp_path: Path):
    root = _project(tmp_path, "c", "")
    with pytest.raises(TaskLoadError, match=r"t.yaml: field 'success_criteria.0.type': unknown criterion type 'always_half_c'"):
        load_plan(root / "tasks" / "t.yaml", load_config(root))
