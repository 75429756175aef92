"""Recording CLI mocks (Coder Eval ``sandbox.record_cli``): a shim per tool in ``cli_mocks/``.

Each call appends ``{"argv", "tool", "exit", "ts", "rule"}`` to ``cli_mocks/calls.jsonl`` (what ``cli_called``
grades) and answers from the first ``responses`` rule whose ``when`` argv pattern matches — the same matcher
``cli_called`` uses — else from the entry's own fields. The shim runs with this interpreter, so it works on the host.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

SHIM = """#!{python}
import sys
from agentenv_dagster.runtime.cli_shim import answer
sys.exit(answer({spec!r}, sys.argv[1:], __file__))
"""


def write_shims(folder: Path, entries: list[dict[str, Any]]) -> None:
    """One executable per entry under ``folder``, named after its tool."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        shim = folder / entry["tool"]
        shim.write_text(SHIM.format(python=sys.executable, spec=json.dumps(entry)))
        shim.chmod(0o755)


def answer(spec: str, argv: list[str], shim_path: str) -> int:
    """Log the call, print the canned output, return the exit code."""
    entry = json.loads(spec)
    record: dict[str, Any] = {"argv": argv, "tool": entry["tool"], "ts": time.time(), "rule": None}
    reply = entry
    try:
        for index, rule in enumerate(entry.get("responses") or []):
            from ..criteria.cli import CliCalled  # cli_called's matcher, loaded only when there are rules
            when = CliCalled.model_validate({"type": "cli_called", "description": "when", **rule["when"]})
            if when.argv_matches(argv):
                record["rule"], reply = index, {"exit_code": 0, **rule}
                break
    except Exception as exc:  # a broken rule is the task's fault: cli_called reports it as ERROR
        record["rule_error"] = f"{type(exc).__name__}: {exc}"
    record["exit"] = code = int(reply.get("exit_code", 1))
    with open(Path(shim_path).parent / "calls.jsonl", "a") as log:
        log.write(json.dumps(record) + "\n")
    sys.stdout.write(reply.get("stdout", ""))
    sys.stderr.write(reply.get("stderr", ""))
    return code
