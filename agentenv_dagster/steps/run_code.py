"""run_code: run a stored Python script and keep its JSON result in ``metadata.script_results``.

The script defines ``run(input)`` (``entrypoint``), where ``input = {"args", "results"}``
(``results``: what earlier run_code steps stored), and returns JSON. It is task data, so it
runs in its own interpreter under a deadline, never in the op's process: with ``env_id`` on
the env's host (here: a folder of the run), else in the agent's sandbox (its folder, or its
container when the sandbox has one).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from ..context import TaskStepContext
from ..runtime.artifacts import Artifact
from ..runtime.base import StepRuntime
from ..runtime.sandbox import LocalSandbox
from ..runtime.shell import ShellResult, host_env, run_argv, sandbox_shell
from .base import AGENT, ARTIFACT, DEFAULT_AGENT_NAME, ENV, TaskStep
from .registry import step

RUN_DIR = "tmp/agent_env_run_code"  # under the target's root, as upstream's /tmp/agent_env_run_code
RUNNER = Path(__file__).with_name("run_code_runner.py")
RESERVED_MEMBERS = frozenset({"runner.py", "input.json", "output.json"})
STAGED_SCRIPT = "script.py"  # a single-file artifact's name, whatever its own filename
ENTRY_WHEN_AMBIGUOUS = "run.py"
MAX_OUTPUT_BYTES = 50 * 1024 * 1024
MAX_SCRIPT_BYTES = 5 * 1024 * 1024
STDERR_TRUNCATE = 1000


class RunCodeValidationError(ValueError):
    """Bad step config, or a malformed or oversized result."""


class RunCodeExecutionError(Exception):
    """The script crashed, timed out or wrote no result."""


@step("run_code")
class RunCodeStep(TaskStep):
    reads = {"script_artifact_id": ARTIFACT, "env_id": ENV, "agent_name": AGENT}

    script_artifact_id: str
    script_artifact_version: int | None = None
    script_file: str | None = None
    entrypoint: str = "run"
    args: dict[str, Any] = {}
    result_id: str | None = None
    timeout_seconds: float = Field(default=600, gt=0)
    env_id: str | None = None
    agent_name: str | None = None

    @model_validator(mode="after")
    def _target(self) -> RunCodeStep:
        """No env_id means agent mode, which defaults to the default agent."""
        if self.env_id is None:
            self.agent_name = self.agent_name or DEFAULT_AGENT_NAME
        return self

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        entry, files = self._load_script(rt)
        root, container = self._target_root(ctx, rt)
        run_dir = LocalSandbox(root).resolve(f"{RUN_DIR}/{self.id}")  # a step id with '..' stays inside
        # Cleared first: a stale output.json or sibling module of an earlier attempt must not count.
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        for name, data in files.items():
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / name).write_bytes(data)
        script_input = {"args": self.args, "results": ctx.metadata.get("script_results", {})}
        (run_dir / "input.json").write_text(json.dumps(script_input))
        shutil.copyfile(RUNNER, run_dir / "runner.py")

        result = await self._run(root, container, run_dir.relative_to(root).as_posix(), entry)
        if result.timed_out:
            raise self._exec_error(f"timed out after {self.timeout_seconds:g}s")
        if result.exit_code != 0:
            raise self._exec_error(f"exited {result.exit_code}: {result.stderr[:STDERR_TRUNCATE]}")
        ctx.metadata_map("script_results")[self.result_id or self.id] = self._read_output(run_dir / "output.json")
        rt.log.info("run_code '%s' completed (result_id=%s, target=%s)",
                    self.id, self.result_id or self.id, "host" if self.env_id else "agent")

    # -- the script --------------------------------------------------------------------------
    def _load_script(self, rt: StepRuntime) -> tuple[str, dict[str, bytes]]:
        """(entry file name, the .py files to stage by relative path)."""
        artifact = rt.artifacts.get(self.script_artifact_id, self.script_artifact_version)
        if artifact.type == "file":
            if self.script_file:
                raise self._validation_error(
                    f"script_file '{self.script_file}' is set but '{self.script_artifact_id}' is a "
                    "single-file FileArtifact; drop script_file or point at a FileArtifactUniverse"
                )
            paths = list(artifact.files.values())
            if len(paths) != 1:
                raise self._validation_error(
                    f"script_artifact '{self.script_artifact_id}' is a FileArtifact holding {len(paths)} files"
                )
            return STAGED_SCRIPT, {STAGED_SCRIPT: paths[0].read_bytes()}
        if artifact.type != "file_artifact_universe":
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' must be a FileArtifact or "
                f"FileArtifactUniverse, got {artifact.type}"
            )
        entry = self._pick_entry(artifact)
        py = {name: path for name, path in artifact.files.items() if name.endswith(".py")}
        total = sum(path.stat().st_size for path in py.values())
        if total > MAX_SCRIPT_BYTES:
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' .py members total {total} bytes, "
                f"over the {MAX_SCRIPT_BYTES}-byte staging cap"
            )
        return entry, {name: path.read_bytes() for name, path in py.items()}

    def _pick_entry(self, universe: Artifact) -> str:
        """script_file, else the only .py member, else the one named run.py."""
        members = list(universe.files)
        if not members:
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' is an empty FileArtifactUniverse"
            )
        py = sorted(n for n in members if n.endswith(".py"))
        clash = sorted(set(py) & RESERVED_MEMBERS)
        if clash:
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' has member(s) {clash} that would "
                "shadow run_code's staging files; rename them"
            )
        if self.script_file:
            if not self.script_file.endswith(".py"):
                raise self._validation_error(f"script_file '{self.script_file}' must be a .py file")
            if self.script_file not in py:
                raise self._validation_error(
                    f"script_file '{self.script_file}' is not a .py member of "
                    f"'{self.script_artifact_id}'; .py members: {py}"
                )
            return self.script_file
        if not py:
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' has no .py member; members: {sorted(members)}"
            )
        if len(py) == 1:
            return py[0]
        default = [n for n in py if os.path.basename(n) == ENTRY_WHEN_AMBIGUOUS]
        if len(default) == 1:
            return default[0]
        if default:
            raise self._validation_error(
                f"script_artifact '{self.script_artifact_id}' has {len(default)} files named "
                f"'{ENTRY_WHEN_AMBIGUOUS}' ({default}), so the default entry is ambiguous; "
                f"set script_file to one of {py}"
            )
        raise self._validation_error(
            f"script_artifact '{self.script_artifact_id}' has {len(py)} .py members and no "
            f"'{ENTRY_WHEN_AMBIGUOUS}'; set script_file to one of {py}"
        )

    # -- where it runs -----------------------------------------------------------------------
    def _target_root(self, ctx: TaskStepContext, rt: StepRuntime) -> tuple[Path, dict | None]:
        """The folder standing in for the target's filesystem, and its container if any."""
        if self.env_id is not None:
            env = ctx.find_env(self.env_id)
            if env is None or not (env.instance_id or (env.model_extra or {}).get("sandbox_id")):
                raise RuntimeError(
                    f"Env '{self.env_id}' not found in context.deployed_envs (or missing sandbox_id)"
                )
            return rt.run.run_dir / "env_hosts" / (env.instance_id or env.model_extra["sandbox_id"]), None
        agent = ctx.find_agent(self.agent_name)
        if agent is None or not agent.sandbox_id:
            raise RuntimeError(
                f"Agent '{self.agent_name}' not found in context.deployed_agents (or missing sandbox_id)"
            )
        root = rt.provider.sandbox_of(agent).root
        container = next((
            extra["container"] for s in ctx.deployed_sandboxes
            if (extra := s.model_extra or {}).get("container") and extra.get("sandbox_root") == str(root)
        ), None)
        return root, container

    async def _run(self, root: Path, container: dict | None, run_dir: str, entry: str) -> ShellResult:
        args = [f"{run_dir}/runner.py", run_dir, self.entrypoint, entry]
        quiet = {"PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ left in the target's files
        if container:  # the sandbox folder is the container's working dir
            command = shlex.join(["python3", *args])
            return await sandbox_shell(root, container).run(command, self.timeout_seconds, quiet)
        return await run_argv([sys.executable, *args], cwd=root, env=host_env(**quiet), timeout=self.timeout_seconds)

    def _read_output(self, path: Path) -> Any:
        if not path.is_file():
            raise self._exec_error(f"wrote no result file: {path.name} is missing")
        if path.stat().st_size > MAX_OUTPUT_BYTES:
            raise self._validation_error(f"result exceeds {MAX_OUTPUT_BYTES}-byte cap")
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise self._validation_error(f"result is not valid JSON: {exc}") from exc

    def _exec_error(self, message: str) -> RunCodeExecutionError:
        return RunCodeExecutionError(f"run_code '{self.id}': {message}")

    def _validation_error(self, message: str) -> RunCodeValidationError:
        return RunCodeValidationError(f"run_code '{self.id}': {message}")
