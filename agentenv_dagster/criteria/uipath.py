"""``uipath_eval``: run a UiPath agent's evaluation set with the ``uipath`` CLI and gate its metrics."""

from __future__ import annotations

import json
import secrets
from statistics import fmean
from typing import Any

from .base import Criterion, CriterionContext, CriterionResult
from .registry import criterion
from .shell import command_env, find_program, run_argv, show_stream

OVERALL = "*"
# An evaluation set calls an LLM per case; a stuck run must still end.
EVAL_TIMEOUT_SECONDS = 600


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def eval_metrics(output: dict[str, Any]) -> dict[str, Any]:
    """Per-evaluator mean scores plus ``*`` (mean of the means) from an eval-set result;
    any other object is taken as the metric map itself."""
    if "evaluationSetResults" not in output:
        return output
    scores: dict[str, list[float]] = {}
    for result_set in output.get("evaluationSetResults") or []:
        for run in (result_set or {}).get("evaluationRunResults") or []:
            score = _number(((run or {}).get("result") or {}).get("score"))
            scores.setdefault(str(run.get("evaluatorId")), []).append(0.0 if score is None else score)
    metrics: dict[str, Any] = {evaluator: fmean(values) for evaluator, values in scores.items()}
    if metrics:
        metrics[OVERALL] = fmean(metrics.values())
    return metrics


@criterion("uipath_eval")
class UipathEval(Criterion):
    """Fractional: share of ``thresholds`` (metric → minimum) the evaluation run meets."""

    agent_name: str
    eval_set: str
    thresholds: dict[str, float]

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        env = command_env(ctx)
        program = find_program("uipath", env)
        if program is None:
            return self.result(0.0, error="uipath_eval needs the `uipath` CLI on PATH (install the uipath package in "
                                          "the sandbox's environment); it was not found")
        local = ctx.task_dir / self.eval_set
        eval_set = str(local) if local.is_file() else self.eval_set
        output_path = ctx.sandbox_dir / f"uipath_eval_output_{secrets.token_hex(4)}.json"
        argv = [program, "eval", self.agent_name, eval_set, "--no-report", "--output-file", output_path.name]
        try:
            out = await run_argv(argv, cwd=ctx.sandbox_dir, env=env, timeout=EVAL_TIMEOUT_SECONDS)
            if out.exit_code != 0:
                why = "timed out" if out.timed_out else f"exited {out.exit_code}"
                return self.result(0.0, details=f"Stderr: {show_stream(out.stderr)}", error=f"uipath eval {why}")
            try:
                output = json.loads(output_path.read_text())
            except (OSError, ValueError) as exc:
                return self.result(0.0, error=f"uipath eval output is not readable JSON: {exc}")
        finally:
            output_path.unlink(missing_ok=True)
        if not isinstance(output, dict):
            return self.result(0.0, error=f"uipath eval output is a JSON {type(output).__name__}, not an object")
        return self._gate(eval_metrics(output))

    def _gate(self, metrics: dict[str, Any]) -> CriterionResult:
        if not self.thresholds:
            return self.result(1.0, details="No thresholds to check")
        lines, passed = [], 0
        for metric, minimum in self.thresholds.items():
            value = _number(metrics.get(metric))
            ok = value is not None and value >= minimum
            passed += ok
            seen = "missing" if metric not in metrics else repr(metrics[metric]) if value is None else f"{value:.3f}"
            lines.append(f"{metric}: {seen} (minimum {minimum}): {'pass' if ok else 'fail'}")
        score = passed / len(self.thresholds)
        return self.result(score, details=f"Thresholds met: {passed}/{len(self.thresholds)}\n" + "\n".join(lines))
