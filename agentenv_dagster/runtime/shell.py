"""Where a sandbox's shell commands run (pre/post_run commands, the agent's Bash tool, shell criteria): on the
host in its folder, or inside its container; with a deadline, past which all it started is killed. Such a command
sees an allowlist of this process's environment (:func:`sandbox_env`): it is the agent's or the task's, not ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Protocol

# What a host interpreter running task data gets of this process's environment: what Python needs, never a secret;
HOST_ENV_KEYS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT")
# what a sandbox's shell gets besides: the terminal and user a shell expects.
SANDBOX_ENV_KEYS = (*HOST_ENV_KEYS, "LC_CTYPE", "TERM", "USER", "LOGNAME", "SHELL", "TZ")


def passed_through(names: Iterable[str]) -> dict[str, str]:
    """The variables ``names`` as this process has them."""
    return {k: os.environ[k] for k in names if k in os.environ}


def host_env(**extra: str) -> dict[str, str]:
    """This process's environment cut down to :data:`HOST_ENV_KEYS`, plus ``extra``."""
    return {**passed_through(HOST_ENV_KEYS), **extra}


def sandbox_env(passthrough: Iterable[str] = (), own: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a command an agent or a task runs on this machine: :data:`SANDBOX_ENV_KEYS` and the task's
    ``passthrough`` names (``env_passthrough``) as this process has them, plus the sandbox's own variables ``own``."""
    return {**passed_through([*SANDBOX_ENV_KEYS, *passthrough]), **(own or {})}


@dataclass(frozen=True)
class ShellResult:
    exit_code: int | None  # None when the deadline ended it
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


class SandboxShell(Protocol):
    async def run(self, command: str, timeout: float, env: dict[str, str] | None = None) -> ShellResult: ...


async def run_argv(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> ShellResult:
    """Run ``argv`` in its own process group, which ends with it: nothing it started in the background outlives it."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    code = None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        code = proc.returncode
    except asyncio.TimeoutError:
        _kill_group(proc.pid)
        out, err = await proc.communicate()
    finally:
        _kill_group(proc.pid)
        if proc.returncode is None:
            await proc.wait()
    return ShellResult(code, out.decode(errors="replace"), err.decode(errors="replace"))


@dataclass(frozen=True)
class HostShell:
    """``bash -c`` in ``cwd`` on this machine (:func:`run_argv`), in :func:`sandbox_env` of ``passthrough``, ``env``."""

    cwd: Path
    passthrough: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None

    async def run(self, command: str, timeout: float, env: dict[str, str] | None = None) -> ShellResult:
        return await run_argv(["bash", "-c", command], cwd=self.cwd,
                              env=sandbox_env(self.passthrough, {**(self.env or {}), **(env or {})}), timeout=timeout)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@dataclass(frozen=True)
class ContainerShell:
    """``sh -c`` in the container's working dir, with its own environment plus ``env`` (nothing of this process's)."""

    container_id: str
    working_dir: str
    env: Mapping[str, str] | None = None

    async def run(self, command: str, timeout: float, env: dict[str, str] | None = None) -> ShellResult:
        from .containers import ContainerSandbox  # the docker SDK only when a container is used

        sandbox = await asyncio.to_thread(ContainerSandbox.attach, self.container_id, self.working_dir)
        try:
            result = await sandbox.exec(command, timeout, {**(self.env or {}), **(env or {})} or None)
        finally:
            sandbox.close()
        return ShellResult(None if result.timed_out else result.exit_code, result.stdout, result.stderr)


def sandbox_shell(sandbox_root: str | Path, container: dict | None = None, *, passthrough: Iterable[str] = (),
                  env: Mapping[str, str] | None = None) -> SandboxShell:
    """The shell of a sandbox record: its container when it has one, else its folder (with
    the ``passthrough`` variables of this process); ``env`` = the sandbox's own variables."""
    if container and container.get("container_id"):
        return ContainerShell(container["container_id"], container.get("working_dir") or "/work", env)
    return HostShell(Path(sandbox_root), tuple(passthrough), env)
