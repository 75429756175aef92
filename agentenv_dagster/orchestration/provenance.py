"""What a task asset's materialization was made from, in the tags Dagster reads staleness from: the ops log
each row's materializations themselves, so they stamp the node's code version and each upstream's data version
as Dagster would (unstamped, every upstream counts as new)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from ..context import TaskStepContext
from ..steps.base import ARTIFACT, PRODUCER, VERIFICATION
from ..steps.scoring import verification_passed
from .dagster_internals import (
    CODE_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG, DEFAULT_DATA_VERSION, NULL_EVENT_POINTER,
    get_input_data_version_tag, get_input_event_pointer_tag,
)
from .rows import node_assets, op_graph
from .translator import TAG_CODE_VERSION


def digest(value: Any) -> str:
    """A short, stable hash of a JSON-able value."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def verification_version(entry: dict[str, Any]) -> str:
    """A verification's data version: its grade."""
    return digest({"score": entry.get("score"), "passed": verification_passed(entry),
                    "graded": entry.get("graded", True)})


def collection_version(entry: dict[str, Any]) -> str:
    """A collection's data version: the files (and universe) it gathered."""
    return digest({"files": entry.get("artifacts") or {}, "universe": entry.get("file_artifact_universe")})


def results_version(ctx: TaskStepContext, failure: dict[str, Any] | None) -> str:
    """A row outcome's data version: where it stopped (if it did) and its scores."""
    scores = {name: entry.get("score") for name, entry in (ctx.metadata.get("verifications") or {}).items()}
    return digest({"stopped_at": (failure or {}).get("step_id"), "scores": scores})


def produced_entry(ctx: TaskStepContext, step_id: str) -> dict[str, Any] | None:
    """What a producer step recorded: collected files, or an env snapshot's universe."""
    collected = (ctx.metadata.get("collected_artifacts") or {}).get(step_id)
    snapshots = ctx.metadata.get("env_snapshotted_universes") or {}
    if collected is None and step_id in snapshots:
        return {"artifacts": {}, "file_artifact_universe": snapshots[step_id]}
    return collected


def loaded_version(ctx: TaskStepContext, artifact_id: str, step_id: str) -> int | None:
    """The version of a stored artifact the row loaded in step ``step_id``."""
    return next((entry.get("version") for key in ("loaded_environment_artifacts", "loaded_file_artifact_universes")
                 for entry in ctx.metadata.get(key) or []
                 if entry.get("id") == artifact_id and entry.get("step_id", step_id) == step_id), None)


def artifact_tags(version: int) -> dict[str, str]:
    """A new version of a stored artifact: its number as the artifact asset's data version."""
    return {DATA_VERSION_TAG: str(version), DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}


@dataclass(frozen=True)
class Provenance:
    """How one node stamps its task asset's materializations: code version, deps and their data versions."""

    code_version: str | None
    deps: tuple[dg.AssetKey, ...] = ()
    task_assets: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    current: dict[dg.AssetKey, str] = field(default_factory=dict)  # a stored artifact's current data version

    @classmethod
    def of_node(cls, context: dg.OpExecutionContext, key: dg.AssetKey | None) -> "Provenance":
        """The provenance of the node's task asset ``key`` (None: the node has none)."""
        version = context.op.tags.get(TAG_CODE_VERSION)
        if key is None or version is None or not context.has_assets_def:  # (a job of the op graph alone)
            return cls(None)
        task_assets: dict[tuple[str, ...], tuple[str, str]] = {}
        for node in op_graph(context).nodes:
            assets = node_assets(node.tags)
            task_assets.update({tuple(path): (kind, name) for kind, name, path in assets["produced"]})
            task_assets.update({tuple(path): (ARTIFACT, name) for name, path in assets["loaded"].items()})
        deps = tuple(sorted(context.assets_def.asset_deps.get(key, ()), key=str))
        current = {dep: _current_version(context.instance, dep) for dep in deps
                   if task_assets.get(tuple(dep.path), (ARTIFACT,))[0] == ARTIFACT}
        return cls(version, deps, task_assets, current)

    def tags(self, ctx: TaskStepContext, data_version: str) -> dict[str, str]:
        """The tags of one row's materialization whose value has ``data_version``."""
        if self.code_version is None:
            return {}
        # Dagster reads only a partitioned input's pointer (the row's own upstream): no event to point at
        return {CODE_VERSION_TAG: self.code_version, DATA_VERSION_TAG: data_version,
                **{get_input_data_version_tag(dep): self._dep_version(dep, ctx) for dep in self.deps},
                **{get_input_event_pointer_tag(dep): NULL_EVENT_POINTER for dep in self.deps}}

    def _dep_version(self, dep: dg.AssetKey, ctx: TaskStepContext) -> str:
        kind, name = self.task_assets.get(tuple(dep.path), (ARTIFACT, dep.path[-1]))
        if kind == VERIFICATION:
            entry = (ctx.metadata.get("verifications") or {}).get(name)
            return verification_version(entry) if entry is not None else DEFAULT_DATA_VERSION
        if kind == PRODUCER:
            entry = produced_entry(ctx, name)
            return collection_version(entry) if entry is not None else DEFAULT_DATA_VERSION
        written = [u["version"] for u in (ctx.metadata.get("env_snapshotted_universes") or {}).values()
                   if isinstance(u, dict) and u.get("id") == name and isinstance(u.get("version"), int)]
        return str(max(written)) if written else self.current.get(dep, DEFAULT_DATA_VERSION)  # the row's own snapshot


def _current_version(instance: dg.DagsterInstance, key: dg.AssetKey) -> str:
    """A stored artifact's data version as Dagster holds it now: its latest materialization's."""
    entry = instance.get_latest_materialization_event(key)
    materialization = entry.asset_materialization if entry is not None else None
    return ((materialization.tags or {}).get(DATA_VERSION_TAG) if materialization else None) or DEFAULT_DATA_VERSION
