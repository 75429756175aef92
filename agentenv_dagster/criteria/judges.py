"""Judge criteria (``llm_judge``, ``agent_judge``): a model grades the task through a
``submit_verdict`` tool call (or the schema-constrained response, for providers configured
so), with the model of ``[model]``'s role ``judge`` (``provider/model``) and its provider's
URL and key. A judge with no key configured is recorded as not graded (no score, a reason),
never given an invented verdict; a missing or malformed verdict scores 0.0 with the error; an
API failure left after the SDK's retries makes the task an ERROR.

The grading message and verdict rules live in ``judge_prompt``, the agent judge's sandbox
copy, tools and loop in ``judge_agent``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..runtime.judge import JudgeAPIError, JudgeUnavailable, LLMJudge, llm_judge
from ..runtime.models import UnreadableReply
from . import judge_agent
from .base import Criterion, CriterionContext, CriterionResult, JudgeInfrastructureError
from .judge_prompt import (
    LLM_SYSTEM_PROMPT,
    VERDICT_TOOL,
    VERDICT_TOOL_SPEC,
    Scrubber,
    Verdict,
    VerdictError,
    capped_transcript,
    grading_message,
    kept,
    last_verdict_input,
    parse_verdict,
    reference_block,
    token_usage,
)
from .paths import check_relative
from .registry import criterion

HOST_PREFIXES = ("$TASK_DIR/", "$REFERENCE_DIR/")
DEFAULT_JUDGE_MODEL = "anthropic.claude-sonnet-4-6"
# Never copied into a judge's working copy: planted hooks, MCP servers, and the reference mount.
SECURITY_IGNORE_FLOOR = (".claude", ".mcp.json", "_reference")
# Keys the older agent_judge shape put on the criterion itself; they now live under ``agent``.
LEGACY_AGENT_KEYS = ("model", "permission_mode", "allowed_tools", "disallowed_tools", "ignore_patterns")


class JudgeCriterion(Criterion):
    """What both judges are shown, and how much of it."""

    # what the judge grades against
    prompt: str
    # `false` leaves the criterion out (not graded)
    enabled: bool = True
    # sandbox files (globs) the judge is shown
    files: list[str] = []
    # show the judge the reference solution, when the task has one
    include_reference: bool = True
    # show the judge the agent's final answer
    include_agent_output: bool = False
    # show the judge the agent's tool calls
    include_tool_calls: bool = False
    # show the judge the conversation
    include_dialog: bool = False
    # the conversation shown at most
    max_dialog_chars: int = Field(default=80_000, gt=0)
    # each file shown at most
    max_file_chars: int = Field(default=20_000, gt=0)
    # keep the judge's exchange beside task.json (`judge-N.yaml`)
    capture_transcript: bool = True
    # the transcript kept at most
    max_transcript_chars: int = Field(default=100_000, gt=0)
    pass_threshold: float = Field(default=0.7, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "verdict_channel" in data:
            raise ValueError("'verdict_channel' was removed: judges always return their verdict through the "
                             "submit_verdict tool; delete the key")
        return data

    @field_validator("files")
    @classmethod
    def _file_entries(cls, files: list[str]) -> list[str]:
        """Plain entries are sandbox files; ``$TASK_DIR/``/``$REFERENCE_DIR/`` ones are host files."""
        for entry in files:
            if not entry.startswith(HOST_PREFIXES):
                check_relative(entry)
        return files

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if not self.enabled:
            return self.result(1.0, details="(skipped: enabled=false)", result_kind="judge")
        config = ctx.config if ctx.config is not None else _load_config(ctx.task_dir)
        try:
            judge = llm_judge(config, self.judge_model(config))
        except JudgeUnavailable as exc:
            return self.result(None, details=f"not graded: {exc}", evaluation_status="not_evaluated",
                               result_kind="judge")
        scrub = Scrubber(ctx.reference_dir)
        started = time.perf_counter()
        client = judge.client()
        try:
            verdict, error, transcript, notes = await self.grade(judge, client, ctx)
        except JudgeAPIError as exc:
            raise JudgeInfrastructureError(f"{self.type} '{self.description}': {scrub(str(exc))}") from None
        finally:
            await client.close()
        usage = token_usage(judge.usage, judge.model, config.model.prices)
        transcript.update(model=judge.model, token_usage=usage, duration_seconds=round(time.perf_counter() - started, 3))
        kept = scrub(capped_transcript(transcript, self.max_transcript_chars)) if self.capture_transcript else None
        note = "".join(f"\nnote: {n}" for n in notes)
        if verdict is None:
            return self.result(0.0, details="Judge verdict invalid" + note, error=scrub(error), result_kind="judge",
                               token_usage=usage, transcript=kept)
        return self.result(verdict.score, details=scrub(f"rationale: {verdict.rationale}") + note,
                           findings=scrub(verdict.findings), result_kind="judge", token_usage=usage,
                           transcript=kept)

    def judge_model(self, config: Any) -> str:
        """The criterion's own model when the task names one, else ``[model]``'s judge role
        (the upstream default name means "the default judge": lowering writes defaults out)."""
        return _chosen_model(getattr(self, "model", None), DEFAULT_JUDGE_MODEL, config)

    async def grade(self, judge: LLMJudge, client: Any, ctx: CriterionContext) -> tuple[
            Verdict | None, str | None, dict[str, Any], list[str]]:
        """(verdict or None, error, transcript, notes); API errors propagate."""
        raise NotImplementedError


@criterion("llm_judge")
class LlmJudge(JudgeCriterion):
    """One LLM call grades the task against ``prompt`` through a forced ``submit_verdict`` tool."""

    model: str = DEFAULT_JUDGE_MODEL
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(default=2000, gt=0)

    def _sampling(self) -> dict[str, Any]:
        """``temperature`` goes out only when the task sets one other than the default 0.0: the
        SDK in use no longer takes sampling parameters as arguments (it is sent as a body
        field), and a model that refuses it must not fail every default judge."""
        return {"extra_body": {"temperature": self.temperature}} if self.temperature != 0.0 else {}

    async def grade(self, judge, client, ctx):
        reference = reference_block(self, ctx) if self.include_reference else None
        message = grading_message(self, ctx, reference=reference)
        try:
            reply = await judge.create(
                client, system=LLM_SYSTEM_PROMPT, messages=[{"role": "user", "content": message.text}],
                tools=[VERDICT_TOOL_SPEC], tool_choice={"type": "tool", "name": VERDICT_TOOL},
                max_tokens=self.max_tokens, **self._sampling(),
            )
        except UnreadableReply as exc:
            return None, str(exc), {"system": LLM_SYSTEM_PROMPT, "prompt": message.for_transcript}, message.notes
        content = [kept(block.model_dump(exclude_none=True)) for block in reply.content]
        transcript = {"system": LLM_SYSTEM_PROMPT, "prompt": message.for_transcript, "verdict": content,
                      "stop_reason": reply.stop_reason}
        try:
            return parse_verdict(last_verdict_input(reply.content)), None, transcript, message.notes
        except VerdictError as exc:
            return None, str(exc), transcript, message.notes


class JudgeAgentConfig(BaseModel):
    """The judge agent: a built-in coding agent with a read-only toolkit by default."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["claude-code"] = "claude-code"
    model: str = "claude-sonnet-4-6"
    permission_mode: Literal["default", "acceptEdits", "plan", "bypassPermissions"] = "bypassPermissions"
    allowed_tools: list[str] = ["Bash", "Read", "Glob", "Grep"]
    disallowed_tools: list[str] | None = None
    ignore_patterns: list[str] = Field(default=[".git", "node_modules", "__pycache__", ".venv"], validate_default=True)
    sdk_options: dict[str, Any] = {}

    @field_validator("ignore_patterns")
    @classmethod
    def _security_floor(cls, patterns: list[str]) -> list[str]:
        """The floor holds however the list is overridden."""
        return [*patterns, *(p for p in SECURITY_IGNORE_FLOOR if p not in patterns)]


