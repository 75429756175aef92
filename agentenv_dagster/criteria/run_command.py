"""``run_command``: a shell command in the sandbox, graded on its exit code and stdout.

Binary by default; with ``score_from_stdout`` the command is its own grader and prints a score.
"""

from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import Field, model_validator

from .base import Criterion, CriterionContext, CriterionResult
from .registry import criterion
from .shell import CommandOutput, command_env, run_shell, show_stream


def stdout_matches(mode: str, expected: str, stdout: str) -> bool:
    """``exact``/``contains`` compare stripped text; ``regex`` searches the raw stdout."""
    if mode == "exact":
        return stdout.strip() == expected.strip()
    if mode == "contains":
        return expected.strip() in stdout.strip()
    try:
        return re.search(expected, stdout) is not None
    except re.error:
        return False


@criterion("run_command")
class RunCommand(Criterion):
    # a shell command run in the sandbox (in the container under docker); `$REFERENCE_DIR` and
    # `$TASK_DIR` are set
    command: str
    # seconds before the command is killed (a score of 0)
    timeout: float = Field(default=30, gt=0)
    # the exit code that passes
    expected_exit_code: int = 0
    # the output that passes, compared by `stdout_match`
    expected_stdout: str | None = None
    # how `expected_stdout` is compared: equal (trimmed), contained, or a regular expression
    stdout_match: Literal["exact", "contains", "regex"] = "exact"
    # the score is the number the command prints (0 to 1)
    score_from_stdout: bool = False

    @model_validator(mode="after")
    def _one_stdout_grader(self) -> RunCommand:
        if self.score_from_stdout and self.expected_stdout is not None:
            raise ValueError(
                "'score_from_stdout' and 'expected_stdout' are mutually exclusive: use 'score_from_stdout: true' "
                "for a score printed by the command, or 'expected_stdout' to match its output"
            )
        return self

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if ctx.shell is not None:  # inside the task's container: its toolchain, not the host's
            out = await ctx.shell.run(self.command, self.timeout, ctx.env)
        else:
            out = await run_shell(self.command, cwd=ctx.sandbox_dir, env=command_env(ctx), timeout=self.timeout)
        details = self._details(out)
        if out.timed_out:
            return self.result(0.0, details=details, error=f"Command timed out after {self.timeout:g}s")
        if self.score_from_stdout:
            return self._score_from_stdout(out, details)
        exit_ok = out.exit_code == self.expected_exit_code
        if self.expected_stdout is None:
            return self.result(1.0 if exit_ok else 0.0, details=details)
        stdout_ok = stdout_matches(self.stdout_match, self.expected_stdout, out.stdout)
        verb = "matches" if stdout_ok else "does not match"
        verdict = f"Stdout ({self.stdout_match}) {verb} {self.expected_stdout!r}"
        return self.result(1.0 if exit_ok and stdout_ok else 0.0, details=f"{details}\n{verdict}")

    def _score_from_stdout(self, out: CommandOutput, details: str) -> CriterionResult:
        """The first stdout line is the score, clamped to [0, 1]; later lines are commentary."""
        if out.exit_code != self.expected_exit_code:
            error = f"Exit code {out.exit_code} != expected {self.expected_exit_code}"
            return self.result(0.0, details=details, error=error)
        first, _, rest = out.stdout.partition("\n")
        if not first.strip():
            return self.result(0.0, details=details, error="score_from_stdout: the first stdout line is empty")
        try:
            value = float(first.strip())
        except ValueError:
            error = f"score_from_stdout: first line {first.strip()!r} is not a number"
            return self.result(0.0, details=details, error=error)
        if not math.isfinite(value):
            return self.result(0.0, details=details, error=f"score_from_stdout: {value} is not a finite score")
        score = min(1.0, max(0.0, value))
        note = f"Score from stdout: {score:g}" + (f" (clamped from {value:g})" if score != value else "")
        if rest.strip():
            note += f"\n{rest.strip()}"
        return self.result(score, details=f"{note}\n{details}")

    def _details(self, out: CommandOutput) -> str:
        code = "timed out" if out.timed_out else str(out.exit_code)
        return (
            f"Command: {self.command}\nExit code: {code} (expected {self.expected_exit_code})\n"
            f"Stdout: {show_stream(out.stdout)}\nStderr: {show_stream(out.stderr)}"
        )
