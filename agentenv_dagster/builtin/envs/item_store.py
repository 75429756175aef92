"""The ``item-store`` env of the quickstart task: add named items, list them.

Data arrives through ``data/add`` as ``{"items": ["name", ...]}``; ``data/get`` returns
``{"items": [...]}``.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.exceptions import ToolError

from .base import EnvApp


class ItemStoreState:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.items: list[str] = []

    def add(self, documents: list[dict[str, Any]]) -> None:
        loaded = []
        for index, document in enumerate(documents):
            items = document.get("items")
            if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
                raise ValueError(f"document {index}: 'items' must be a list of non-empty names")
            loaded.extend(items)
        self.items.extend(loaded)

    def get(self) -> dict[str, Any]:
        return {"items": self.items}


def build() -> EnvApp:
    state = ItemStoreState()
    env = EnvApp("item-store", state)

    @env.tool
    def add_item(name: str) -> dict[str, Any]:
        """Store an item under `name`."""
        if not name.strip():
            raise ToolError("an item needs a non-empty name")
        state.items.append(name)
        return {"status": "added", "name": name}

    @env.tool
    def list_items() -> dict[str, Any]:
        """List the names of all stored items, oldest first."""
        return {"items": state.items}

    return env
