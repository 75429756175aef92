"""Workspace tools: what a coding agent does in its sandbox (Bash, Write, Read, Skill).

Named as Claude Code names them, so Coder Eval criteria (`command_executed`,
`skill_triggered`, `commands_efficiency`) read the same telemetry from the offline replay
agent, the Anthropic agent, and a real coding agent.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from agentenv_dagster.builtin.agents.server import Tool, ToolOutcome
from agentenv_dagster.runtime.sandbox import LocalSandbox, SandboxPathError
from agentenv_dagster.runtime.shell import SandboxShell, sandbox_shell

BASH_TIMEOUT_SECONDS = 120
OUTPUT_LIMIT = 20_000

WORKSPACE_TOOLS = [
    Tool("Bash", "Run a shell command in the workspace; returns its output and exit code.",
         {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}),
    Tool("Write", "Write a file in the workspace (paths are relative to it).",
         {"type": "object", "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
          "required": ["file_path", "content"]}),
    Tool("Read", "Read a file of the workspace.",
         {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}),
    Tool("Skill", "Use one of the registered skills by name.",
         {"type": "object", "properties": {"skill": {"type": "string"}}, "required": ["skill"]}),
]
NAMES = frozenset(t.name for t in WORKSPACE_TOOLS)


async def call_workspace_tool(
    sandbox: LocalSandbox, skills: list[dict], name: str, arguments: dict, workspace: dict,
) -> ToolOutcome:
    try:
        if name == "Bash":
            container = workspace.get("container")
            shell = sandbox_shell(sandbox.root, container, env=workspace.get("env"))
            base = Path(container["working_dir"]) if container else sandbox.root
            prepend = [str(base / folder) for folder in workspace.get("path_prepend") or []]
            return await _bash(shell, str(arguments["command"]), prepend)
        if name == "Write":
            path = sandbox.resolve(str(arguments["file_path"]))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(arguments.get("content", "")))
            return ToolOutcome(f"wrote {arguments['file_path']}", False)
        if name == "Read":
            return ToolOutcome(sandbox.resolve(str(arguments["file_path"])).read_text()[:OUTPUT_LIMIT], False)
        skill = next((s for s in skills if s["name"] == arguments.get("skill")), None)
        if skill is None:
            return ToolOutcome(f"Unknown skill {arguments.get('skill')!r}", True)
        return ToolOutcome(skill["skill_md"], False)
    except (KeyError, OSError, SandboxPathError) as exc:
        return ToolOutcome(f"{name} failed: {exc}", True)


async def _bash(shell: SandboxShell, command: str, path_prepend: list[str]) -> ToolOutcome:
    if path_prepend:  # CLI mocks and mock_path_dirs shadow the real tools
        command = f'export PATH={shlex.quote(":".join(path_prepend))}:"$PATH"; {command}'
    result = await shell.run(command, BASH_TIMEOUT_SECONDS)
    if result.timed_out:
        return ToolOutcome(f"command timed out after {BASH_TIMEOUT_SECONDS}s", True)
    text = (result.stdout + result.stderr)[-OUTPUT_LIMIT:]
    return ToolOutcome(f"{text}\n[exit code {result.exit_code}]", result.exit_code != 0)
