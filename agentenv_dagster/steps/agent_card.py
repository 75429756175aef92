"""Reading agent-env extensions off an A2A agent card (which operations, which fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime.a2a_client import AGENT_CONFIG_URI as AGENT_CONFIG
from ..runtime.a2a_client import MCP_CONFIG_URI as MCP_CONFIG
from ..runtime.a2a_client import SKILL_CONFIG_URI as SKILL_CONFIG
from ..runtime.a2a_client import TRAJECTORY_URI as TRAJECTORY

__all__ = ["AGENT_CONFIG", "MCP_CONFIG", "SKILL_CONFIG", "TRAJECTORY", "ExtensionRequest", "extension_request"]


@dataclass(frozen=True)
class ExtensionRequest:
    required: tuple[str, ...]
    optional: tuple[str, ...]
    supported: tuple[str, ...]
    in_message: bool = False  # the operation may ride on a prompt (message.metadata[uri])


def extension_request(card: dict[str, Any], uri: str, operation: str) -> ExtensionRequest | None:
    """The request shape of one extension operation, or None when the card lacks it."""
    for ext in (card.get("capabilities") or {}).get("extensions") or []:
        if ext.get("uri") != uri:
            continue
        params = ext.get("params") or ext.get("config") or {}
        method = (params.get("methods") or {}).get(operation) or {}
        request = method.get("request") or {}
        return ExtensionRequest(
            required=tuple(request.get("required") or ()),
            optional=tuple(request.get("optional") or ()),
            supported=tuple(request.get("supported") or ()),
            in_message=method.get("in_message") is True,
        )
    return None
