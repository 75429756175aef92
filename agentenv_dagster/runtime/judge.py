"""The LLM judge: one forced tool call through the ``anthropic`` client.

A judge that is not configured (no API key) is *unavailable*, and callers record the
verification as not graded: offline, nothing invents a verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..config import AgentEnvConfig

VERDICT_TOOL = "submit_verdict"


class JudgeUnavailable(RuntimeError):
    """No judge can be reached from here; the verification is recorded as not graded."""


class JudgeError(RuntimeError):
    pass


class JudgeNoVerdict(JudgeError):
    """The judge answered but did not call ``submit_verdict``: a missing verdict, not a
    transport failure (callers may ask again or score it 0)."""


class JudgeAPIError(JudgeError):
    """The Messages API refused or failed the call after the SDK's own retries: a fault of the
    judge's infrastructure or configuration, never of the graded agent."""

    def __init__(self, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.retryable = retryable


RETRYABLE_STATUS = frozenset({408, 409, 429})  # with every 5xx: what the SDK itself retries


@dataclass
class JudgeUsage:
    input_tokens: int = 0  # uncached input
    output_tokens: int = 0
    calls: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0

    def add(self, usage: Any) -> None:
        self.calls += 1
        self.input_tokens += getattr(usage, "input_tokens", 0) or 0
        self.output_tokens += getattr(usage, "output_tokens", 0) or 0
        self.cache_creation_input_tokens += getattr(usage, "cache_creation_input_tokens", 0) or 0
        self.cache_read_input_tokens += getattr(usage, "cache_read_input_tokens", 0) or 0


@dataclass
class LLMJudge:
    model: str
    api_key: str = field(repr=False)
    base_url: str | None = None
    attempts: int = 3
    usage: JudgeUsage = field(default_factory=JudgeUsage)
    max_retries: int = 2  # the SDK's own retries of 429 / 5xx / connection errors, per call

    def client(self) -> Any:
        """A fresh ``AsyncAnthropic`` for one grading (a conversation reuses it); close it after."""
        import anthropic  # ~1 s to import: only when a judge really runs

        return anthropic.AsyncAnthropic(api_key=self.api_key, base_url=self.base_url, max_retries=self.max_retries)

    async def create(self, client: Any, **request: Any) -> Any:
        """One ``messages.create`` with this judge's model; usage is counted. What the SDK's
        retries leave (a 4xx, exhausted 429/529/5xx, no connection) is a ``JudgeAPIError``
        (``retryable`` when another attempt may help)."""
        import anthropic

        try:
            message = await client.messages.create(model=self.model, **request)
        except anthropic.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error") if isinstance(body.get("error"), dict) else {}
            kind = error.get("type") or type(exc).__name__
            detail = error.get("message") or str(exc)
            raise JudgeAPIError(
                f"judge API error {exc.status_code} ({kind}) for model '{self.model}': {detail}",
                retryable=exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500,
            ) from exc
        except anthropic.APIConnectionError as exc:
            raise JudgeAPIError(f"judge API unreachable at {self.base_url or 'api.anthropic.com'}: {exc}",
                                retryable=True) from exc
        self.usage.add(message.usage)
        return message

    async def verdict(self, prompt: str, input_schema: dict[str, Any], *, max_tokens: int = 4096) -> dict[str, Any]:
        """Ask for the verdict as the forced ``submit_verdict`` tool call; its input is returned.

        The SDK retries 429/5xx itself; what it gives up on (and a lost connection) is tried
        ``attempts`` times in all. A request the API refuses (another 4xx) fails at once:
        asking again would be refused again.
        """
        client = self.client()
        tool = {"name": VERDICT_TOOL, "description": "Submit the grading verdict.", "input_schema": input_schema}
        last_error: JudgeAPIError | None = None
        try:
            for _ in range(self.attempts):
                try:
                    message = await self.create(
                        client, max_tokens=max_tokens, messages=[{"role": "user", "content": prompt}],
                        tools=[tool], tool_choice={"type": "tool", "name": VERDICT_TOOL},
                    )
                except JudgeAPIError as exc:
                    if not exc.retryable:
                        raise JudgeError(f"LLM judge failed: {exc}") from None
                    last_error = exc
                    continue
                for block in message.content:
                    if getattr(block, "type", None) == "tool_use" and block.name == VERDICT_TOOL:
                        return dict(block.input)
                raise JudgeNoVerdict("judge replied without calling submit_verdict")
        finally:
            await client.close()
        raise JudgeError(f"LLM judge failed after {self.attempts} attempts: {last_error}")


def llm_judge(config: AgentEnvConfig, model: str | None = None, base_url: str | None = None) -> LLMJudge:
    """The configured judge; ``base_url`` (a step's ``default_model_api_base``) wins over
    ``[model] base_url``."""
    api_key = config.model.resolved_api_key()
    if not api_key:
        raise JudgeUnavailable(
            "no judge configured: set [model] api_key in .agentenv/config.toml or ANTHROPIC_API_KEY"
        )
    return LLMJudge(
        model=model or config.model.for_role("judge"), api_key=api_key,
        base_url=base_url or config.model.resolved_base_url(),
    )
