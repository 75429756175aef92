"""The LLM judge: one forced ``submit_verdict`` call to the configured model of any provider (``runtime.models``).
A judge without a key or base URL is *unavailable*: callers record the verification as not graded, inventing nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ..config import AgentEnvConfig, ResolvedModel
from .models import ModelAPIError, ModelClient, ModelReply, UnreadableReply, Usage, model_client

VERDICT_TOOL = "submit_verdict"


class JudgeUnavailable(RuntimeError):
    """No judge can be reached from here; the verification is recorded as not graded."""


class JudgeError(RuntimeError):
    pass


class JudgeNoVerdict(JudgeError):
    """The judge answered without a readable ``submit_verdict`` call: a missing verdict, not a transport failure."""


class JudgeAPIError(JudgeError):
    """The model's API refused or failed the call past the SDK's retries: the judge's fault, not the graded agent's."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


@dataclass
class JudgeUsage(Usage):
    """The tokens of a judge's calls, summed, and how many calls there were."""

    calls: int = 0

    def add(self, usage: Usage) -> None:
        self.calls += 1
        for bucket in fields(Usage):
            setattr(self, bucket.name, getattr(self, bucket.name) + getattr(usage, bucket.name))


@dataclass
class LLMJudge:
    resolved: ResolvedModel
    api_key: str | None = field(default=None, repr=False)  # instead of the provider's
    base_url: str | None = None  # instead of the provider's
    attempts: int = 3
    usage: JudgeUsage = field(default_factory=JudgeUsage)

    @property
    def model(self) -> str:
        """The model as configured (``provider/model``, or a bare Anthropic name)."""
        return self.resolved.ref

    def client(self) -> ModelClient:
        """A fresh client for one grading (a conversation reuses it; the SDK retries 429 / 5xx twice); close it after.
        :func:`llm_judge` has checked that the model's settings are there."""
        return model_client(self.resolved, api_key=self.api_key, base_url=self.base_url)

    async def create(self, client: ModelClient, **request: Any) -> ModelReply:
        """One request with this judge's model, its usage counted. What the SDK's retries leave (a 4xx, exhausted
        429/529/5xx, no connection) is a ``JudgeAPIError``; a reply that cannot be read is ``UnreadableReply``."""
        try:
            reply = await client.create(**request)
        except ModelAPIError as exc:
            message = (f"judge {exc}" if exc.status is None else
                       f"judge API error {exc.status} ({exc.kind}) for model '{self.model}': {exc.detail}")
            raise JudgeAPIError(message, retryable=exc.retryable) from exc
        self.usage.add(reply.usage)
        return reply

    async def verdict(self, prompt: str, input_schema: dict[str, Any], *, max_tokens: int = 4096) -> dict[str, Any]:
        """The input of the forced ``submit_verdict`` call (``JudgeNoVerdict`` when there is none). What the SDK's
        retries give up on is tried ``attempts`` times in all; a refused request (another 4xx) fails at once."""
        tool = {"name": VERDICT_TOOL, "description": "Submit the grading verdict.", "input_schema": input_schema}
        request = {"max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}], "tools": [tool],
                   "tool_choice": {"type": "tool", "name": VERDICT_TOOL}}
        last_error: JudgeAPIError | None = None
        async with self.client() as client:
            for _ in range(self.attempts):
                try:
                    reply = await self.create(client, **request)
                except JudgeAPIError as exc:
                    if not exc.retryable:
                        raise JudgeError(f"LLM judge failed: {exc}") from None
                    last_error = exc
                    continue
                except UnreadableReply as exc:
                    raise JudgeNoVerdict(str(exc)) from None
                for block in reply.tool_uses():
                    if block.name == VERDICT_TOOL:
                        if not isinstance(block.input, dict):
                            raise JudgeNoVerdict("the submit_verdict input is not an object")
                        return dict(block.input)
                raise JudgeNoVerdict("judge replied without calling submit_verdict")
        raise JudgeError(f"LLM judge failed after {self.attempts} attempts: {last_error}")


def llm_judge(config: AgentEnvConfig, model: str | None = None, base_url: str | None = None,
              api_key: str | None = None) -> LLMJudge:
    """The configured judge for ``model`` (``[model]``'s judge role by default); ``base_url`` and ``api_key`` (a step's
    ``default_model_api_base``, a run's overrides) win over the provider's. ``JudgeUnavailable`` without them."""
    try:
        resolved = config.model.resolve(model or config.model.for_role("judge"))
    except ValueError as exc:
        raise JudgeUnavailable(f"no judge configured: {exc}") from None
    if missing := resolved.missing_setting(api_key, base_url):
        raise JudgeUnavailable(f"no judge configured: {missing}")
    return LLMJudge(resolved, api_key=api_key, base_url=base_url)
