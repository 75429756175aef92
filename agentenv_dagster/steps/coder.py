"""The Coder Eval step family: a workspace built from templates, shell commands before and
after the agent, and the task's success criteria graded over the workspace and telemetry.

A Coder Eval task is lowered to these plus the core steps (``deploy_sandbox``,
``deploy_agent`` into the sandbox, ``prompt_agent``), so it runs on the same compiler, ops,
IO manager and assets as an agent-env task.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import Field

from ..context import TaskStepContext
from ..runtime.artifacts import ObjectStore
from ..runtime.base import StepRuntime
from ..runtime.cli_shim import write_shims
from ..runtime.sandbox import LocalSandbox
from ..runtime.shell import HostShell, SandboxShell, passed_through, sandbox_env, sandbox_shell
from ..spec.coder_eval.ignore import effective_ignore_patterns
from ..spec.coder_eval.limits import DEFAULT_TASK_TIMEOUT
from .base import PROMPT, SANDBOX, VERIFICATION, TaskStep
from .registry import step
from .sandbox import deployed_sandbox, sandbox_passthrough

OUTPUT_LIMIT = 20_000
PIP_ENV_KEYS = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_CERT", "HTTP_PROXY", "HTTPS_PROXY",
                "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR")
CLI_MOCKS = "cli_mocks"  # record_cli shims and their calls.jsonl


def copy_tree(source: Path, target: Path, patterns: Iterable[str]) -> None:
    """Copy ``source`` into ``target``, skipping any path with an ignored component."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if any(fnmatch.fnmatch(part, p) for part in relative.parts for p in patterns):
            continue
        if path.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / relative)


@step("prepare_workspace")
class PrepareWorkspaceStep(TaskStep):
    """Fills the task's sandbox: template sources (or, grading only, a finished workspace),
    a Python venv with ``env_packages``, and a private copy of the reference."""

    reads = {"sandbox_name": SANDBOX}

    sandbox_name: str
    task_dir: str
    sandbox: dict[str, Any] = {}
    reference_directory: str | None = None
    grade_only_from: str | None = None

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        workspace = deployed_sandbox(ctx, rt, self.sandbox_name)
        patterns = effective_ignore_patterns(self.sandbox.get("ignore_patterns") or [])
        if self.grade_only_from:
            copy_tree(Path(self.grade_only_from), workspace.root, [])
        for source in self.sandbox.get("template_sources") or []:
            self._apply(source, workspace, patterns)
        if self.sandbox.get("record_cli"):
            write_shims(workspace.resolve(CLI_MOCKS), self.sandbox["record_cli"])
        for folder in self.sandbox.get("mock_path_dirs") or []:  # missing ones are skipped
            for path in workspace.resolve(folder).glob("*"):
                if path.is_file():
                    path.chmod(path.stat().st_mode | 0o111)
        python = self.sandbox.get("python", {})
        packages = (python or {}).get("env_packages") or []
        if packages and not self.grade_only_from:
            venv = await _run(  # pip reaches its index as this process does
                HostShell(workspace.root, (*sandbox_passthrough(ctx, self.sandbox_name), *PIP_ENV_KEYS)),
                f"{sys.executable} -m venv .venv && .venv/bin/pip install -q " + " ".join(map(shlex.quote, packages)),
                600,
            )
            if venv["error"]:
                raise RuntimeError(f"python env_packages: {venv['error']}: {venv['stderr'][-500:]}")
        info: dict[str, Any] = {
            "sandbox_name": self.sandbox_name, "sandbox_root": str(workspace.root), "task_dir": self.task_dir,
            "reference_dir": None,
        }
        if self.reference_directory:
            private = rt.run.run_dir / "reference" / self.id
            copy_tree(Path(self.task_dir) / self.reference_directory, private, [])
            info["reference_dir"] = str(private)
        ctx.metadata["workspace"] = info

    def _apply(self, source: dict[str, Any], workspace: LocalSandbox, patterns: Iterable[str]) -> None:
        kind = source.get("type")
        if kind == "template_dir":
            origin = Path(os.path.expandvars(source["path"]))
            origin = origin if origin.is_absolute() else Path(self.task_dir) / origin
            if not origin.is_dir():
                raise RuntimeError(f"template_dir {source['path']!r} is not a directory ({origin})")
            copy_tree(origin, workspace.resolve(source.get("mount_point") or "."), patterns)
        elif kind == "starter_files":
            for entry in source.get("files") or []:
                target = workspace.resolve(entry["path"])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(entry.get("content", ""))
        elif kind == "repo":
            self._clone(source, workspace)
        else:
            raise RuntimeError(f"unknown template source type {kind!r}")

    def _clone(self, source: dict[str, Any], workspace: LocalSandbox) -> None:
        """A repo template from a local path or ``file://`` URL (no network here), at its
        commit, without its ``.git`` (the agent gets the files, not the history)."""
        url = source["url"]
        local = Path(url.removeprefix("file://"))
        local = local if local.is_absolute() else Path(self.task_dir) / local
        if "://" in url and not url.startswith("file://") or not local.exists():
            raise RuntimeError(
                f"template source repo {url!r}: cloning needs network access, which this runtime "
                "does not have; use a local path, a file:// URL or a template_dir"
            )
        with tempfile.TemporaryDirectory() as scratch:
            clone = Path(scratch) / "repo"
            _git("clone", "--quiet", str(local), str(clone))
            if source.get("commit"):
                _git("-C", str(clone), "checkout", "--quiet", source["commit"])
            copy_tree(clone, workspace.root, [".git"])


