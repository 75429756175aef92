"""TaskFolderComponent: the task folder declared in a defs.yaml builds what build_definitions
builds; its attributes are checked where they are written; strict mode (the attribute or
AGENTENV_STRICT) fails the load on a broken task file, for `dg check defs` and `dagster
definitions validate` alike; `dg scaffold defs`, `dg list defs` and `dg list components` work."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster.components.testing import create_defs_folder_sandbox
from projects import REPO, leaked_servers, make_dg_project, make_project
from test_coder_eval_run import WORDS_TASK
from test_experiment_partitions import COMPARE

from agentenv_dagster import TaskFolderComponent, build_definitions, build_repository
from agentenv_dagster.errors import TaskLoadError

COMPONENT = "agentenv_dagster.TaskFolderComponent"
SCHEDULE = '[schedules]\nreply_to_dana = "0 6 * * *"\n'
BROKEN_TASK = [{"id": "a", "type": "deploy_env", "env_id": "email", "ttl_secnds": 5}]
BROKEN_LINE = "step 'a': field 'ttl_secnds': unknown field (did you mean 'ttl_seconds'?)"


@pytest.fixture
def project(tmp_path):
    """A copy of the checkout's project, with a schedule so that every kind of definition shows."""
    root = make_project(tmp_path / "project", extra_config=SCHEDULE)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.fixture
def sandbox():
    with create_defs_folder_sandbox() as folder:
        yield folder


def declare(sandbox, attributes: dict, name: str = "evals") -> Path:
    """A defs.yaml declaring the component with ``attributes``; returns its folder."""
    return sandbox.scaffold_component(TaskFolderComponent, defs_path=name,
                                      defs_yaml_contents={"type": COMPONENT, "attributes": attributes})


def build(sandbox, folder: Path) -> tuple[TaskFolderComponent, dg.Definitions]:
    with sandbox.load_component_and_build_defs(defs_path=folder) as (component, defs):
        return component, defs


def load_error(sandbox, folder: Path) -> str:
    """What loading the component says: every exception of the chain, outermost first."""
    with pytest.raises(Exception) as caught:
        build(sandbox, folder)
    messages, error = [], caught.value
    while error is not None:
        messages.append(f"{type(error).__name__}: {error}")
        error = error.__cause__
    return "\n".join(messages)


def summary(location: dg.Definitions | dg.RepositoryDefinition) -> dict[str, list[str]]:
    """The names of what a code location holds, by kind."""
    repository = location.get_repository_def() if isinstance(location, dg.Definitions) else location
    graph = repository.asset_graph
    return {
        "jobs": sorted(j.name for j in repository.get_all_jobs() if not j.name.startswith("__")),
        "assets": sorted(k.to_user_string() for k in graph.get_all_asset_keys()),
        "checks": sorted(k.to_user_string() for k in graph.asset_check_keys),
        "sensors": sorted(s.name for s in repository.sensor_defs),
        "schedules": sorted(s.name for s in repository.schedule_defs),
        "resources": sorted(repository.get_top_level_resources()),
    }


# -- in process: Dagster's component test utilities ---------------------------------------


def test_the_component_builds_what_build_definitions_builds(project, sandbox):
    folder = declare(sandbox, {"tasks_dir": str(project / "tasks"), "project_dir": str(project)})
    component, defs = build(sandbox, folder)
    assert component.tasks_dir == project / "tasks" and component.strict is False
    built = summary(defs)
    assert built == summary(build_definitions(project / "tasks"))
    assert "reply_to_dana" in built["jobs"] and "verifications/reply_to_dana/sent" in built["assets"]
    assert "verifications/reply_to_dana/sent:passed" in built["checks"]
    assert built["schedules"] == ["reply_to_dana_schedule"] and "agentenv_task_files" in built["sensors"]


def test_paths_are_relative_to_the_defs_yaml_or_the_project_root(project, sandbox):
    near = declare(sandbox, {"tasks_dir": "tasks", "project_dir": str(project)}, name="near")
    (near / "tasks").mkdir()
    shutil.copy(project / "tasks" / "hello_python.yaml", near / "tasks")
    shutil.copytree(project / "tasks", sandbox.project_root / "tasks", dirs_exist_ok=True)
    at_root = declare(sandbox, {"tasks_dir": "{{ context.project_root }}/tasks", "project_dir": str(project)},
                      name="at_root")
    assert build(sandbox, near)[0].tasks_dir == near / "tasks"
    assert summary(build(sandbox, near)[1])["jobs"] == ["hello_python"]
    assert "reply_to_dana" in summary(build(sandbox, at_root)[1])["jobs"]


