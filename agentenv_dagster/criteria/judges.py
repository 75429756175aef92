"""Judge criteria (``llm_judge``, ``agent_judge``): their task-file models, so tasks using them
load and validate. Grading by a judge is not wired here: an enabled judge is recorded as not
graded (no score, a reason), never given an invented verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .base import Criterion, CriterionContext, CriterionResult
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

    prompt: str
    enabled: bool = True
    files: list[str] = []
    include_reference: bool = True
    include_agent_output: bool = False
    include_tool_calls: bool = False
    include_dialog: bool = False
    max_dialog_chars: int = Field(default=80_000, gt=0)
    max_file_chars: int = Field(default=20_000, gt=0)
    capture_transcript: bool = True
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
        return self.result(None, details=f"not graded: the {self.type} checker is not available in this build",
                           evaluation_status="not_evaluated", result_kind="judge")


@criterion("llm_judge")
class LlmJudge(JudgeCriterion):
    """One LLM call grades the task against ``prompt`` through a forced ``submit_verdict`` tool."""

    model: str = DEFAULT_JUDGE_MODEL
    temperature: float = Field(default=0.0, ge=0, le=2)
    max_tokens: int = Field(default=2000, gt=0)


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
    """A coding agent grades the task in a copy of the sandbox, with tools."""

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
