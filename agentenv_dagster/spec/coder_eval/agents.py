"""The ``agent:`` block: one config model per agent kind, chosen by ``type``.

Coder Eval's own kinds (claude-code, codex, antigravity, opencode, pi, delegate, none) share
the coding-agent fields; ``replay`` and ``anthropic`` are ours, so a task can run offline or
on a model of any provider (``anthropic`` is the tool-use agent, whatever its model). ``type`` may be omitted: an experiment layer or ``--type`` supplies it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AliasChoices, BeforeValidator, Field, SerializeAsAny, field_validator, model_validator

from ...errors import SpecError
from .base import FieldErrors, Strict, validate_kind
from .ignore import normalize_ignore_pattern

PermissionMode = Literal["default", "acceptEdits", "plan", "bypassPermissions"]

# Run caps that used to sit under agent: and now live in run_limits (kinds that own such a
# field, like anthropic's max_turns, keep it).
MOVED_TO_RUN_LIMITS = ("max_turns", "turn_timeout")

# ClaudeAgentOptions fields the framework sets itself, so sdk_options may not pass them.
FRAMEWORK_OWNED_SDK_OPTIONS = frozenset({
    "model", "permission_mode", "allowed_tools", "disallowed_tools", "plugins", "system_prompt",
    "system_prompt_file", "settings", "cwd", "env", "stderr", "debug_stderr", "resume",
    "max_turns", "session_id", "session_store", "session_store_flush", "continue_conversation",
    "fork_session", "max_budget_usd", "task_budget", "hooks", "mcp_servers", "cli_path",
    "extra_args", "agents", "can_use_tool", "permission_prompt_tool_name", "tools", "sandbox",
    "skills", "add_dirs", "setting_sources", "include_partial_messages",
})


class AgentConfig(Strict):
    """What every kind has: its ``type`` (None until some layer sets it)."""

    # The agent honours the stop_early watcher's cooperative stop (a run can arm stop_early).
    supports_cooperative_stop: ClassVar[bool] = False

    # the agent kind; may be left to an experiment layer
    type: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _run_caps_moved(cls, data: Any) -> Any:
        """agent.max_turns / agent.turn_timeout were removed: say where they went."""
        if isinstance(data, dict):
            moved = [key for key in MOVED_TO_RUN_LIMITS if key in data and key not in cls.model_fields]
            if moved:
                raise FieldErrors([
                    SpecError(f"unknown field (run caps live in run_limits: set run_limits.{key})", field=key)
                    for key in moved
                ])
        return data


class LocalPlugin(Strict):
    type: Literal["local"]
    path: str


class CodingAgentConfig(AgentConfig):
    """The fields every Coder Eval coding agent understands (and an untyped agent block)."""

    merge_exclusive_groups: ClassVar[tuple[tuple[str, ...], ...]] = (("system_prompt", "system_prompt_file"),)

    # the model the agent runs on; unset: the CLI's or `[model]`'s default
    model: str | None = None
    # how the agent's tool calls are permitted
    permission_mode: PermissionMode = "acceptEdits"
    # the only tools the agent may use
    allowed_tools: list[str] | None = None
    # tools the agent may not use
    disallowed_tools: list[str] | None = None
    # local plugins loaded into the agent
    plugins: list[LocalPlugin] | None = None
    # the agent's system prompt (exclusive with `system_prompt_file`)
    system_prompt: str | None = None
    # a file holding the system prompt, relative to the task YAML
    system_prompt_file: str | None = None
    # patterns left out of the workspace copy an agent judge reads (`!name` keeps a default-ignored
    # one)
    ignore_patterns: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("ignore_patterns", "additional_ignore_patterns")
    )

    @field_validator("ignore_patterns")
    @classmethod
    def _normalize_ignore_patterns(cls, values: list[str]) -> list[str]:
        return [normalize_ignore_pattern(value) for value in values]

    @field_validator("system_prompt")
    @classmethod
    def _blank_prompt_is_no_prompt(cls, value: str | None) -> str | None:
        """A whitespace-only prompt would read as "configured" while carrying nothing."""
        return value if value is None or value.strip() else None

    @model_validator(mode="after")
    def _one_system_prompt_source(self) -> "CodingAgentConfig":
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise SpecError(
                "Only one of 'system_prompt' or 'system_prompt_file' can be provided, not both",
                field="system_prompt",
            )
        return self


class NoneAgentConfig(CodingAgentConfig):
    """No agent and no model call: the sandbox is set up, pre_run runs, criteria are checked."""

    type: Literal["none"]


class ClaudeCodeAgentConfig(CodingAgentConfig):
    supports_cooperative_stop = True

    type: Literal["claude-code"]
    # `append` to Claude Code's own system prompt, or `replace` it
    system_prompt_mode: Literal["append", "replace"] = "append"
    # Claude Code settings: a file path or the settings inline
    claude_settings: str | dict[str, Any] | None = None
    # more ClaudeAgentOptions fields (the ones the framework sets are refused)
    sdk_options: dict[str, Any] = Field(default_factory=dict)
    # which Claude Code settings files are read (default: `project`)
    setting_sources: list[Literal["user", "project", "local"]] | None = None

    @field_validator("sdk_options")
    @classmethod
    def _sdk_options_not_framework_owned(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in FRAMEWORK_OWNED_SDK_OPTIONS:
                raise SpecError(
                    f"sdk_options key {key!r} is framework-managed; set it as a top-level AgentConfig field instead",
                    field=key,
                )
        return value

    @model_validator(mode="after")
    def _replace_mode_has_prompt(self) -> "ClaudeCodeAgentConfig":
        if self.system_prompt_mode == "replace" and self.system_prompt is None and self.system_prompt_file is None:
            raise SpecError(
                "system_prompt_mode='replace' requires system_prompt (or system_prompt_file) to be set — "
                "there is no prompt to replace the Claude Code default with",
                field="system_prompt_mode",
            )
        return self


class CodexAgentConfig(CodingAgentConfig):
    supports_cooperative_stop = True

    type: Literal["codex"]


class AntigravityAgentConfig(CodingAgentConfig):
    type: Literal["antigravity"]
    thinking_level: Literal["minimal", "low", "medium", "high"] = "medium"


class OpenCodeAgentConfig(CodingAgentConfig):
    type: Literal["opencode"]
    variant: str | None = None
    pure: bool = True
    require_token_telemetry: bool = True


class PiAgentConfig(CodingAgentConfig):
    type: Literal["pi"]
    thinking_level: Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"] = "medium"


class DelegateAgentConfig(CodingAgentConfig):
    type: Literal["delegate"]
    effort: str | None = None
    project_id: str | None = None
    session_id: str | None = None
    enable_computer_use: bool = False


REPLAY_ACTION_KINDS = ("tool", "write_file", "sleep")


class ReplayAction(Strict):
    """One scripted step: an MCP tool call, a file write, or a pause."""

    # a tool to call (`Write`, `Bash`, `Read`, `Skill`, or an env's MCP tool)
    tool: str | None = None
    # the tool call's arguments
    arguments: dict[str, Any] | None = None
    # a sandbox file to write directly (with `content`)
    write_file: str | None = None
    # what `write_file` writes
    content: str | None = None
    # seconds to wait
    sleep: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> "ReplayAction":
        kinds = [kind for kind in REPLAY_ACTION_KINDS if getattr(self, kind) is not None]
        if len(kinds) != 1:
            raise ValueError(f"each action needs exactly one of {REPLAY_ACTION_KINDS}, got {kinds or 'none'}")
        if self.arguments is not None and self.tool is None:
            raise SpecError("only a 'tool' action takes arguments", field="arguments")
        if self.content is not None and self.write_file is None:
            raise SpecError("only a 'write_file' action takes content", field="content")
        return self


class ReplayEpisode(Strict):
    """Played when ``match`` (a regex) is found in the prompt — our replay agent's shape."""

    # a regular expression on the prompt: the first episode that matches is played
    match: str
    reply: str | dict[str, Any]  # an object is sent as JSON (a simulator's {message, done})
    # the tool calls and writes, in order
    actions: list[ReplayAction] = Field(default_factory=list)

    @field_validator("match")
    @classmethod
    def _is_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"'match' must be a regular expression ({exc})") from None
        return value


