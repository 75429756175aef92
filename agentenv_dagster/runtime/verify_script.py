"""Run an env-outcome verifier script in its own interpreter.

``python -m agentenv_dagster.runtime.verify_script SCRIPT MCP_URL RESULT`` imports SCRIPT (task data, so untrusted:
never in the op's own process, and given none of its secrets), awaits its ``verify(mcp_url)``
and writes the rows as JSON to RESULT — not to stdout, which is the script's own to print on.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
import tempfile
from pathlib import Path

from .shell import host_env, run_argv

PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])  # where ``agentenv_dagster`` imports from


class VerifyScriptError(RuntimeError):
    pass


async def run_verify_script(script: Path, mcp_url: str, timeout_seconds: float) -> list[dict]:
    """The script's rows, or :class:`VerifyScriptError` naming why there are none. The script
    runs in a scratch folder with only :data:`~.shell.HOST_ENV_KEYS` of the environment."""
    with tempfile.TemporaryDirectory(prefix="agentenv-verify-") as scratch:
        result = Path(scratch) / "rows.json"
        env = host_env(PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=PACKAGE_PARENT)
        argv = [sys.executable, "-m", __name__, str(script), mcp_url, str(result)]
        done = await run_argv(argv, cwd=Path(scratch), env=env, timeout=timeout_seconds)
        if done.timed_out:
            raise VerifyScriptError(f"{script.name}: verify() did not finish within {timeout_seconds:g}s")
        if done.exit_code != 0:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.exit_code}"]
            raise VerifyScriptError(f"{script.name}: verify() failed: {tail[0]}")
        try:
            rows = json.loads(result.read_text())
        except (OSError, ValueError) as exc:
            raise VerifyScriptError(f"{script.name}: verify() left no readable rows: {exc}") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise VerifyScriptError(f"{script.name}: verify() must return a list of dicts")
    return rows


def _main(script: str, mcp_url: str, result: str) -> None:
    # imported as a module (not runpy, whose functions are not guaranteed to work once it returns)
    spec = importlib.util.spec_from_file_location("agentenv_verify_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verify = getattr(module, "verify", None)
    if not callable(verify):
        raise SystemExit(f"{Path(script).name} defines no verify(mcp_url)")
    rows = verify(mcp_url)
    if inspect.isawaitable(rows):
        rows = asyncio.run(rows)
    Path(result).write_text(json.dumps(rows, default=str))  # encoded first: no half-written file


if __name__ == "__main__":
    _main(*sys.argv[1:4])
