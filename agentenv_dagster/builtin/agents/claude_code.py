"""The claude-code agent: Claude Code itself, through the ``claude_agent_sdk`` package (which
bundles the CLI, or finds ``claude`` on PATH), working in the task's sandbox folder.

Its options come from the agent's config: ``permission_mode``, ``allowed_tools`` /
``disallowed_tools``, ``max_turns`` (run_limits, via agent-config), the system prompt
(``system_prompt_mode`` append = on the ``claude_code`` preset, replace = instead of it),
``setting_sources`` (default ``["project"]``, so a user's own settings stay out), ``settings``,
``plugins`` and ``sdk_options`` passed through as ``ClaudeAgentOptions`` fields. The env's MCP
servers are given to Claude Code to call itself, their tools granted. In an agent host Claude
Code never sees the real key: it calls the model through the host's proxy with the host's
proxy key (``model_access.py``), so its own Bash finds nothing else; started on its own, the
key is this process's ``ANTHROPIC_API_KEY`` and ``base_url`` becomes ``ANTHROPIC_BASE_URL``.
Its environment is the agent's (an allowlist) plus the sandbox's variables. Each assistant message,
tool use and tool result Claude Code streams becomes our telemetry; the tasks of one A2A
context resume one Claude Code session.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from contextlib import aclosing
from typing import Any

from agentenv_dagster.builtin.agents.anthropic_agent import _system_prompt
from agentenv_dagster.builtin.agents.coding_cli import ToolCallLog, cli_path_env, require_key, text_of
from agentenv_dagster.builtin.agents.model_access import MODELS
from agentenv_dagster.builtin.agents.server import AgentFailure, Reply, TaskSession

INSTALL_HINT = "pip install 'agentenv-dagster[agents]' (the claude-agent-sdk package, which bundles the CLI)"


class ClaudeCodeBrain:
    def __init__(self, config: dict) -> None:
        try:
            from claude_agent_sdk import ClaudeAgentOptions
        except ImportError:
            raise ValueError(f"the claude-code agent needs the claude_agent_sdk package: {INSTALL_HINT}") from None
        self.model = config.get("model")
        self.base_url = config.get("base_url")
        self.max_turns = config.get("max_turns")
        self.system_prompt = config.get("system_prompt") or ""
        self.system_prompt_mode = config.get("system_prompt_mode") or "append"
        self.workspace = config.get("workspace")
        self.options: dict[str, Any] = {
            "permission_mode": config.get("permission_mode") or "acceptEdits",
            "allowed_tools": list(config.get("allowed_tools") or []),
            "disallowed_tools": list(config.get("disallowed_tools") or []),
            "setting_sources": config.get("setting_sources") or ["project"],
            "settings": config.get("settings"),
            "plugins": [{"type": "local", "path": p["path"]} for p in config.get("plugins") or []],
            "cli_path": config.get("cli_path"),
        }
        sdk_options = dict(config.get("sdk_options") or {})
        known = {f.name for f in dataclasses.fields(ClaudeAgentOptions)}
        if unknown := sorted(set(sdk_options) - known):
            raise ValueError(f"sdk_options {unknown} are not ClaudeAgentOptions fields")
        self.sdk_options = sdk_options
        self.sessions: dict[str, str] = {}  # A2A context id -> Claude Code session id

    async def run(self, prompt: str, session: TaskSession) -> Reply:
        if MODELS.access("anthropic") is None:
            require_key(("ANTHROPIC_API_KEY",), "claude-code")
        from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKError, ResultMessage, query

        stderr: deque[str] = deque(maxlen=40)
        options = ClaudeAgentOptions(**self._options(session, stderr.append))
        transcript, result = _Transcript(session), None
        try:
            async with aclosing(query(prompt=prompt, options=options)) as messages:
                async for message in messages:
                    if isinstance(message, ResultMessage):
                        result = message
                    else:
                        transcript.handle(message)
        except ClaudeSDKError as exc:
            if result is None:  # an error result is classified from the result itself, below
                tail = "\n".join(stderr)
                raise AgentFailure("ClaudeCodeError", f"{exc}" + (f"\n{tail}" if tail else "")) from None
        finally:
            transcript.calls.close()
        if result is None:
            raise AgentFailure("ClaudeCodeError", "Claude Code ended without a result")
        return self._reply(session, result, transcript.pending_text)

    def _options(self, session: TaskSession, on_stderr) -> dict[str, Any]:
        """ClaudeAgentOptions for one task: agent-config (model, system prompt, max_turns) wins
        over the config file."""
        settings = session.config
        env = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **((self.workspace or {}).get("env") or {}),
               **cli_path_env(session.sandbox.root, self.workspace)}
        if MODELS.access("anthropic") is not None:
            env.update(ANTHROPIC_BASE_URL=MODELS.proxy_url("anthropic"), ANTHROPIC_API_KEY=MODELS.proxy_key)
        elif self.base_url:
            env["ANTHROPIC_BASE_URL"] = self.base_url
        system = _system_prompt(settings.get("system_prompt") or self.system_prompt, session.skills)
        if self.system_prompt_mode == "replace":
            system_prompt: Any = system
        else:
            system_prompt = {"type": "preset", "preset": "claude_code", **({"append": system} if system else {})}
        # the registered envs are what the task is about: their tools are granted (``mcp__<server>``
        # allows every tool of a server; disallowed_tools still win)
        allowed = [*self.options["allowed_tools"], *(f"mcp__{s['name']}" for s in session.mcp_servers)]
        options = {
            **self.options, **self.sdk_options, "allowed_tools": allowed,
            "cwd": str(session.sandbox.root), "env": env, "stderr": on_stderr, "system_prompt": system_prompt,
            "model": settings.get("model") or self.model or None,
            "max_turns": settings.get("max_turns") or self.max_turns,
            "mcp_servers": {s["name"]: {"type": "http", "url": s["url"], **({"headers": s["headers"]} if s.get("headers") else {})}
                            for s in session.mcp_servers},
            "resume": self.sessions.get(session.context_id or ""),
        }
        return {k: v for k, v in options.items() if v is not None}

    def _reply(self, session: TaskSession, result, pending_text: str) -> Reply:
        usage = result.usage or {}
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
            if usage.get(key) is not None:
                session.usage[key] = session.usage.get(key, 0) + int(usage[key])
        session.record({"type": "result", "subtype": result.subtype, "num_turns": result.num_turns,
                        "is_error": result.is_error, "stop_reason": result.stop_reason,
                        "total_cost_usd": result.total_cost_usd, "session_id": result.session_id})
        if session.context_id and result.session_id:
            self.sessions[session.context_id] = result.session_id
        if result.subtype == "error_max_turns":
            raise AgentFailure("MaxTurnsExceeded", f"no final reply within max_turns={result.num_turns}")
        if result.is_error:
            detail = result.result or "; ".join(result.errors or []) or result.subtype
            status = f" (API status {result.api_error_status})" if result.api_error_status else ""
            raise AgentFailure("ClaudeCodeError", f"Claude Code failed{status}: {detail}")
        return Reply(result.result if result.result is not None else pending_text)


class _Transcript:
    """Claude Code's assistant and user messages as telemetry: a turn per assistant message,
    its text (but the last, which is the reply), each tool use paired with its result."""

    def __init__(self, session: TaskSession) -> None:
        self.session = session
        self.calls = ToolCallLog(session)
        self.pending_text = ""
        self._messages: set[str | None] = set()

    def handle(self, message: Any) -> None:
        from claude_agent_sdk import AssistantMessage, TextBlock, ToolResultBlock, ToolUseBlock, UserMessage

        if isinstance(message, AssistantMessage):
            self.session.model = message.model or self.session.model
            if message.message_id not in self._messages:  # one API message may stream as several
                self._messages.add(message.message_id)
                self.session.turn_started()
            for block in message.content:
                if isinstance(block, TextBlock) and block.text:
                    self._flush_text()
                    self.pending_text = block.text
                elif isinstance(block, ToolUseBlock):
                    self._flush_text()
                    self.calls.started(block.id, block.name, dict(block.input))
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self.calls.finished(block.tool_use_id, is_error=bool(block.is_error), result=text_of(block.content))

    def _flush_text(self) -> None:
        if self.pending_text:
            self.session.record_message("assistant", self.pending_text)
            self.pending_text = ""
