"""What commands the agent or the task runs see of our environment: an allowlist, the
variables the task passes through by name, and the sandbox's own; never our keys."""

from __future__ import annotations

import asyncio

from agentenv_dagster.runtime.shell import HostShell
from agentenv_dagster.spec.coder_eval.sandbox import DEFAULT_ENV_PASSTHROUGH, DockerDriverConfig

SECRET = "sk-ant-api03-SHELL-5d1e0b"


def test_a_sandbox_shell_sees_the_allowlist_the_passthrough_and_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("API_BACKEND", "bedrock")
    shell = HostShell(tmp_path, ("API_BACKEND", "NOT_SET_ANYWHERE"), {"TASK_VAR": "mine"})
    seen = asyncio.run(shell.run("env", 10)).stdout
    assert SECRET not in seen
    assert "API_BACKEND=bedrock" in seen and "TASK_VAR=mine" in seen and "PATH=" in seen
    assert "NOT_SET_ANYWHERE" not in seen


def test_the_default_passthrough_drops_credentials_a_task_must_name_itself():
    names = DockerDriverConfig().passthrough_names()
    assert "HOME" in names and "ANTHROPIC_MODEL" in names and "LITELLM_BASE_URL" in names
    dropped = sorted(set(DEFAULT_ENV_PASSTHROUGH) - set(names))
    assert dropped == ["ANTHROPIC_API_KEY", "AWS_BEARER_TOKEN_BEDROCK", "CODEX_API_KEY", "GEMINI_API_KEY",
                       "LITELLM_AUTH_TOKEN", "UIPATH_ACCESS_TOKEN"]
    asked = DockerDriverConfig(env_passthrough_extra=["ANTHROPIC_API_KEY"]).passthrough_names()
    assert "ANTHROPIC_API_KEY" in asked
    own = DockerDriverConfig(env_passthrough=["HOME", "UIPATH_ACCESS_TOKEN"]).passthrough_names()
    assert own == ["HOME", "UIPATH_ACCESS_TOKEN"]  # the task's own list, as written
