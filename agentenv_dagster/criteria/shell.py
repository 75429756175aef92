"""Running checker commands on the host: the environment they see (an allowlist: never our
API keys), programs on its PATH, streams shown in details (the process handling itself is
``runtime.shell``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..runtime.shell import ShellResult, run_argv, sandbox_env
from .base import CriterionContext

STREAM_LIMIT = 4000
CommandOutput = ShellResult  # exit_code None = the deadline killed it


def command_env(ctx: CriterionContext) -> dict[str, str]:
    """The sandbox's environment (``runtime.shell.sandbox_env``) with the run's extras (the
    variables the task passes through), and where the task and its reference live."""
    env = sandbox_env((), {**ctx.env, "TASK_DIR": str(ctx.task_dir)})
    if ctx.reference_dir is not None:
        env["REFERENCE_DIR"] = str(ctx.reference_dir)
    return env


def find_program(name: str, env: dict[str, str]) -> str | None:
    """``name`` looked up on the PATH the command will run with, not the host's."""
    return shutil.which(name, path=env.get("PATH"))


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
