"""deploy_sandbox and verify_sandbox: a bare sandbox for a task, and probes of its files.

A ``vm``-mode sandbox is a folder of the run (see ``LocalProvider.deploy_sandbox``); steps
name its files by their in-sandbox path (``/app/greeting/hello.txt``) and ``LocalSandbox``
maps them under the folder, where shell criteria run ``bash`` on the host: the folder stands
in for the sandbox filesystem, it does not isolate. A ``container``-mode sandbox is a Docker
container of its ``image`` (and a vm-mode one with our ``container`` settings a container with
the folder mounted): its probes run inside the container, through execs.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..context import DeployedSandbox, TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.sandbox import ContainerFiles, FolderFiles, LocalSandbox, SandboxFiles
from .base import AGENT, DEFAULT_AGENT_NAME, DEFAULT_TTL_SECONDS, SANDBOX, TaskStep
from .containers import check_env_keys
from .execution import user_override
from .registry import step
from .verifiers import _Verifier

OUTPUT_TAIL = 200


def _record(ctx: TaskStepContext, sandbox_name: str) -> DeployedSandbox:
    record = ctx.find_sandbox(sandbox_name)
    if record is None:
        raise RuntimeError(
            f"Sandbox '{sandbox_name}' not found in context.deployed_sandboxes "
            f"(deployed: {[s.sandbox_name for s in ctx.deployed_sandboxes]})"
        )
    return record


def deployed_sandbox(ctx: TaskStepContext, rt: StepRuntime, sandbox_name: str) -> LocalSandbox:
    """The folder behind the sandbox ``deploy_sandbox`` recorded as ``sandbox_name``."""
    record = _record(ctx, sandbox_name)
    if not getattr(record, "sandbox_root", None):
        if record.sandbox_mode == "container":
            raise RuntimeError(
                f"Sandbox '{sandbox_name}' is a container-mode sandbox: its files live in its "
                "container, with no local folder (use a vm-mode sandbox for this step)"
            )
        raise RuntimeError(
            f"Sandbox '{sandbox_name}' ({record.sandbox_type or 'unknown'} provider) has no local folder"
        )
    return rt.provider.sandbox_of(record)


def sandbox_passthrough(ctx: TaskStepContext, sandbox_name: str) -> tuple[str, ...]:
    """The variables of this process the sandbox's host shells see (its ``env_passthrough``)."""
    record = ctx.find_sandbox(sandbox_name)
    return tuple((record.model_extra or {}).get("env_passthrough") or ()) if record else ()


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
    # ours, vm mode: the folder mounted in a local Docker container (Coder Eval's docker
    # driver): {image, working_dir, memory_mb, cpus, pids, network}
    container: dict[str, Any] | None = None
    # ours: the environment variables (by name) that commands run on this machine for this
    # sandbox see besides the basics (Coder Eval's env_passthrough); nothing else of ours
    env_passthrough: list[str] | None = None

    @field_validator("env_passthrough")
    @classmethod
    def _variable_names(cls, names: list[str] | None) -> list[str] | None:
        bad = [name for name in names or [] if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)]
        if bad:
            raise ValueError(f"env_passthrough names environment variables; not one: {bad[:5]}")
        return names

    @model_validator(mode="after")
    def _check(self) -> "DeploySandboxStep":
        if self.sandbox_mode == "container":
            if self.image is None or self.port is None:
                raise ValueError("container-mode sandbox requires `image` and `port`")
            if self.container is not None:
                raise ValueError("`container` settings are for a vm-mode sandbox; container mode takes `image`")
        check_env_keys(self.env_vars)
        return self

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        if ctx.find_sandbox(self.sandbox_name):
            raise RuntimeError(f"Sandbox '{self.sandbox_name}' is already deployed")
        requested = user_override(ctx, "sandbox") or self.sandbox_type
        served = "local" if self.sandbox_mode == "vm" and not self.container else "docker"
        if requested not in (None, served):
            rt.log.warning("sandbox_type '%s' is served as a %s sandbox by this runtime", requested, served)
        if self.sandbox_mode == "vm" and (self.image or self.env_vars):
            rt.log.warning("deploy_sandbox '%s': a vm-mode sandbox is a local folder here; its image and "
                           "env_vars are not used", self.id)
        policy = user_override(ctx, "network_policy")
        sandbox = await asyncio.to_thread(
            rt.provider.deploy_sandbox, self.sandbox_name, step_id=self.id, sandbox_mode=self.sandbox_mode,
            ttl_seconds=user_override(ctx, "ttl_seconds") or self.ttl_seconds,
            network_policy=self.network_policy if policy is None else policy, container=self.container,
            image=self.image, ports=sorted({self.port, *(self.exposed_ports or [])} - {None}),
            cpu=self.cpu, memory_mb=self.memory_mb, env_vars=self.env_vars,
        )
        if self.env_passthrough:  # names, never values: the record is persisted
            sandbox.env_passthrough = list(self.env_passthrough)
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
        files = await asyncio.to_thread(self._files, ctx, rt)
        try:
            rows = [await self._row(files, index, criterion) for index, criterion in enumerate(self.criteria)]
        finally:
            files.close()
        self.record(ctx, rows)

    def _files(self, ctx: TaskStepContext, rt: StepRuntime) -> SandboxFiles:
        """Where the probes run: the target's container when it has one, else its folder."""
        if self.sandbox_name:
            record = _record(ctx, self.sandbox_name)
            root = getattr(record, "sandbox_root", None)
        else:
            agent = ctx.find_agent(self.agent_name)
            if agent is None:
                raise RuntimeError(f"Agent '{self.agent_name}' not found in context.deployed_agents")
            root = str(rt.provider.sandbox_of(agent).root)
            record = next((s for s in ctx.deployed_sandboxes if getattr(s, "sandbox_root", None) == root), None)
        container = (record.model_extra or {}).get("container") if record else None
        if container:  # a host folder, when there is one, is mounted at the working dir
            return ContainerFiles.attach(
                container["container_id"], (container.get("working_dir") or "/work") if root else None,
                timeout=self.shell_timeout_seconds,
            )
        return FolderFiles(LocalSandbox(Path(root)) if root else deployed_sandbox(ctx, rt, self.sandbox_name))

    async def _row(self, files: SandboxFiles, index: int, criterion: dict[str, Any]) -> dict[str, Any]:
        row = {**criterion, "criterion_index": index}
        kind = criterion.get("type")
        if kind not in HANDLED_TYPES:
            return {**row, "skipped": True, "justification": f"type {kind!r} not handled by verify_sandbox"}
        try:
            passed, why = await self._evaluate(files, criterion)
        except Exception as exc:  # a probe that cannot run fails its criterion, not the step
            passed, why = False, f"evaluator error: {exc}"[:300]
        return {**row, "score": 1.0 if passed else 0.0, "result": passed, "justification": why, "skipped": False}

    async def _evaluate(self, files: SandboxFiles, criterion: dict[str, Any]) -> tuple[bool, str]:
        """(passed, justification) of one handled criterion."""
        kind, paths = criterion["type"], criterion.get("paths") or []
        if kind == "bash_cmd_succeeds":
            return await self._shell(files, criterion.get("bash_cmd") or "")
        if not paths:
            return False, "no paths specified"
        if kind == "probe_file_contains":
            pattern = criterion.get("expected") or criterion.get("value") or ""
            try:
                text = await files.read_text(self._path(paths[0]))
            except OSError as exc:
                return False, f"could not read {paths[0]}: {exc.strerror}"
            try:
                found = re.search(pattern, text) is not None
            except re.error as exc:
                return False, f"invalid regex pattern {pattern!r}: {exc}"
            return found, f"{'contains' if found else 'does not contain'} {pattern!r}"
        test = files.is_dir if kind == "probe_dir_exists" else files.exists
        missing = [p for p in paths if not await test(self._path(p))]
        return not missing, f"Missing: {missing}" if missing else "All paths exist"

    def _path(self, path: str) -> str:
        """In-sandbox path of ``path``, taken relative to base_dir unless absolute."""
        return str(PurePosixPath(self.base_dir) / path)

    async def _shell(self, files: SandboxFiles, command: str) -> tuple[bool, str]:
        """``bash -c`` in base_dir. Whatever it started ends with it (or at the timeout, or
        when the step is cancelled), so nothing outlives the step."""
        if not command:
            return False, "no bash_cmd"
        if not await files.is_dir(self.base_dir):
            return False, f"base_dir {self.base_dir} does not exist in the sandbox"
        result = await files.run(command, self.base_dir, self.shell_timeout_seconds)
        if result.timed_out:
            return False, f"timed out after {self.shell_timeout_seconds}s"
        tail = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
        return result.exit_code == 0, f"exit={result.exit_code}; output={tail}"