@step("run_commands")
class RunCommandsStep(TaskStep):
    """``pre_run`` / ``post_run``: shell commands in the workspace, each with its timeout.
    A failing pre_run command with ``fail_on_error`` fails the step (the task is an ERROR)."""

    reads = {"sandbox_name": SANDBOX}

    sandbox_name: str
    phase: Literal["pre_run", "post_run"]
    commands: list[dict[str, Any]]

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        shell = workspace_shell(ctx, rt, self.sandbox_name)
        results = ctx.metadata_list(f"{self.phase}_results")
        for command in self.commands:
            result = await _run(shell, command["command"], command.get("timeout", 30))
            results.append(result)
            if self.phase == "pre_run" and result["error"] and command.get("fail_on_error", True):
                raise RuntimeError(f"pre_run command {command['command']!r} failed: {result['error']}")


@step("success_criteria")
class SuccessCriteriaStep(TaskStep):
    """Grades the Coder Eval criteria over the workspace, the agent's reply and its tool
    calls; writes one verification (weighted score, per-criterion rows, pass/fail)."""

    reads = {"sandbox_name": SANDBOX, "prompt_id": PROMPT}
    writes = {"verifier_key": VERIFICATION}

    sandbox_name: str
    criteria: list[dict[str, Any]]
    prompt_id: str | None = None
    verifier_id: str | None = None
    expected_commands: int | None = None
    # The task's time limit: every criterion's check ends by then (an overrun scores 0.0).
    timeout_seconds: float = Field(default=DEFAULT_TASK_TIMEOUT, gt=0)

    @property
    def verifier_key(self) -> str:
        return self.verifier_id or self.id

    def verification_checks(self) -> list[tuple[str, str]]:
        """One asset check per gating criterion, besides the task-level ``passed``."""
        return [
            *super().verification_checks(),
            *((criterion_check_name(i, c), c.get("description", "")) for i, c in enumerate(self.criteria)
              if float(c.get("weight", 1.0)) > 0),
        ]

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        from ..criteria import evaluate_all, parse_criterion, task_passed, weighted_score
        from ..criteria.early_stop import mark_advisory

        response = ctx.find_prompt_response(self.prompt_id) if self.prompt_id else None
        criterion_ctx = criterion_context(
            ctx, rt, self.sandbox_name, _trajectory(response), final_text=response.response if response else "",
            dialog=_dialog(response), expected_commands=self.expected_commands, time_limit=self.timeout_seconds,
        )
        models = [parse_criterion(c) for c in self.criteria]
        results = await evaluate_all(models, criterion_ctx)
        # fired-only gating: a run the stop_early watcher cut gates on its armed criteria
        stop = (response.model_extra or {}).get("early_stop") if response else None
        armed = mark_advisory(results, models) if stop else None
        passed = task_passed(results, armed=armed, gate_threshold=stop["gate_threshold"] if stop else 1.0)
        rows = [r.to_dict() for r in results]
        checks = {"passed": passed}
        for i, (criterion, result) in enumerate(zip(self.criteria, results)):
            if result.gating:
                checks[criterion_check_name(i, criterion)] = (
                    None if result.score is None else result.score >= result.pass_threshold
                )
        ctx.metadata_map("verifications")[self.verifier_key] = {
            "format": "coder_eval", "results": rows, "score": weighted_score(results),
            "passed": passed, "graded": passed is not None, "checks": checks,
            # an agent never heard (the prompt step failed before its response) is the task's error too
            "prompt_error": response.error_type if response else (ctx.failure_of("prompt_agent") or {}).get("error_type"),
        }


