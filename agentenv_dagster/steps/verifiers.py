"""Deterministic verifiers: an env's end state checked by code, and reply text checks."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.verify_script import run_verify_script
from .base import ARTIFACT, ENV, PROMPT, VERIFICATION, TaskStep
from .registry import step
from .scoring import ScoreAggregator, aggregate


class _Verifier(TaskStep):
    writes = {"verifier_key": VERIFICATION}

    verifier_id: str | None = None
    score_aggregator: ScoreAggregator = "all_pass"

    @property
    def verifier_key(self) -> str:
        return self.verifier_id or self.id

    def record(self, ctx: TaskStepContext, rows: list[dict[str, Any]], **extra: Any) -> None:
        counted = [r for r in rows if not r.get("skipped")]
        ctx.metadata_map("verifications")[self.verifier_key] = {
            "results": rows, "score": aggregate(counted, self.score_aggregator),
            "score_aggregator": self.score_aggregator, "graded": True, **extra,
        }


ENTRY_SCRIPT = "verify.py"  # which script runs when an artifact holds several


@step("env_outcome_verifier")
class EnvOutcomeVerifierStep(_Verifier):
    """Runs a stored script's ``async verify(mcp_url)`` against the env's end state, in a
    subprocess with a timeout (the script is task data)."""

    reads = {"env_id": ENV, "file_artifact_id": ARTIFACT}

    env_id: str
    file_artifact_id: str
    file_artifact_version: int | None = None
    timeout_seconds: float = 300

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        env = ctx.find_env(self.env_id)
        if env is None:
            raise RuntimeError(f"Env '{self.env_id}' not found in context.deployed_envs")
        artifact = rt.artifacts.get(self.file_artifact_id, self.file_artifact_version)
        # an env of the run's own: the script reads it with the run's token in the URL
        mcp_url = rt.provider.server_auth.url_with_token(env.mcp_url)
        self.record(ctx, await run_verify_script(self._script(artifact.files), mcp_url, self.timeout_seconds))

    def _script(self, files: dict[str, Path]) -> Path:
        """The artifact's one script; of several, the one named ``verify.py``."""
        scripts = {name: path for name, path in files.items() if name.endswith(".py")}
        if len(scripts) > 1:
            scripts = {n: p for n, p in scripts.items() if Path(n).name == ENTRY_SCRIPT} or scripts
        if not scripts:
            raise RuntimeError(f"Artifact '{self.file_artifact_id}' holds no Python script")
        if len(scripts) > 1:
            raise RuntimeError(f"Artifact '{self.file_artifact_id}' holds {len(scripts)} Python scripts "
                               f"({', '.join(sorted(scripts))}); name the one to run {ENTRY_SCRIPT}")
        return next(iter(scripts.values()))


class ResponseCriterion(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["response_contains", "response_regex_present"]
    needles: list[str] | None = None
    pattern: str | None = None
    flags: list[str] | None = None


@step("agent_prompt_response_verifier")
class AgentPromptResponseVerifierStep(_Verifier):
    """Checks the reply text itself: needles it must contain, patterns it must match."""

    reads = {"prompt_id": PROMPT}

    prompt_id: str
    criteria: list[ResponseCriterion]

    @field_validator("criteria")
    @classmethod
    def _check(cls, criteria: list[ResponseCriterion]) -> list[ResponseCriterion]:
        for c in criteria:
            if c.type == "response_contains" and not c.needles:
                raise ValueError("response_contains needs non-empty `needles`")
            if c.type == "response_regex_present":
                if not c.pattern:
                    raise ValueError("response_regex_present needs a non-empty `pattern`")
                for flag in c.flags or []:
                    if not isinstance(getattr(re, flag, None), re.RegexFlag):
                        raise ValueError(f"unknown regex flag {flag!r}")
        return criteria

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        response = ctx.find_prompt_response(self.prompt_id)
        if response is None:
            raise RuntimeError(f"PromptResponse with prompt_id='{self.prompt_id}' not found in context")
        if response.error_type:
            self.record(ctx, [{
                "id": "prompt_error", "score": 0, "result": False, "skipped": True,
                "message": f"Skipped: prompt had error_type={response.error_type}",
            }])
            return
        self.record(ctx, [_check_response(c, i, response.response) for i, c in enumerate(self.criteria)])


def _check_response(criterion: ResponseCriterion, index: int, text: str) -> dict[str, Any]:
    if criterion.type == "response_contains":
        missing = [n for n in criterion.needles or [] if n not in text]
        passed, why = not missing, f"missing: {missing}" if missing else "all needles present"
    else:
        flags = re.DOTALL
        for name in criterion.flags or []:
            flags |= getattr(re, name)
        passed = re.search(criterion.pattern, text, flags) is not None
        why = f"pattern {'found' if passed else 'not found'}: {criterion.pattern}"
    return {
        **criterion.model_dump(exclude_none=True), "criterion_index": index,
        "score": 1.0 if passed else 0.0, "result": passed, "justification": why,
    }