def test_executor_experiments_and_translator_attributes(project, sandbox, monkeypatch):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    (sandbox.project_root / "agentenv_test_naming.py").write_text(textwrap.dedent("""
        import dagster as dg
        from agentenv_dagster.orchestration.translator import TaskTranslator

        class Prefixed(TaskTranslator):
            def get_verification_asset_key(self, task_id, verifier_id):
                return dg.AssetKey(["evals", task_id, verifier_id])
    """))
    monkeypatch.syspath_prepend(str(sandbox.project_root))
    folder = declare(sandbox, {
        "tasks_dir": str(project / "tasks"), "project_dir": str(project), "executor": "multiprocess",
        "experiments": [{"file": "compare.yaml", "tasks": ["words"]}], "translator": "agentenv_test_naming:Prefixed",
    })
    (folder / "compare.yaml").write_text(COMPARE)
    _, defs = build(sandbox, folder)
    experiment = defs.resolve_job_def("words__compare")
    assert experiment.partitions_def.get_partition_keys()[:2] == ["r1|base", "r1|strict"]
    assert {defs.resolve_job_def(name).executor_def.name for name in ("reply_to_dana", "words__compare")} == {
        "multiprocess"}
    assert dg.AssetKey(["evals", "reply_to_dana", "sent"]) in defs.resolve_asset_graph().get_all_asset_keys()


def test_an_unknown_attribute_is_reported_at_its_line_of_the_defs_yaml(sandbox):
    folder = declare(sandbox, {"tasks_dirr": "tasks"})
    error = load_error(sandbox, folder)
    assert f"`attributes.tasks_dirr at {folder / 'defs.yaml'}:2`\n  Extra inputs are not permitted" in error
    assert f"`attributes.tasks_dir at {folder / 'defs.yaml'}:1`\n  Field required" in error


@pytest.mark.parametrize(("attribute", "value", "message"), [
    ("executor", "threads", "ValueError: Input should be 'agentenv', 'in_process', 'multiprocess', 'celery' or 'k8s'"),
    ("strict", "maybe", "ValueError: Input should be a valid boolean, unable to interpret input"),
    ("translator", "agentenv_nowhere:Prefixed", ("ValueError: translator 'agentenv_nowhere:Prefixed' cannot be "
                                                 "imported: No module named 'agentenv_nowhere'")),
    ("translator", "dagster:Definitions", ("ValueError: translator 'dagster:Definitions' is not a subclass of "
                                           "agentenv_dagster TaskTranslator")),
    ("tasks_dir", "nowhere", "ValueError: no such folder: {folder}/nowhere"),
])
def test_a_bad_value_is_reported_at_its_line_of_the_defs_yaml(project, sandbox, attribute, value, message):
    folder = declare(sandbox, {"tasks_dir": str(project / "tasks"), attribute: value})
    line = sorted(["tasks_dir", attribute]).index(attribute) + 2  # yaml.safe_dump sorts the keys
    error = load_error(sandbox, folder)
    assert f"{folder / 'defs.yaml'}:{line} - attributes.{attribute}" in error
    assert message.format(folder=folder) in error


