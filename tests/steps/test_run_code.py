"""run_code, run for real: stored scripts run in their own interpreter in an agent's sandbox or
on an env's host, their JSON results kept in ``metadata.script_results`` and handed to later
scripts; crashes, deadlines and bad artifacts fail with upstream's messages (reference
agentenv.md §2, §3 "Other steps")."""

from __future__ import annotations

import json
import os
import re
import textwrap
import time
from pathlib import Path

import pytest

from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.steps import BUILTIN_STEPS
from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

REPLAY = """
[agents.registry.scribe]
kind = "replay"
episodes = [{match = "note", reply = "noted", actions = [{write_file = "/app/artifact/notes/a.txt", content = "A"}]}]
"""
AGENT = {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "scribe", "depends_on": []}
ASK = {"id": "ask", "type": "prompt_agent", "prompt_id": "p", "prompt": "take a note"}
EMAIL = {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []}
SCRIPTS = {
    # single-file artifacts: the file's own name does not matter
    "read_note": ("file", {"read_note.py": """
        import os
        def run(input):
            with open("app/artifact/notes/a.txt") as f:  # the sandbox folder is the working dir
                note = f.read()
            return {"note": note, "args": input["args"], "pid": os.getpid()}
    """}),
    "chain": ("file", {"chain.txt": """
        def run(input):
            return {"earlier": sorted(input["results"]), "note": input["results"]["first"]["note"] * 2}
    """}),
    "host": ("file", {"host.py": """
        import os
        def main(input):
            return {"cwd": os.getcwd(), "key_visible": "ANTHROPIC_API_KEY" in os.environ}
    """}),
    "crash": ("file", {"crash.py": """
        def run(input):
            raise ValueError("the ledger does not balance")
    """}),
    "slow": ("file", {"slow.py": """
        import time
        def run(input):
            time.sleep(60)
    """}),
    "pkg": ("file_artifact_universe", {
        "run.py": "from helpers import double\ndef run(input):\n    return double(input['args']['n'])\n",
        "helpers.py": "def double(n):\n    return [n, n]\n",
        "README.md": "not staged",
        "nested/entry.py": "from .util import label\ndef run(input):\n    return label()\n",
        "nested/util.py": "def label():\n    return 'nested'\n",
    }),
    "two": ("file_artifact_universe", {"a.py": "def run(i): return 1\n", "b.py": "def run(i): return 2\n"}),
    "shadow": ("file_artifact_universe", {"run.py": "def run(i): return 1\n", "runner.py": "x = 1\n"}),
}


def run_code(step_id: str, artifact: str, **extra) -> dict:
    return {"id": step_id, "type": "run_code", "script_artifact_id": artifact, **extra}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", extra_config=REPLAY)
    for artifact_id, (kind, files) in SCRIPTS.items():
        folder = root / "artifacts" / artifact_id
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(textwrap.dedent(text))
        (folder / "artifact.json").write_text(json.dumps({"type": kind}))
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def failure(project: Path, steps: list[dict]) -> str:
    with pytest.raises(StepFailed) as info:
        run_steps(project, steps)
    return info.value.record["error"]


def test_a_script_runs_in_the_agent_sandbox_and_later_scripts_see_its_result(project):
    context = run_steps(project, [
        AGENT, ASK,
        run_code("first", "read_note", args={"who": "dana"}),
        run_code("second", "chain", result_id="doubled"),
    ])
    results = context.metadata["script_results"]
    assert results["first"]["note"] == "A" and results["first"]["args"] == {"who": "dana"}
    assert results["first"]["pid"] != os.getpid()  # its own interpreter, not the op's
    assert results["doubled"] == {"earlier": ["first"], "note": "AA"}
    assert list(results) == ["first", "doubled"]


def test_a_universe_stages_its_python_members_side_by_side(project):
    context = run_steps(project, [
        AGENT,
        run_code("default_entry", "pkg", args={"n": 3}),
        run_code("nested", "pkg", script_file="nested/entry.py"),
    ])
    assert context.metadata["script_results"] == {"default_entry": [3, 3], "nested": "nested"}
    sandbox = Path(context.deployed_agents[0].sandbox_root)
    staged = sandbox / "tmp" / "agent_env_run_code" / "default_entry"
    assert sorted(p.name for p in staged.iterdir()) == [
        "helpers.py", "input.json", "nested", "output.json", "run.py", "runner.py",
    ]


