"""load_artifact: load stored data into an env (its data plane) or an agent's sandbox."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from ..context import TaskStepContext
from ..ids import ArtifactId
from ..runtime.artifacts import ENVIRONMENT_TYPES, FILE_TYPES, Artifact
from ..runtime.base import StepRuntime
from ..runtime.dataplane import env_base_url, file_part_from_bytes
from ..runtime.sandbox import LocalSandbox
from .base import AGENT, ARTIFACT, ENV, PRODUCER, SANDBOX, TaskStep
from .execution import step_param
from .registry import step
from .sandbox import deployed_sandbox

AGENT_FILE_DESTINATION = "/tmp/file_artifacts"
AGENT_ENVIRONMENT_DESTINATION = "/app/files"
SANDBOX_FILE_DESTINATION = "/loaded"


class ArtifactRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: ArtifactId
    version: int | None = None


@step("load_artifact")
class LoadArtifactStep(TaskStep):
    reads = {
        "env_id": ENV, "agent_name": AGENT, "sandbox_name": SANDBOX,
        "artifact_from_step_id": PRODUCER, "collected_artifacts_step_id": PRODUCER,
        "artifact_ids": ARTIFACT,
    }

    # load into this env (through its data plane)
    env_id: str | None = None
    # which deployment of the env, when it was deployed more than once
    env_step_id: str | None = None
    # the artifacts to load, `[{id, version}]`
    artifacts: list[ArtifactRef] | None = None
    # one artifact to load (instead of `artifacts`)
    artifact_id: ArtifactId | None = None
    # its version; unset: the latest
    artifact_version: int | None = None
    # files to download into an agent or sandbox (a URL, or `{url, filename}`)
    urls: list[str | dict[str, str]] | None = None
    # load what a `collect_artifacts` or `snapshot_env` step produced
    artifact_from_step_id: str | None = None
    # legacy form of `artifact_from_step_id`
    collected_artifacts_step_id: str | None = None
    # where the files go in the agent, sandbox or container
    destination_path: str | None = None
    # load into this deployed agent
    agent_name: str | None = None
    # load into this deployed sandbox
    sandbox_name: str | None = None
    # load into this container of the sandbox
    container_name: str | None = None
    snapshot_after_load: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> "LoadArtifactStep":
        stored = self.artifacts is not None or self.artifact_id is not None or self.urls is not None
        if self.artifacts is not None and self.artifact_id is not None:
            raise ValueError("Pass either `artifacts=[...]` or `artifact_id=...`, not both")
        if self.collected_artifacts_step_id and stored:
            raise ValueError(
                "`collected_artifacts_step_id` is mutually exclusive with `artifacts`/`artifact_id`/`urls`"
            )
        if self.artifact_from_step_id and (stored or self.collected_artifacts_step_id):
            raise ValueError(
                "`artifact_from_step_id` is mutually exclusive with "
                "`artifacts`/`artifact_id`/`urls`/`collected_artifacts_step_id`"
            )
        if not (stored or self.artifact_from_step_id or self.collected_artifacts_step_id):
            raise ValueError(
                "Must pass at least one of `artifacts=[...]`, `artifact_id=...`, `urls=[...]`, "
                "`artifact_from_step_id=...`, or `collected_artifacts_step_id=...`"
            )
        if self.agent_name and self.container_name:
            raise ValueError("Pass either `agent_name` or `container_name`, not both")
        if not (self.env_id or self.agent_name or self.sandbox_name):
            raise ValueError(
                "Must pass at least one of `env_id`, `agent_name`, `sandbox_name`, or "
                "`container_name`+`sandbox_name`"
            )
        if self.container_name and not self.sandbox_name:
            raise ValueError("`container_name` requires `sandbox_name`")
        if self.urls is not None and not (self.agent_name or self.sandbox_name):
            raise ValueError("`urls` requires `agent_name`, `sandbox_name`, or `container_name`+`sandbox_name`")
        return self

    @property
    def artifact_ids(self) -> list[str]:
        """Stored artifacts this step loads (the upstream assets of what follows it)."""
        if self.artifact_id:
            return [self.artifact_id]
        return [ref.id for ref in self.artifacts or []]

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        refs = self._refs(ctx)
        if refs is None:
            rt.log.info("load_artifact '%s': the producing step recorded no artifact; nothing to load", self.id)
            return
        if self.urls:
            raise RuntimeError("loading `urls` is not supported by the local runtime yet")
        for ref in refs:
            artifact = rt.artifacts.get(ref.id, ref.version)
            if self.env_id:
                await self._into_env(ctx, rt, artifact)
            elif self.agent_name:
                self._into_agent(ctx, rt, artifact)
            else:
                self._stage(ctx, artifact, deployed_sandbox(ctx, rt, self.sandbox_name), SANDBOX_FILE_DESTINATION)

    def _refs(self, ctx: TaskStepContext) -> list[ArtifactRef] | None:
        producer = self.artifact_from_step_id or self.collected_artifacts_step_id
        if producer:
            collected = (ctx.metadata.get("collected_artifacts") or {}).get(producer)
            snapshots = ctx.metadata.get("env_snapshotted_universes") or {}
            if collected is None and producer not in snapshots:
                raise RuntimeError(
                    f"No artifact recorded by step '{producer}'. Ensure a step that produces one "
                    "(e.g. `collect_artifacts`, `snapshot_env`) ran with that id before this load step."
                )
            universe = collected.get("file_artifact_universe") if collected else snapshots.get(producer)
            return [ArtifactRef(**universe)] if universe else None
        overrides = step_param(ctx, self.id, "artifacts")
        if overrides:
            return [ArtifactRef(**ref) for ref in overrides]
        if self.artifact_id:
            version = step_param(ctx, self.id, "artifact_version") or self.artifact_version
            return [ArtifactRef(id=step_param(ctx, self.id, "artifact_id") or self.artifact_id, version=version)]
        return list(self.artifacts or [])

    async def _into_env(self, ctx: TaskStepContext, rt: StepRuntime, artifact: Artifact) -> None:
        env = ctx.find_env(self.env_id)
        if env is None:
            raise RuntimeError(f"Env '{self.env_id}' not found in context.deployed_envs")
        if artifact.type not in ENVIRONMENT_TYPES:
            raise RuntimeError(
                f"Artifact '{artifact.id}' is a {artifact.type} artifact; only environment artifacts "
                "load into an env's data plane here"
            )
        env_name = env.mcp_server_name or env.env_id
        if artifact.environment_name and artifact.environment_name != env_name:
            raise RuntimeError(
                f"Artifact '{artifact.id}' is for environment '{artifact.environment_name}', "
                f"not '{env_name}'"
            )
        files = artifact.files
        parts = [file_part_from_bytes(name, path.read_bytes()) for name, path in files.items()]
        base_url = env_base_url(env.mcp_url)
        await rt.dataplane.reset(base_url)
        await rt.dataplane.add(base_url, parts)
        ctx.metadata_list("loaded_environment_artifacts").append({
            **artifact.ref(), "artifact_type": artifact.type, "env_id": self.env_id,
            "step_id": self.id, "file_count": len(files), "files": sorted(files)[:200],
        })

    def _into_agent(self, ctx: TaskStepContext, rt: StepRuntime, artifact: Artifact) -> None:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
        self._stage(ctx, artifact, rt.provider.sandbox_of(agent), AGENT_FILE_DESTINATION)

    def _stage(self, ctx: TaskStepContext, artifact: Artifact, sandbox: LocalSandbox, file_default: str) -> None:
        """Copy the artifact's files into an agent's or a bare sandbox's filesystem."""
        if artifact.type in FILE_TYPES:
            default = file_default
        elif artifact.type in ENVIRONMENT_TYPES:
            default = AGENT_ENVIRONMENT_DESTINATION
        else:
            raise RuntimeError(f"Unsupported artifact type for loading: '{artifact.type}'")
        destination = step_param(ctx, self.id, "destination_path") or self.destination_path or default
        files = artifact.files
        for relpath, source in files.items():
            target = sandbox.resolve(str(PurePosixPath(destination) / relpath))
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
        entry: dict[str, Any] = {
            **artifact.ref(), "artifact_type": artifact.type, "env_id": None,
            "agent_name": self.agent_name, "destination_path": destination, "files": sorted(files),
        }
        if not self.agent_name:
            entry["sandbox_name"] = self.sandbox_name
        ctx.metadata_list("loaded_file_artifact_universes").append(entry)