def test_a_broken_task_file_is_an_invalid_job_unless_strict(project, sandbox, monkeypatch):
    (project / "tasks" / "broken.json").write_text(json.dumps(BROKEN_TASK))
    expected = re.escape(f"{project / 'tasks' / 'broken.json'}: {BROKEN_LINE}")
    lenient = declare(sandbox, {"tasks_dir": str(project / "tasks"), "project_dir": str(project)}, name="lenient")
    assert "broken__invalid" in summary(build(sandbox, lenient)[1])["jobs"]
    strict = declare(sandbox, {"tasks_dir": str(project / "tasks"), "project_dir": str(project), "strict": True},
                     name="strict")
    assert re.search(f"TaskLoadError: {expected}$", load_error(sandbox, strict), re.MULTILINE)
    monkeypatch.setenv("AGENTENV_STRICT", "1")  # the variable makes every loader strict
    assert re.search(f"TaskLoadError: {expected}$", load_error(sandbox, lenient), re.MULTILINE)
    with pytest.raises(TaskLoadError, match=f"^{expected}$"):
        build_definitions(project / "tasks")
    with pytest.raises(TaskLoadError, match=f"^{expected}$"):
        build_repository(project / "tasks").get_all_jobs()
    monkeypatch.setenv("AGENTENV_STRICT", "0")
    assert "broken__invalid" in summary(build_definitions(project / "tasks"))["jobs"]
    monkeypatch.setenv("AGENTENV_STRICT", "sometimes")
    with pytest.raises(ValueError, match=r"^AGENTENV_STRICT='sometimes': expected 1 or 0 \(true/false, yes/no, "
                                         r"on/off\)$"):
        build_definitions(project / "tasks")


def test_the_scaffolded_component_loads_the_project_s_tasks_folder(sandbox):
    folder = sandbox.scaffold_component(TaskFolderComponent, defs_path="evals")
    written = yaml.safe_load((folder / "defs.yaml").read_text())
    assert written == {"type": "agentenv_dagster.orchestration.component.TaskFolderComponent",
                       "attributes": {"tasks_dir": "{{ context.project_root }}/tasks"}}
    assert sorted((sandbox.project_root / "tasks").iterdir()) == []  # made for the tasks to come
    shutil.copy(REPO / "tasks" / "hello_python.yaml", sandbox.project_root / "tasks")
    assert summary(build(sandbox, folder)[1])["jobs"] == ["hello_python"]


# -- the real CLIs, on a copy of the checkout's dg project ---------------------------------


