"""The versioned task store: every ``put`` adds a version, none is ever overwritten."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock

from ..errors import SpecError, TaskLoadError
from ..ids import check_id, path_under
from .documents import load_json
from .loader import TaskDocument, parse_task_document

if TYPE_CHECKING:
    from ..steps.registry import StepRegistry


class TaskStore:
    def __init__(self, root: Path):
        self.root = root

    def _folder(self, task_id: str) -> Path:
        """The task's folder; an id that could name anything else is refused."""
        return path_under(self.root, check_id(task_id, "task id"))

    def versions(self, task_id: str) -> list[int]:
        folder = self._folder(task_id)
        if not folder.is_dir():
            return []
        return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())

    def latest_paths(self) -> list[Path]:
        """The newest version's file of every stored task, by task id."""
        if not self.root.is_dir():
            return []
        found = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            versions = self.versions(folder.name)
            if versions:
                found.append(folder / f"{max(versions)}.json")
        return found

    def put(self, task_id: str, document: TaskDocument) -> int:
        """Store the document's steps as the next version of ``task_id``."""
        folder = self._folder(task_id)
        folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder / ".lock")):
            version = max(self.versions(task_id), default=0) + 1
            stored = {"id": task_id, "type": "task", "version": version, "steps": document.step_documents(),
                      **({"seed": document.seed} if document.seed else {})}
            path = folder / f"{version}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(stored, indent=2))
            os.replace(tmp, path)
        return version

    def get(self, task_id: str, version: int | None, registry: "StepRegistry") -> TaskDocument:
        versions = self.versions(task_id)
        if not versions:
            raise LookupError(f"Task '{task_id}' not found")
        chosen = max(versions) if version is None else version
        if chosen not in versions:
            raise LookupError(f"Task '{task_id}' has no version {version} (versions: {versions})")
        path = self._folder(task_id) / f"{chosen}.json"
        try:
            data = load_json(path)
        except SpecError as exc:
            raise TaskLoadError([exc]) from None
        return parse_task_document(data, source=str(path), default_id=task_id, registry=registry)
