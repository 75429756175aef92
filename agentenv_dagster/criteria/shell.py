"""Running checker commands in the sandbox: its own process group, a deadline, captured output."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from .base import CriterionContext

STREAM_LIMIT = 4000


@dataclass
class CommandOutput:
    exit_code: int | None  # None when the deadline killed it
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None


def command_env(ctx: CriterionContext) -> dict[str, str]:
    """The host environment, the run's extras, and where the task and its reference live."""
    env = {**os.environ, **ctx.env, "TASK_DIR": str(ctx.task_dir)}
    if ctx.reference_dir is not None:
        env["REFERENCE_DIR"] = str(ctx.reference_dir)
    return env


def find_program(name: str, env: dict[str, str]) -> str | None:
    """``name`` looked up on the PATH the command will run with, not the host's."""
    return shutil.which(name, path=env.get("PATH"))


async def run_argv(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> CommandOutput:
    """Run ``argv``; past ``timeout`` seconds its whole process group is killed."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
        code = proc.returncode
    except asyncio.TimeoutError:
        _kill_group(proc.pid)
        out, err = await proc.communicate()
        code = None
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    return CommandOutput(code, out.decode(errors="replace"), err.decode(errors="replace"))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


async def run_shell(command: str, *, cwd: Path, env: dict[str, str], timeout: float) -> CommandOutput:
    """A command line through bash (pipes, redirects and ``&&`` allowed), as the sandbox runs it."""
    return await run_argv([find_program("bash", env) or "/bin/sh", "-c", command], cwd=cwd, env=env, timeout=timeout)


def show_stream(text: str, limit: int = STREAM_LIMIT) -> str:
    """A captured stream for details: "(empty)", or cut at ``limit`` with the rest counted."""
    if not text:
        return "(empty)"
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more chars truncated)"
