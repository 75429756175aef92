"""snapshot_env: save a deployed env's live state as a new environment_universe version.

The state is read through the env's data plane (``data/get``) and stored as files an env can
load back (``load_artifact`` with ``artifact_from_step_id`` naming this step, or with the
``snapshot_id`` as its artifact id): a DataPart becomes a JSON file, a FilePart its bytes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import uuid
from datetime import datetime, timezone
from pathlib import PurePosixPath
from typing import Any

from ..context import DeployedEnv, TaskStepContext
from ..ids import ArtifactId
from ..runtime.base import StepRuntime
from ..runtime.dataplane import env_base_url
from .base import ARTIFACT, ENV, PRODUCER, SELF, TaskStep
from .registry import step

UNIVERSE_TYPE = "environment_universe"


@step("snapshot_env")
class SnapshotEnvStep(TaskStep):
    """Picks the env by env_instance_id, else env_id (narrowed by env_step_id), else the only
    one deployed; ``gateway_url`` overrides where its state is read from."""

    # A named universe is a stored artifact this step writes (its lineage: what it was loaded
    # from -> the snapshot); an unnamed one is derived per run, so only this step names it.
    reads = {"env_id": ENV, "original_universe_artifact_id": ARTIFACT}
    writes = {SELF: PRODUCER, "snapshot_id": ARTIFACT}

    env_id: str | None = None
    env_instance_id: str | None = None
    env_step_id: str | None = None
    gateway_url: str | None = None
    snapshot_id: ArtifactId | None = None
    original_universe_artifact_id: ArtifactId | None = None
    export_timeout_seconds: float = 600
    include_env_trajectory: bool = False

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        deployed = self._deployed_env(ctx)
        env_id = self.env_id or deployed.env_id
        base_url = self.gateway_url or (env_base_url(deployed.mcp_url) if deployed.mcp_url else None)
        if not base_url:
            raise RuntimeError(f"Deployed env '{env_id}' has no URL to read its state from")
        if self.include_env_trajectory:
            ctx.metadata_map("env_trajectory")[env_id] = {
                "captured_at_utc": datetime.now(timezone.utc).isoformat(), "capture_step_id": self.id,
                "error": "the local runtime's envs serve no trajectory",
            }
        carried = {}
        if self.original_universe_artifact_id:  # named by the author: a bad id fails the step
            carried = rt.artifacts.get(self.original_universe_artifact_id).metadata
        name = (deployed.mcp_server_name if deployed else None) or env_id
        parts = await asyncio.wait_for(rt.dataplane.get(base_url), self.export_timeout_seconds)
        stored = rt.artifacts.put(
            self._snapshot_id(ctx), UNIVERSE_TYPE, _files_of(name, parts),
            **{**carried, "environment_name": name, "env_id": env_id, "snapshot_step_id": self.id},
        )
        ctx.metadata_map("env_snapshotted_universes")[self.id] = stored.ref()

    def _deployed_env(self, ctx: TaskStepContext) -> DeployedEnv | None:
        """The target deployment; None only in override mode (env_id + gateway_url, not deployed)."""
        have = f"(have: {[e.env_id for e in ctx.deployed_envs]})"
        if self.env_instance_id:
            found = next((e for e in ctx.deployed_envs if e.instance_id == self.env_instance_id), None)
            if found is None:
                raise RuntimeError(
                    f"No deployed env with instance_id '{self.env_instance_id}' in context "
                    f"(have: {[e.instance_id for e in ctx.deployed_envs]})"
                )
            return found
        candidates = [e for e in ctx.deployed_envs if self.env_id in (None, e.env_id)]
        if self.env_step_id is not None:
            named = [e for e in candidates if _deployer(e) == self.env_step_id]
            if candidates and not named:
                raise RuntimeError(
                    f"snapshot_env '{self.id}': env_step_id '{self.env_step_id}' names no deployment "
                    f"(deployed by: {[_deployer(e) for e in candidates]})"
                )
            candidates = named
        if len(candidates) == 1:
            return candidates[0]
        if not self.env_id:
            raise RuntimeError(
                "snapshot_env needs env_id, env_instance_id or env_step_id when the context has "
                f"{len(candidates)} deployed envs {have}"
            )
        if candidates:
            raise RuntimeError(
                f"snapshot_env '{self.id}': {len(candidates)} deployments of env '{self.env_id}' "
                f"(deployed by: {[_deployer(e) for e in candidates]}). Set env_step_id to the "
                "deploy_env step this snapshot should target."
            )
        if self.gateway_url:
            return None
        raise RuntimeError(
            f"No deployed env with env_id '{self.env_id}' in context {have} and no gateway_url "
            "override was provided"
        )

    def _snapshot_id(self, ctx: TaskStepContext) -> str:
        """Stable within a run instance, so a retried step adds a version, not a universe."""
        if self.snapshot_id:
            return self.snapshot_id
        return f"{ctx.instance_id or 'adhoc-' + uuid.uuid4().hex[:12]}-snapshot-{self.id}"


def _deployer(env: DeployedEnv) -> str | None:
    return env.metadata.get("deploy_step_id")


def _files_of(name: str, parts: list[dict[str, Any]]) -> dict[str, bytes]:
    """The universe's files; a Part the local store cannot hold fails the export."""
    files: dict[str, bytes] = {}
    for index, part in enumerate(parts or [{"kind": "data", "data": {}}]):
        default = f"{name}.json" if index == 0 else f"{name}-{index}.json"
        kind = part.get("kind") if isinstance(part, dict) else None
        if kind == "data":
            files[default] = json.dumps(part.get("data"), indent=1, default=str).encode()
            continue
        raw = (part.get("file") or {}).get("bytes") if kind == "file" else None
        if not isinstance(raw, str):
            raise RuntimeError(f"export of '{name}' failed: part {index} is neither data nor inline file bytes")
        try:
            files[PurePosixPath(part["file"].get("name") or default).name] = base64.b64decode(raw, validate=True)
        except binascii.Error as exc:
            raise RuntimeError(f"export of '{name}' failed: part {index} bytes are not base64 ({exc})") from None
    return files