def _git(*args: str) -> None:
    done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=300, env=sandbox_env())
    if done.returncode != 0:
        raise RuntimeError(f"git {args[0]} failed: {done.stderr.strip()}")


def _dialog(response) -> list[dict[str, str]]:
    """The conversation a judge may read: each turn's user message and agent reply."""
    if response is None:
        return []
    turns = (response.model_extra or {}).get("turns")
    if turns:
        return [{"user": t.get("user_message") or t.get("prompt") or "", "agent": t.get("response") or ""} for t in turns]
    return [{"user": response.prompt_text or "", "agent": response.response or ""}]


def criterion_check_name(index: int, criterion: dict[str, Any]) -> str:
    return f"criterion_{index + 1}_{criterion.get('type', 'unknown')}"


def _trajectory(response) -> list[dict[str, Any]]:
    url = getattr(response, "agent_trajectory_object_url", None)
    return json.loads(ObjectStore.read(url)) if url else []


async def _run(shell: SandboxShell, command: str, timeout: float) -> dict[str, Any]:
    """One command in the sandbox; its result in the report's ``CommandRunResult`` shape."""
    started = time.perf_counter()
    result = await shell.run(command, timeout)
    error = None
    if result.timed_out:
        error = f"timed out after {timeout:g}s"
    elif result.exit_code != 0:
        error = f"exit code {result.exit_code}"
    return {
        "command": command, "exit_code": -9 if result.timed_out else result.exit_code, "error": error,
        "stdout": result.stdout[-OUTPUT_LIMIT:], "stderr": result.stderr[-OUTPUT_LIMIT:],
        "duration_seconds": round(time.perf_counter() - started, 3),
    }


def criterion_context(
    ctx: TaskStepContext, rt: StepRuntime, sandbox_name: str, events: list[dict[str, Any]], *,
    final_text: str, dialog: list[dict[str, str]], expected_commands: Any = None, time_limit: float | None = None,
):
    """What the criteria see: the workspace, the reference, the agent's tool calls and replies,
    the sandbox's shell (its container's under the docker driver) and the run's settings (a
    judge model or key set for the run applies)."""
    from ..criteria import CriterionContext, ToolCall

    workspace = deployed_sandbox(ctx, rt, sandbox_name)
    info = ctx.metadata.get("workspace") or {}
    container = (ctx.find_sandbox(sandbox_name).model_extra or {}).get("container")
    return CriterionContext(
        sandbox_dir=workspace.root, task_dir=Path(info.get("task_dir") or workspace.root),
        reference_dir=Path(info["reference_dir"]) if info.get("reference_dir") else None,
        tool_calls=[
            ToolCall(name=e["name"], parameters=e.get("arguments") or {},
                     status=e.get("status") or ("error" if e.get("is_error") else "success"),
                     duration_seconds=e.get("duration_seconds"), result=e.get("result"),
                     skill=(e.get("arguments") or {}).get("skill") if e["name"] == "Skill" else None)
            for e in events if e.get("type") == "tool_call"
        ],
        final_text=final_text, dialog=dialog, expected_commands=expected_commands, time_limit=time_limit,
        shell=sandbox_shell("", container) if container else None, config=rt.config,
        env=passed_through(sandbox_passthrough(ctx, sandbox_name)),
    )


def workspace_shell(ctx: TaskStepContext, rt: StepRuntime, sandbox_name: str) -> SandboxShell:
    """The shell of the task's sandbox: inside its container under the docker driver."""
    record = ctx.find_sandbox(sandbox_name)
    return sandbox_shell(deployed_sandbox(ctx, rt, sandbox_name).root, (record.model_extra or {}).get("container"),
                         passthrough=sandbox_passthrough(ctx, sandbox_name))
