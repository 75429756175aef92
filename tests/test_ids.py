"""Ids that become paths stay inside their stores: refused at load with the file, the step
and the field named, and refused again by every store that builds a path from one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentenv_dagster.config import AgentEnvConfig
from agentenv_dagster.context import DeployedAgent
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.ids import UnsafeIdError, check_id, path_under
from agentenv_dagster.runtime.artifacts import FilesystemArtifactStore
from agentenv_dagster.runtime.local import DeploymentError, LocalProvider
from agentenv_dagster.spec.coder_eval.loader import load_coder_eval_experiment
from agentenv_dagster.steps.execution import StepFailed
from projects import make_project, run_steps

RULE = "letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 200 characters"


@pytest.mark.parametrize("value", ["a", "Q3_report-v1.2", "_x", "x" * 200])
def test_safe_ids(value):
    assert check_id(value) == value


@pytest.mark.parametrize("value", ["", "..", ".hidden", "-x", "a/b", "../../x", "/etc", "a\\b", "a b", "x" * 201, 3])
def test_unsafe_ids(value):
    with pytest.raises(UnsafeIdError, match=r"is not a safe id"):
        check_id(value, "artifact id")


def test_a_path_may_not_leave_its_store_through_a_link(tmp_path):
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "out").symlink_to(tmp_path)
    assert path_under(tmp_path / "store", "fine") == tmp_path / "store" / "fine"
    with pytest.raises(UnsafeIdError, match=r"'out' leaves the store"):
        path_under(tmp_path / "store", "out")


@pytest.fixture
def project(tmp_path):
    return make_project(tmp_path / "p", tasks={})


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("artifact_id", ["../../../../tmp/x", "/etc"])
def test_load_artifact_with_a_path_for_an_id_is_refused_at_load(project, artifact_id):
    task = project / "tasks" / "load.json"
    task.write_text(json.dumps([
        {"id": "env", "type": "deploy_env", "env_id": "email"},
        {"id": "load", "type": "load_artifact", "env_id": "email", "artifact_id": artifact_id},
    ]))
    done = cli(project, "validate", str(task))
    assert done.returncode == 1
    assert (f"{task}: step 'load': field 'artifact_id': artifact id {artifact_id!r} is not a safe id ({RULE})"
            in done.stdout)


def test_an_artifact_id_a_run_sets_is_refused_before_anything_is_copied(project, tmp_path):
    outside = tmp_path / "host-folder"
    outside.mkdir()
    (outside / "private.txt").write_text("not yours")
    steps = [{"id": "agent", "type": "deploy_agent", "a2a_agent_id": "replay", "agent_name": "a"},
             {"id": "load", "type": "load_artifact", "agent_name": "a", "artifact_id": "dana_inbox"}]
    overrides = {"step_params": {"load": {"artifact_id": os.path.relpath(outside, project / "artifacts")}}}
    with pytest.raises(StepFailed, match=r"artifact id '\.\./.*host-folder' is not a safe id"):
        run_steps(project, steps, context={"metadata": {"user_overrides": overrides}})
    assert not list((project / ".agentenv" / "state" / "runs").rglob("private.txt"))


WRITER = """
[agents.registry.writer]
kind = "replay"
episodes = [{match = ".", reply = "written", actions = [{write_file = "/app/artifact/note.txt", content = "hi"}]}]
"""


def test_a_universe_id_from_the_run_cannot_write_outside_the_artifact_store(tmp_path):
    project = make_project(tmp_path / "p", tasks={}, extra_config=WRITER)
    steps = [{"id": "agent", "type": "deploy_agent", "a2a_agent_id": "writer", "agent_name": "a"},
             {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": "p", "prompt": "write"},
             {"id": "collect", "type": "collect_artifacts", "agent_name": "a"}]
    with pytest.raises(StepFailed) as failed:
        run_steps(project, steps, context={"metadata": {"universe_id": "../../escape"}})
    assert failed.value.record["error"] == (
        f"collect_artifacts 'collect': metadata.universe_id '../../escape' is not a safe id ({RULE})")
    assert not list(tmp_path.rglob("escape"))


@pytest.mark.parametrize("define", ["metadata.universe_id=../../escape", 'metadata={"universe_id": "/tmp/escape"}'])
def test_a_universe_id_given_with_d_is_refused_before_the_run_starts(project, define):
    task = project / "tasks" / "t.json"
    task.write_text(json.dumps([{"id": "env", "type": "deploy_env", "env_id": "email"}]))
    done = cli(project, "run", str(task), "-D", define)
    assert done.returncode == 2
    shown = "'../../escape'" if "../" in define else "'/tmp/escape'"
    assert f"error: -D metadata.universe_id {shown} is not a safe id ({RULE})" in done.stderr
    assert not (project / ".agentenv" / "state" / "runs").exists()  # nothing ran


def test_the_artifact_store_refuses_ids_and_files_that_leave_it(tmp_path):
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "linked").symlink_to(tmp_path)  # a bundle that is a link out of the bundle folder
    store = FilesystemArtifactStore(tmp_path / "store", [bundles])
    for bad in ("../../x", "/etc"):
        with pytest.raises(UnsafeIdError, match="is not a safe id"):
            store.get(bad)
        with pytest.raises(UnsafeIdError, match="is not a safe id"):
            store.put(bad, "file", {"a.txt": b"x"})
    with pytest.raises(UnsafeIdError, match="'linked' leaves the store"):
        store.get("linked")
    with pytest.raises(UnsafeIdError, match="leaves the store"):
        store.put("fine", "file", {"../../evil.txt": b"x"})
    assert not (tmp_path / "evil.txt").exists()


def test_task_create_refuses_an_id_that_is_a_path(project):
    source = project / "tasks" / "t.json"
    source.write_text(json.dumps([{"id": "env", "type": "deploy_env", "env_id": "email"}]))
    done = cli(project, "task", "create", str(source), "--id", "../../x")
    assert done.returncode == 2
    assert f"error: --id '../../x' is not a safe id ({RULE})" in done.stderr
    assert not (project / ".agentenv" / "x").exists() and not (project / "x").exists()


def test_a_stored_document_whose_id_is_a_path_is_refused(project):
    source = project / "tasks" / "t.json"
    source.write_text(json.dumps({"id": "../x", "type": "task", "version": 1, "steps": [
        {"id": "env", "type": "deploy_env", "env_id": "email"}]}))
    done = cli(project, "validate", str(source))
    assert done.returncode == 1
    assert f"{source}: field 'id': task id '../x' is not a safe id ({RULE})" in done.stdout


def test_a_coder_eval_task_id_that_is_a_path_is_refused_before_it_runs(project):
    task = project / "tasks" / "evil.yaml"
    task.write_text(yaml.safe_dump({
        "task_id": "../../evil", "description": "d", "initial_prompt": "p", "agent": {"type": "replay", "episodes": []},
        "success_criteria": [{"type": "file_exists", "path": "a.txt", "description": "d"}]}))
    done = cli(project, "run", str(task))
    assert done.returncode == 2
    assert f"{task}: field 'task_id': task_id '../../evil' is not a safe id ({RULE})" in done.stderr
    assert not (project / ".agentenv" / "state" / "runs").exists()  # nothing ran


def test_an_experiment_variant_id_that_is_a_path_is_refused(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump({"experiment_id": "e", "defaults": {"agent": {"type": "claude-code"}},
                                    "variants": [{"variant_id": "../v"}]}))
    with pytest.raises(TaskLoadError, match=rf"{path}: field 'variants.0.variant_id': variant_id '../v' is not a safe id"):
        load_coder_eval_experiment(path)


def test_a_saved_context_cannot_point_an_agent_sandbox_outside_the_runs(tmp_path):
    provider = LocalProvider(AgentEnvConfig(root=tmp_path), tmp_path / "state" / "runs" / "r1")
    agent = DeployedAgent(agent_name="a", api_url="http://x", sandbox_root="/etc")
    with pytest.raises(DeploymentError, match=r"agent 'a': sandbox_root '/etc' is not a sandbox of this project's runs"):
        provider.sandbox_of(agent)
    inside = DeployedAgent(agent_name="a", api_url="http://x", sandbox_root=str(tmp_path / "state" / "runs" / "r0" / "sb"))
    assert provider.sandbox_of(inside).root == tmp_path / "state" / "runs" / "r0" / "sb"
