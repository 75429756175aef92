"""deploy_sandbox and verify_sandbox: a bare sandbox for a task, and probes of its files.

Locally a sandbox is a folder of the run (see ``LocalProvider.deploy_sandbox``); steps name
its files by their in-sandbox path (``/app/greeting/hello.txt``) and ``LocalSandbox`` maps
them under the folder. Shell criteria run ``bash`` on the host with the mapped folder as
working directory: the folder stands in for the sandbox filesystem, it does not isolate.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import model_validator

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.sandbox import LocalSandbox
from ..runtime.shell import HostShell
from .base import AGENT, DEFAULT_AGENT_NAME, DEFAULT_TTL_SECONDS, SANDBOX, TaskStep
from .execution import user_override
from .registry import step
from .verifiers import _Verifier

OUTPUT_TAIL = 200


def deployed_sandbox(ctx: TaskStepContext, rt: StepRuntime, sandbox_name: str) -> LocalSandbox:
    """The folder behind the sandbox ``deploy_sandbox`` recorded as ``sandbox_name``."""
    record = ctx.find_sandbox(sandbox_name)
    if record is None:
        raise RuntimeError(
            f"Sandbox '{sandbox_name}' not found in context.deployed_sandboxes "
            f"(deployed: {[s.sandbox_name for s in ctx.deployed_sandboxes]})"
        )
    if not getattr(record, "sandbox_root", None):
        raise RuntimeError(
            f"Sandbox '{sandbox_name}' ({record.sandbox_type or 'unknown'} provider) has no local folder"
        )
    return rt.provider.sandbox_of(record)


@step("deploy_sandbox")
class DeploySandboxStep(TaskStep):
    """A bare sandbox other steps load files into and probe, joined by ``sandbox_name``."""

    writes = {"sandbox_name": SANDBOX}

    sandbox_name: str
    sandbox_mode: Literal["vm", "container"]
    image: str | None = None
    cpu: float = 2.0
    memory_mb: int = 8192
    disk_size_gb: float = 10
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    exposed_ports: list[int] | None = None
    boot_mode: str | None = None
    port: int | None = None
    env_vars: dict[str, str] | None = None
    sandbox_type: str | None = None
    network_policy: dict[str, Any] | None = None
    metadata: dict[str, Any] = {}
    # ours: run the folder as a local Docker container (Coder Eval's docker driver):
    # {image, working_dir, memory_mb, cpus, pids, network}
    container: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> "DeploySandboxStep":
        if self.sandbox_mode == "container" and (self.image is None or self.port is None):
            raise ValueError("container-mode sandbox requires `image` and `port`")
        return self

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        if ctx.find_sandbox(self.sandbox_name):
            raise RuntimeError(f"Sandbox '{self.sandbox_name}' is already deployed")
        requested = user_override(ctx, "sandbox") or self.sandbox_type
        if requested not in (None, "local") and not self.container:
            rt.log.warning("sandbox_type '%s' is served as a local folder by this runtime", requested)
        policy = user_override(ctx, "network_policy")
        sandbox = await asyncio.to_thread(
            rt.provider.deploy_sandbox, self.sandbox_name, sandbox_mode=self.sandbox_mode,
            ttl_seconds=user_override(ctx, "ttl_seconds") or self.ttl_seconds,
            network_policy=self.network_policy if policy is None else policy, container=self.container,
        )
        ctx.deployed_sandboxes.append(sandbox)


HANDLED_TYPES = ("probe_file_exists", "probe_dir_exists", "probe_file_contains", "bash_cmd_succeeds")


@step("verify_sandbox")
class VerifySandboxStep(_Verifier):
    """Checks the files a sandbox ends with; criteria of other types are left to other
    verifiers (a row marked skipped, not scored), so one criteria list can be split."""

    reads = {"agent_name": AGENT, "sandbox_name": SANDBOX}

    criteria: list[dict[str, Any]] = []
    agent_name: str | None = None
    sandbox_name: str | None = None
    base_dir: str = "/app"
    shell_timeout_seconds: float = 120

    @model_validator(mode="after")
    def _target(self) -> "VerifySandboxStep":
        if self.agent_name and self.sandbox_name:
            raise ValueError("verify_sandbox: set either `agent_name` or `sandbox_name`, not both")
        if not self.sandbox_name:
            self.agent_name = self.agent_name or DEFAULT_AGENT_NAME
        return self

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        if self.sandbox_name:
            sandbox = deployed_sandbox(ctx, rt, self.sandbox_name)
        else:
            agent = ctx.find_agent(self.agent_name)
            if agent is None:
                raise RuntimeError(f"Agent '{self.agent_name}' not found in context.deployed_agents")
            sandbox = rt.provider.sandbox_of(agent)
        rows = []
        for index, criterion in enumerate(self.criteria):
            row = {**criterion, "criterion_index": index}
            kind = criterion.get("type")
            if kind not in HANDLED_TYPES:
                why = f"type {kind!r} not handled by verify_sandbox"
                rows.append({**row, "skipped": True, "justification": why})
                continue
            try:
                passed, why = await self._evaluate(sandbox, criterion)
            except Exception as exc:  # a probe that cannot run fails its criterion, not the step
                passed, why = False, f"evaluator error: {exc}"[:300]
            rows.append({
                **row, "score": 1.0 if passed else 0.0, "result": passed,
                "justification": why, "skipped": False,
            })
        self.record(ctx, rows)

    async def _evaluate(self, sandbox: LocalSandbox, criterion: dict[str, Any]) -> tuple[bool, str]:
        """(passed, justification) of one handled criterion."""
        kind, paths = criterion["type"], criterion.get("paths") or []
        if kind == "bash_cmd_succeeds":
            return await self._shell(sandbox, criterion.get("bash_cmd") or "")
        if not paths:
            return False, "no paths specified"
        if kind == "probe_file_contains":
            pattern = criterion.get("expected") or criterion.get("value") or ""
            try:
                text = self._host(sandbox, paths[0]).read_text(errors="replace")
            except OSError as exc:
                return False, f"could not read {paths[0]}: {exc.strerror}"
            try:
                found = re.search(pattern, text) is not None
            except re.error as exc:
                return False, f"invalid regex pattern {pattern!r}: {exc}"
            return found, f"{'contains' if found else 'does not contain'} {pattern!r}"
        test = os.path.isdir if kind == "probe_dir_exists" else os.path.exists
        missing = [p for p in paths if not test(self._host(sandbox, p))]
        return not missing, f"Missing: {missing}" if missing else "All paths exist"

    def _host(self, sandbox: LocalSandbox, path: str) -> Path:
        """Host path of ``path``, taken relative to base_dir unless absolute."""
        return sandbox.resolve(str(PurePosixPath(self.base_dir) / path))

    async def _shell(self, sandbox: LocalSandbox, command: str) -> tuple[bool, str]:
        """``bash -c`` in base_dir. Its whole process group ends with it (or at the timeout,
        or when the step is cancelled), so nothing it started outlives the step."""
        if not command:
            return False, "no bash_cmd"
        cwd = self._host(sandbox, ".")
        if not cwd.is_dir():
            return False, f"base_dir {self.base_dir} does not exist in the sandbox"
        result = await HostShell(cwd).run(command, self.shell_timeout_seconds)
        if result.timed_out:
            return False, f"timed out after {self.shell_timeout_seconds}s"
        tail = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
        return result.exit_code == 0, f"exit={result.exit_code}; output={tail}"
