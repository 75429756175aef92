"""The codex agent: OpenAI's Codex CLI, ``codex exec --json`` as a subprocess in the task's
sandbox folder, its JSONL events turned into our telemetry.

Items map onto the names the criteria know: ``command_execution`` -> Bash, ``file_change``
-> Write, ``mcp_tool_call`` -> ``mcp__<server>__<tool>``, ``web_search`` -> WebSearch. The
permission mode picks Codex's sandbox (plan = read-only, default/acceptEdits =
workspace-write, bypassPermissions = no sandbox), never asking for approval. ``codex exec``
has no turn cap or tool allow-list of its own, so both are enforced from the event stream:
a tool call that ``allowed_tools``/``disallowed_tools`` forbid, or one past ``max_turns``
(one model step per tool call, plus the final reply), stops the CLI and fails the task. The
model is the config file's (``agent.model``), never the run's Anthropic default. In an agent
host handed an OpenAI key (the deployer's ``OPENAI_API_KEY``/``CODEX_API_KEY``, and
``CODEX_BASE_URL`` for a Responses-compatible endpoint) Codex never sees it: it calls the model
through the host's proxy with the host's proxy key (``model_access.py``). Without one it uses
its own ``codex login`` (``CODEX_HOME``), which its tools can read. The tasks of one A2A
context resume one Codex thread.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import deque
from pathlib import Path
from typing import Any

from agentenv_dagster.builtin.agents.anthropic_agent import _system_prompt
from agentenv_dagster.builtin.agents.coding_cli import ToolCallLog, cli_path_env, text_of
from agentenv_dagster.builtin.agents.model_access import MODELS
from agentenv_dagster.builtin.agents.server import AgentFailure, Reply, TaskSession

INSTALL_HINT = "npm install -g @openai/codex"
KEY_VARIABLES = ("OPENAI_API_KEY", "CODEX_API_KEY")
PROXY_KEY_VARIABLE = "AGENTENV_MODEL_PROXY_KEY"  # where Codex finds the host's proxy key
SANDBOX_MODES = {"plan": "read-only", "default": "workspace-write", "acceptEdits": "workspace-write"}
LINE_LIMIT = 16 * 1024 * 1024  # one JSONL event (a command's aggregated output) may be large


class CodexBrain:
    def __init__(self, config: dict) -> None:
        self.cli = config.get("cli_path") or "codex"
        self.model = config.get("model")
        self.max_turns = config.get("max_turns")
        self.system_prompt = config.get("system_prompt") or ""
        self.permission_mode = config.get("permission_mode") or "acceptEdits"
        self.allowed = {_bare(t) for t in config.get("allowed_tools") or []}
        self.disallowed = {_bare(t) for t in config.get("disallowed_tools") or []}
        self.workspace = config.get("workspace")
        self.threads: dict[str, str] = {}  # A2A context id -> Codex thread id

    async def run(self, prompt: str, session: TaskSession) -> Reply:
        codex_home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
        proxied = MODELS.access("openai") is not None
        if not proxied and not any(os.environ.get(name) for name in KEY_VARIABLES) and not (codex_home / "auth.json").is_file():
            raise AgentFailure("MissingAPIKey", f"{' or '.join(KEY_VARIABLES)} is not set in the agent's "
                                                f"environment and there is no codex login in {codex_home}")
        max_turns = session.config.get("max_turns") or self.max_turns
        proc = await asyncio.create_subprocess_exec(
            *self._argv(session), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=session.sandbox.root, limit=LINE_LIMIT, start_new_session=True,
            env={**os.environ, **((self.workspace or {}).get("env") or {}),
                 **({PROXY_KEY_VARIABLE: MODELS.proxy_key} if proxied else {}),
                 **cli_path_env(session.sandbox.root, self.workspace)},
        )
        stderr: deque[str] = deque(maxlen=40)
        drain = asyncio.create_task(_drain(proc.stderr, stderr))
        events = _Events(session, self, max_turns)
        try:
            proc.stdin.write(prompt.encode())
            await proc.stdin.drain()
            proc.stdin.close()
            async for line in proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # not an event (a stray log line)
                if isinstance(event, dict):
                    events.handle(event)
            await proc.wait()
        finally:
            events.calls.close()
            await _stop(proc)
            drain.cancel()
        return events.reply(proc.returncode, "\n".join(stderr))

    def _argv(self, session: TaskSession) -> list[str]:
        """``codex exec [resume <thread>] --json ...`` reading the prompt from stdin."""
        thread = self.threads.get(session.context_id or "")
        argv = [self.cli, "exec", *(["resume", thread] if thread else []), "--json", "--skip-git-repo-check"]
        if self.permission_mode == "bypassPermissions":
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        else:
            argv += _config("sandbox_mode", SANDBOX_MODES[self.permission_mode]) + _config("approval_policy", "never")
        if self.model:
            argv += ["--model", self.model]
        instructions = _system_prompt(session.config.get("system_prompt") or self.system_prompt, session.skills)
        if instructions:
            argv += _config("developer_instructions", instructions)
        for server in session.mcp_servers:
            argv += _config(f"mcp_servers.{server['name']}.url", server["url"])
            if server.get("headers"):
                argv += ["-c", f"mcp_servers.{server['name']}.http_headers={_inline_table(server['headers'])}"]
        if MODELS.access("openai") is not None:
            provider = {"name": "custom", "base_url": MODELS.proxy_url("openai"), "wire_api": "responses",
                        "env_key": PROXY_KEY_VARIABLE}
            argv += ["-c", f"model_providers.custom={_inline_table(provider)}", *_config("model_provider", "custom")]
        elif base_url := os.environ.get("CODEX_BASE_URL"):
            key = next((name for name in KEY_VARIABLES if os.environ.get(name)), KEY_VARIABLES[0])
            provider = {"name": "custom", "base_url": base_url, "wire_api": "responses", "env_key": key}
            argv += ["-c", f"model_providers.custom={_inline_table(provider)}", *_config("model_provider", "custom")]
        return [*argv, "-"]


class _Events:
    """One ``codex exec`` run's events: tool calls, the agent's messages, usage, the outcome."""

    def __init__(self, session: TaskSession, brain: CodexBrain, max_turns: int | None) -> None:
        self.session, self.brain, self.max_turns = session, brain, max_turns
        self.calls = ToolCallLog(session)
        self.started_calls = 0
        self.messages: list[str] = []
        self.completed = False
        self.failure: str | None = None
        self.errors: list[str] = []

    def handle(self, event: dict[str, Any]) -> None:
        kind, item = event.get("type"), event.get("item") or {}
        if kind == "thread.started" and self.session.context_id:
            self.brain.threads[self.session.context_id] = event["thread_id"]
        elif kind == "turn.started":
            self.session.turn_started()
        elif kind == "item.started" and (call := _tool_call(item)):
            self._check(call[0])
            self.started_calls += 1
            self.calls.started(item["id"], *call)
        elif kind == "item.completed":
            self._completed(item)
        elif kind == "turn.completed":
            self.completed = True
            usage = event.get("usage") or {}
            cached = int(usage.get("cached_input_tokens") or 0)
            self.session.usage["input_tokens"] += max(int(usage.get("input_tokens") or 0) - cached, 0)
            self.session.usage["output_tokens"] += int(usage.get("output_tokens") or 0)
            self.session.usage["cache_read_input_tokens"] = self.session.usage.get("cache_read_input_tokens", 0) + cached
        elif kind == "turn.failed":
            self.failure = (event.get("error") or {}).get("message") or "turn failed"
        elif kind == "error":
            self.errors.append(str(event.get("message", "")))  # often a retry notice, so not final

    def _completed(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "agent_message":
            if self.messages:
                self.session.record_message("assistant", self.messages[-1])
            self.messages.append(item.get("text") or "")
            return
        if kind == "error":
            self.session.record({"type": "warning", "message": item.get("message", "")})
            return
        call = _tool_call(item)
        if call is None:
            return  # reasoning, todo_list, plan: no tool call
        name, arguments = call
        if kind == "command_execution":
            code = item.get("exit_code")
            is_error, result = item.get("status") != "completed" or code not in (0, None), \
                f"{item.get('aggregated_output', '')}\n[exit code {code}]"
        elif kind == "mcp_tool_call":
            error = (item.get("error") or {}).get("message")
            is_error = item.get("status") == "failed" or bool(error)
            result = error or text_of((item.get("result") or {}).get("content"))
        else:
            is_error, result = item.get("status") == "failed", json.dumps(item.get("changes") or item.get("action") or "")
        self.calls.finished(item["id"], is_error=is_error, result=result, name=name, arguments=arguments)

    def _check(self, name: str) -> None:
        """A tool call codex cannot be told to skip: stop the run instead."""
        if name in self.brain.disallowed or (self.brain.allowed and name not in self.brain.allowed):
            raise AgentFailure("ToolNotAllowed", f"codex called {name}, which allowed_tools/disallowed_tools "
                                                 "forbid; codex exec cannot refuse a tool, so the run was stopped")
        if self.max_turns and self.started_calls + 1 >= self.max_turns:
            raise AgentFailure("MaxTurnsExceeded", f"no final reply within max_turns={self.max_turns}")

    def reply(self, returncode: int | None, stderr: str) -> Reply:
        if self.failure is not None:
            raise AgentFailure("CodexError", f"codex turn failed: {self.failure}")
        if not self.completed:
            detail = self.errors[-1] if self.errors else stderr or "no output"
            raise AgentFailure("CodexError", f"codex exec exited with code {returncode} before the turn completed: {detail}")
        return Reply(self.messages[-1] if self.messages else "")


def _tool_call(item: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """Our name and arguments for a codex item that is a tool call (None for the others)."""
    kind = item.get("type")
    if kind == "command_execution":
        return "Bash", {"command": item.get("command", "")}
    if kind == "file_change":
        return "Write", {"changes": item.get("changes") or []}
    if kind == "mcp_tool_call":
        return f"mcp__{item.get('server')}__{item.get('tool')}", item.get("arguments") or {}
    if kind == "web_search":
        return "WebSearch", {"query": item.get("query", "")}
    if kind == "collab_tool_call":
        return "Agent", {"tool": item.get("tool"), "prompt": item.get("prompt")}
    return None


def _bare(tool: str) -> str:
    """``Bash(git:*)`` -> ``Bash``: codex calls can only be told apart by tool."""
    return tool.split("(", 1)[0].strip()


def _config(key: str, value: str) -> list[str]:
    return ["-c", f"{key}={json.dumps(value)}"]  # a JSON string is a TOML basic string


def _inline_table(values: dict[str, str]) -> str:
    return "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items()) + "}"


async def _drain(stream: asyncio.StreamReader, lines: deque[str]) -> None:
    async for line in stream:
        lines.append(line.decode(errors="replace").rstrip())


async def _stop(proc: asyncio.subprocess.Process, grace_seconds: float = 5.0) -> None:
    """End the CLI and everything it started (its own process group): TERM, then KILL; what
    it left running after it exited is killed."""
    if proc.returncode is not None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), grace_seconds)
            return
        except TimeoutError:
            continue