class ReplayAgentConfig(AgentConfig):
    """Our offline agent: a scripted trajectory, from a file beside the task or inline."""

    supports_cooperative_stop = True

    type: Literal["replay"]
    # a JSON file of episodes, relative to the task YAML
    script: str | None = None
    # the episodes inline
    episodes: list[ReplayEpisode] | None = None
    # how long each answer waits (to simulate a slow agent)
    delay_seconds: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> "ReplayAgentConfig":
        if (self.script is None) == (self.episodes is None):
            raise SpecError("a replay agent needs exactly one of 'script' or 'episodes'", field="script")
        return self


class AnthropicAgentConfig(AgentConfig):
    """Our tool-use agent; ``model`` is ``provider/model`` or a bare Anthropic name."""

    supports_cooperative_stop = True

    type: Literal["anthropic"]
    # the model (`provider/model`); unset: `[model]`'s for the `agent` role
    model: str | None = None
    # model calls per prompt at most
    max_turns: int = Field(default=20, gt=0)
    # the agent's system prompt
    system_prompt: str | None = None


AGENT_KINDS: dict[str, type[AgentConfig]] = {
    "none": NoneAgentConfig,
    "claude-code": ClaudeCodeAgentConfig,
    "codex": CodexAgentConfig,
    "antigravity": AntigravityAgentConfig,
    "opencode": OpenCodeAgentConfig,
    "pi": PiAgentConfig,
    "delegate": DelegateAgentConfig,
    "replay": ReplayAgentConfig,
    "anthropic": AnthropicAgentConfig,
}


def unregistered_kind(kind: Any) -> str:
    return f"No agent registered for type {str(kind)!r}. Registered kinds: {sorted(AGENT_KINDS)}"


def parse_agent_config(value: Any) -> AgentConfig | None:
    """The config model ``value['type']`` names; an untyped block is a :class:`CodingAgentConfig`."""
    if value is None:
        return None
    return validate_kind(value, AGENT_KINDS, unknown=unregistered_kind, untyped=CodingAgentConfig)


ALL_AGENT_MODELS: tuple[type[AgentConfig], ...] = (*AGENT_KINDS.values(), CodingAgentConfig)


def agent_models(kind: Any) -> tuple[type[AgentConfig], ...]:
    """The models a partial agent block of ``kind`` may use keys of (all kinds when unknown)."""
    return (AGENT_KINDS[kind],) if isinstance(kind, str) and kind in AGENT_KINDS else ALL_AGENT_MODELS


# The annotation of an ``agent:`` field: dispatched on type, dumped with its kind's fields.
AgentField = Annotated[SerializeAsAny[AgentConfig] | None, BeforeValidator(parse_agent_config)]
