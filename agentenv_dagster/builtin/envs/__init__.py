"""The built-in envs by kind, served by ``python -m agentenv_dagster.builtin.envs <kind>``.

Kinds name their modules rather than import them, so listing the kinds (for error messages
and config checks) does not load the MCP SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import EnvApp

ENV_MODULES = {"email": "email", "item-store": "item_store"}


class UnknownEnvKind(KeyError):
    def __str__(self) -> str:
        return f"unknown env kind '{self.args[0]}' (known kinds: {', '.join(known_kinds())})"


def known_kinds() -> list[str]:
    return sorted(ENV_MODULES)


def build_env(kind: str) -> EnvApp:
    """A fresh env of ``kind``, with empty state."""
    if kind not in ENV_MODULES:
        raise UnknownEnvKind(kind)
    return importlib.import_module(f".{ENV_MODULES[kind]}", __name__).build()
