"""Python criteria the corpus uses: ``pytest`` (share of tests passing) and ``import_check``
(share of a file's imports that resolve), both run in the sandbox's environment."""

from __future__ import annotations

import ast
import json
import re
import sys

from pydantic import Field

from . import paths
from .base import Criterion, CriterionContext, CriterionResult
from .files import FileCriterion
from .paths import SandboxPath
from .registry import criterion
from .shell import command_env, find_program, run_argv, show_stream

# A run that exited non-zero never scores a perfect 1.0, even when every counted test passed.
IMPERFECT_RUN_CAP = 0.99
SUMMARY_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped)\b")
COLLECTED = re.compile(r"collected (\d+) items?")

# Resolves each module named on argv with find_spec, from the file's directory as a script would.
RESOLVE_SCRIPT = """
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
found = {}
for name in sys.argv[2:]:
    try:
        found[name] = importlib.util.find_spec(name) is not None
    except Exception:
        found[name] = False
print(json.dumps(found))
"""


def pytest_counts(output: str) -> dict[str, int]:
    """Counts from pytest's closing summary line (the last line that carries any)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for line in reversed(output.splitlines()):
        found = SUMMARY_COUNT.findall(line)
        if found:
            for number, word in found:
                counts["errors" if word.startswith("error") else word] += int(number)
            break
    collected = COLLECTED.search(output)
    counts["collected"] = max(int(collected.group(1)) if collected else 0, sum(counts.values()))
    return counts


@criterion("pytest")
class Pytest(Criterion):
    """Fractional: passed / (passed + failed + errors); nothing collected or nothing run is 0.0."""

    path: SandboxPath = "."
    args: list[str] = []
    timeout: float = Field(default=60, gt=0)

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        env = command_env(ctx)
        program = find_program("pytest", env)
        argv = [program] if program else [sys.executable, "-m", "pytest"]
        out = await run_argv([*argv, self.path, *self.args], cwd=ctx.sandbox_dir, env=env, timeout=self.timeout)
        tail = f"Stdout: {show_stream(out.stdout[-2000:])}\nStderr: {show_stream(out.stderr[-2000:])}"
        if out.timed_out:
            return self.result(0.0, details=tail, error=f"pytest timed out after {self.timeout:g}s")
        counts = pytest_counts(f"{out.stdout}\n{out.stderr}")
        ran = counts["passed"] + counts["failed"] + counts["errors"]
        head = f"Exit code: {out.exit_code}, Pytest: "
        if counts["collected"] == 0:
            return self.result(0.0, details=f"{head}no tests collected (score: 0.00)\n{tail}")
        if ran == 0:
            none_ran = f"{counts['collected']} collected, {counts['skipped']} skipped, none ran (score: 0.00)"
            return self.result(0.0, details=f"{head}{none_ran}\n{tail}")
        score = counts["passed"] / ran
        if out.exit_code != 0 and score == 1.0:
            score = IMPERFECT_RUN_CAP
        summary = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
                   f"{counts['skipped']} skipped out of {counts['collected']} collected (score: {score:.2f})")
        return self.result(score, details=f"{head}{summary}\n{tail}")


def absolute_imports(source: str) -> list[str]:
    """Every absolute module imported anywhere in ``source`` (nested scopes too), in order, once.

    Relative imports are skipped: they cannot be resolved without the package they live in."""
    modules: dict[str, None] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(dict.fromkeys(alias.name for alias in node.names))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules[node.module] = None
    return list(modules)


@criterion("import_check")
class ImportCheck(FileCriterion):
    """Fractional: the file parses, and this share of its imports resolves in the sandbox."""

    blocking = False  # its resolver is a subprocess of the step's own loop, cancelled with it

    timeout: float = Field(default=30, gt=0)

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        target = paths.resolve_one(ctx.sandbox_dir, self.path)
        if target is None:
            return self.missing()
        try:
            modules = absolute_imports(paths.read_text(target))
        except SyntaxError as exc:
            return self.result(0.0, details=f"Syntax error in '{self.path}': {exc}", error=f"SyntaxError: {exc}")
        if not modules:
            return self.result(1.0, details="No imports to check")
        env = command_env(ctx)
        python = find_program("python", env) or sys.executable
        out = await run_argv([python, "-c", RESOLVE_SCRIPT, str(target.parent), *modules],
                             cwd=ctx.sandbox_dir, env=env, timeout=self.timeout)
        resolved = _resolved(out.stdout) if out.exit_code == 0 else {}
        failed = [m for m in modules if not resolved.get(m)]
        details = f"Checked: {len(modules)}, resolved: {len(modules) - len(failed)}/{len(modules)}"
        if failed:
            details += f"; Failed: {', '.join(failed)}"
        if out.exit_code != 0:
            ended = "timed out" if out.timed_out else f"exited {out.exit_code}"
            details += f"\nResolver {ended}: {show_stream(out.stderr)}"
        return self.result((len(modules) - len(failed)) / len(modules), details=details)


def _resolved(stdout: str) -> dict[str, bool]:
    lines = stdout.strip().splitlines()
    try:
        found = json.loads(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
