"""The brains an embedded agent can have, each imported only when chosen (so the replay
agent starts without loading the Anthropic SDK, and claude-code or codex without their CLIs
being installed until one is deployed)."""

from __future__ import annotations

import importlib
from typing import Any

BRAINS = {
    "replay": ("agentenv_dagster.builtin.agents.replay", "ReplayBrain"),
    "anthropic": ("agentenv_dagster.builtin.agents.anthropic_agent", "AnthropicBrain"),
    "claude-code": ("agentenv_dagster.builtin.agents.claude_code", "ClaudeCodeBrain"),
    "codex": ("agentenv_dagster.builtin.agents.codex", "CodexBrain"),
}


def build_brain(kind: str, config: dict[str, Any]):
    """A brain of ``kind`` for ``config``; ValueError for a bad config or an unknown kind."""
    if kind not in BRAINS:
        raise ValueError(f"unknown agent kind {kind!r} (known: {sorted(BRAINS)})")
    module, cls = BRAINS[kind]
    return getattr(importlib.import_module(module), cls)(config)
