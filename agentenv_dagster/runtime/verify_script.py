"""Run an env-outcome verifier script in its own interpreter.

``python -m agentenv_dagster.runtime.verify_script SCRIPT MCP_URL`` imports SCRIPT (task
data, so untrusted: never in the op's own process), awaits its ``verify(mcp_url)`` and
prints the rows as JSON on stdout.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import signal
import sys
from pathlib import Path


class VerifyScriptError(RuntimeError):
    pass


async def run_verify_script(script: Path, mcp_url: str, timeout_seconds: float) -> list[dict]:
    """The script's rows, or :class:`VerifyScriptError` naming why there are none."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, str(script), mcp_url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_seconds)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise VerifyScriptError(f"{script.name}: verify() did not finish within {timeout_seconds:g}s") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise VerifyScriptError(f"{script.name}: verify() failed: {tail[0]}")
    rows = json.loads(out)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise VerifyScriptError(f"{script.name}: verify() must return a list of dicts")
    return rows


def _main(script: str, mcp_url: str) -> None:
    spec = importlib.util.spec_from_file_location("agentenv_verify_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verify = getattr(module, "verify", None)
    if not callable(verify):
        raise SystemExit(f"{Path(script).name} defines no verify(mcp_url)")
    rows = verify(mcp_url)
    if inspect.isawaitable(rows):
        rows = asyncio.run(rows)
    json.dump(rows, sys.stdout, default=str)


if __name__ == "__main__":
    _main(*sys.argv[1:3])