def test_with_env_id_the_script_runs_on_the_env_host_without_this_process_secrets(project, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-not-for-scripts")
    context = run_steps(project, [EMAIL, run_code("probe", "host", env_id="email", entrypoint="main")])
    result = context.metadata["script_results"]["probe"]
    instance = context.deployed_envs[0].instance_id
    assert Path(result["cwd"]).parts[-2:] == ("env_hosts", instance)
    assert result["key_visible"] is False
    assert not context.deployed_agents  # no agent needed on the host


def test_a_crash_fails_the_step_with_the_script_stderr(project):
    error = failure(project, [AGENT, run_code("x", "crash")])
    assert error.startswith("run_code 'x': exited 1: Traceback (most recent call last)")
    assert "ValueError: the ledger does not balance" in error

    error = failure(project, [AGENT, run_code("x", "crash", entrypoint="main")])
    assert error == "run_code 'x': exited 1: script.py defines no main(input)\n"


def test_a_script_past_its_deadline_is_killed(project):
    started = time.monotonic()
    error = failure(project, [AGENT, run_code("x", "slow", timeout_seconds=0.5)])
    assert error == "run_code 'x': timed out after 0.5s"
    assert time.monotonic() - started < 30


def test_the_target_must_be_deployed(project):
    error = failure(project, [
        {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "no-such-agent", "fail_task_on_error": False},
        run_code("x", "read_note"),
    ])
    assert error == "Agent 'default-agent' not found in context.deployed_agents (or missing sandbox_id)"


@pytest.mark.parametrize(("artifact", "extra", "message"), [
    ("two", {}, "script_artifact 'two' has 2 .py members and no 'run.py'; set script_file to one of ['a.py', 'b.py']"),
    ("two", {"script_file": "c.py"}, "script_file 'c.py' is not a .py member of 'two'; .py members: ['a.py', 'b.py']"),
    ("two", {"script_file": "a.txt"}, "script_file 'a.txt' must be a .py file"),
    ("shadow", {}, ("script_artifact 'shadow' has member(s) ['runner.py'] that would shadow run_code's staging "
                    "files; rename them")),
    ("crash", {"script_file": "crash.py"}, ("script_file 'crash.py' is set but 'crash' is a single-file "
                                            "FileArtifact; drop script_file or point at a FileArtifactUniverse")),
    ("inbox", {}, "script_artifact 'inbox' must be a FileArtifact or FileArtifactUniverse, got environment"),
])
def test_a_script_artifact_that_cannot_run_is_refused(project, artifact, extra, message):
    error = failure(project, [AGENT, run_code("x", artifact, **extra)])
    assert error == f"run_code 'x': {message}"


def test_fields_and_defaults():
    cls = BUILTIN_STEPS.get("run_code")
    step = cls.model_validate(run_code("x", "s"))
    assert (step.entrypoint, step.args, step.result_id, step.timeout_seconds) == ("run", {}, None, 600)
    assert (step.env_id, step.agent_name, step.fail_task_on_error) == (None, "default-agent", True)
    # on an env host no agent is involved, so none is joined on
    host = cls.model_validate(run_code("x", "s", env_id="email"))
    assert [(n.kind, n.name) for n in host.names_read()] == [("artifact", "s"), ("env", "email")]
    with pytest.raises(ValueError, match=re.escape("timeout_seconds\n  Input should be greater than 0")):
        cls.model_validate(run_code("x", "s", timeout_seconds=0))


def test_a_step_id_cannot_move_the_run_folder_out_of_the_sandbox(project):
    """A step id names the step's folders: one that could leave them is refused at load."""
    with pytest.raises(TaskLoadError, match=re.escape(
            "step '../../escape': field 'id': step id '../../escape' is not a safe id")):
        run_steps(project, [AGENT, run_code("../../escape", "read_note")])