def cli(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``dg`` or ``dagster`` in ``project``, with its own instance; ``env`` adds variables."""
    folder = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    command = [shutil.which("dg", path=folder)] if args[0] == "dg" else [sys.executable, "-m", "dagster"]
    (project / ".dagster_home").mkdir(exist_ok=True)
    python_path = os.pathsep.join(filter(None, [str(project), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [*command, *args[1:]], cwd=project, capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "DAGSTER_HOME": str(project / ".dagster_home"), "PYTHONPATH": python_path, **env},
    )


def output(done: subprocess.CompletedProcess) -> str:
    return done.stdout + done.stderr


@pytest.fixture
def dg_project(tmp_path):
    root = make_dg_project(tmp_path / "p", extra_config=SCHEDULE)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.mark.slow
def test_dg_check_defs_passes_and_fails_strictly_on_a_broken_task_file(dg_project):
    checked = cli(dg_project, "dg", "check", "defs")
    assert checked.returncode == 0, output(checked)[-3000:]
    assert "All definitions loaded successfully" in output(checked)
    (dg_project / "tasks" / "broken.json").write_text(json.dumps(BROKEN_TASK))
    problem = f"{dg_project / 'tasks' / 'broken.json'}: {BROKEN_LINE}"
    lenient = cli(dg_project, "dg", "check", "defs")
    assert lenient.returncode == 0, output(lenient)[-3000:]  # broken__invalid is listed, not fatal
    by_variable = cli(dg_project, "dg", "check", "defs", AGENTENV_STRICT="1")
    assert by_variable.returncode != 0 and f"TaskLoadError: {problem}\n" in output(by_variable)
    defs_yaml = dg_project / "evals" / "defs" / "tasks" / "defs.yaml"
    defs_yaml.write_text(defs_yaml.read_text() + "  strict: true\n")
    by_attribute = cli(dg_project, "dg", "check", "defs")
    assert by_attribute.returncode != 0 and f"TaskLoadError: {problem}\n" in output(by_attribute)


@pytest.mark.slow
def test_dagster_definitions_validate_fails_strictly_on_a_broken_task_file(dg_project):
    (dg_project / "tasks" / "broken.json").write_text(json.dumps(BROKEN_TASK))
    lenient = cli(dg_project, "dagster", "definitions", "validate", "-w", "workspace.yaml")
    assert lenient.returncode == 0, output(lenient)[-3000:]
    assert "All code locations passed validation" in output(lenient)
    strict = cli(dg_project, "dagster", "definitions", "validate", "-w", "workspace.yaml", AGENTENV_STRICT="1")
    assert strict.returncode != 0
    assert f"TaskLoadError: {dg_project / 'tasks' / 'broken.json'}: {BROKEN_LINE}\n" in output(strict)


def test_dg_check_defs_reports_a_bad_attribute_at_its_line(dg_project):
    defs_yaml = dg_project / "evals" / "defs" / "tasks" / "defs.yaml"
    text = defs_yaml.read_text()
    line = text.splitlines().index('  tasks_dir: "{{ context.project_root }}/tasks"') + 1
    defs_yaml.write_text(text.replace("tasks_dir:", "tasks_dirr:"))
    checked = cli(dg_project, "dg", "check", "defs")
    assert checked.returncode != 0
    assert (f"{defs_yaml}:{line} - {COMPONENT} attributes.tasks_dirr Additional properties are not allowed "
            "('tasks_dirr' was unexpected)") in output(checked)


@pytest.mark.slow
def test_dg_list_defs_lists_what_the_root_definitions_py_builds(dg_project):
    """`dg dev` (the component) and `dagster dev -w workspace.yaml` (definitions.py) agree."""
    listed = cli(dg_project, "dg", "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    document = json.loads(listed.stdout)
    by_kind = {
        "jobs": sorted(j["name"] for j in document["jobs"]),
        "assets": sorted(a["asset_key"] for a in document["assets"]),
        "checks": sorted(c["key"] for c in document["asset_checks"]),
        "sensors": sorted(s["name"] for s in document["sensors"]),
        "schedules": sorted(s["name"] for s in document["schedules"]),
        "resources": sorted(r["name"] for r in document["resources"]),
    }
    assert all(by_kind.values()), by_kind  # a job, an asset, a check, a sensor, a schedule ...
    assert by_kind == summary(runpy.run_path(str(dg_project / "definitions.py"))["defs"])


@pytest.mark.slow
def test_dg_launch_runs_a_task_of_the_component(dg_project):
    launched = cli(dg_project, "dg", "launch", "--job", "hello_python")
    assert launched.returncode == 0, output(launched)[-3000:]
    assert "RUN_SUCCESS" in output(launched)


@pytest.mark.slow
def test_dg_scaffold_defs_writes_a_component_that_loads(tmp_path):
    project = tmp_path / "fresh"
    (project / "src" / "fresh" / "defs").mkdir(parents=True)
    (project / "src" / "fresh" / "__init__.py").write_text("")
    (project / "src" / "fresh" / "defs" / "__init__.py").write_text("")
    shutil.copy(REPO / "evals" / "definitions.py", project / "src" / "fresh" / "definitions.py")
    (project / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "fresh"
        version = "0"

        [tool.dg]
        directory_type = "project"

        [tool.dg.project]
        root_module = "fresh"
    """))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(project / "src"), os.environ.get("PYTHONPATH")]))}
    scaffolded = cli(project, "dg", "scaffold", "defs", COMPONENT, "evals", **env)
    assert scaffolded.returncode == 0, output(scaffolded)[-3000:]
    written = yaml.safe_load((project / "src" / "fresh" / "defs" / "evals" / "defs.yaml").read_text())
    assert written == {"type": COMPONENT, "attributes": {"tasks_dir": "{{ context.project_root }}/tasks"}}
    shutil.copy(REPO / "tasks" / "hello_python.yaml", project / "tasks")
    listed = cli(project, "dg", "list", "defs", "--json", **env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert [job["name"] for job in json.loads(listed.stdout)["jobs"]] == ["hello_python"]


def test_dg_list_components_shows_the_component(dg_project):
    """Through the package's `dagster_dg_cli.registry_modules` entry point (registered when the
    package is installed: after pulling this, `pip install -e .` again)."""
    listed = cli(dg_project, "dg", "list", "components", "--json")
    assert listed.returncode == 0, listed.stderr[-3000:]
    summaries = {item["key"]: item["summary"] for item in json.loads(listed.stdout)["items"]}
    assert COMPONENT in summaries, f"{COMPONENT} is not registered: reinstall the package (pip install -e .)"
    assert summaries[COMPONENT] == TaskFolderComponent.__doc__.splitlines()[0]