@criterion("agent_judge")
class AgentJudge(JudgeCriterion):
    """A judge agent grades the task in an isolated copy of the sandbox, with read-only tools
    (read, list, grep) confined to the copy, and answers through ``submit_verdict``."""

    max_turns: int = Field(default=50, gt=0)
    turn_timeout: int = Field(default=300, ge=10)
    agent: JudgeAgentConfig = JudgeAgentConfig()

    @model_validator(mode="before")
    @classmethod
    def _legacy_agent_keys(cls, data: Any) -> Any:
        """Older task files set the judge agent's fields on the criterion; they move under ``agent``."""
        if not isinstance(data, dict) or not any(key in data for key in LEGACY_AGENT_KEYS):
            return data
        data = dict(data)
        agent = dict(data.get("agent") or {})
        for key in LEGACY_AGENT_KEYS:
            if key in data:
                if key in agent:
                    raise ValueError(f"'{key}' is set both on the criterion and under 'agent'")
                agent[key] = data.pop(key)
        data["agent"] = agent
        return data

    def judge_model(self, config: Any) -> str:
        return _chosen_model(self.agent.model, JudgeAgentConfig.model_fields["model"].default, config)

    async def grade(self, judge, client, ctx):
        with tempfile.TemporaryDirectory(prefix="agent-judge-") as scratch:
            copy = judge_agent.copy_for_judge(
                ctx.sandbox_dir, Path(scratch) / "workspace", self.agent.ignore_patterns,
                ctx.reference_dir if self.include_reference else None,
            )
            mounted = (copy / judge_agent.REFERENCE_MOUNT).is_dir()
            note = (f"REFERENCE SOLUTION: mounted read-only at {judge_agent.REFERENCE_MOUNT}/ in your working copy "
                    "(for your review only).") if mounted else None
            message = grading_message(self, ctx, reference=note)
            tools = judge_agent.ReadOnlyTools(copy, judge_agent.offered_tools(
                self.agent.allowed_tools, self.agent.disallowed_tools))
            try:
                outcome = await judge_agent.judge_loop(judge, client, tools, message.text, max_turns=self.max_turns,
                                                       turn_timeout=self.turn_timeout)
            except (TimeoutError, UnreadableReply) as exc:
                return None, str(exc), {"system": judge_agent.AGENT_SYSTEM_PROMPT, "prompt": message.for_transcript,
                                        "tool_calls": tools.calls}, message.notes
        conversation = [{"role": "user", "content": message.for_transcript},
                        *judge_agent.without_reference_reads(outcome.messages[1:-1])]
        transcript = {"system": judge_agent.AGENT_SYSTEM_PROMPT, "prompt": kept(conversation),
                      "verdict": kept(outcome.messages[-1]["content"]), "turns": outcome.turns,
                      "tool_calls": tools.calls}
        return outcome.verdict, outcome.error, transcript, message.notes


def _load_config(task_dir: Path) -> Any:
    """The config the CLI would find from the task's folder (a broken one is not the agent's fault)."""
    from ..config import ConfigError, load_config

    try:
        return load_config(task_dir)
    except ConfigError as exc:
        raise JudgeInfrastructureError(f"judge configuration: {exc}") from None


def _chosen_model(model: str | None, default: str, config: Any) -> str:
    return _api_model_name(model) if model and model != default else config.model.for_role("judge")


def _api_model_name(model: str) -> str:
    """``anthropic.claude-sonnet-4-6`` (a provider-routed name in upstream's corpus) is
    ``claude-sonnet-4-6`` on the Messages API."""
    return model.removeprefix("anthropic.")
