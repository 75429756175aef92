"""collect_artifacts: copy an agent's files into the object store as one file universe."""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from pydantic import field_validator

from ..context import TaskStepContext
from ..ids import check_id
from ..runtime.base import StepRuntime
from .base import AGENT, DEFAULT_AGENT_NAME, PRODUCER, SELF, TaskStep
from .execution import step_param
from .registry import step


@step("collect_artifacts")
class CollectArtifactsStep(TaskStep):
    reads = {"agent_name": AGENT}
    writes = {SELF: PRODUCER}

    # the agent whose files are collected
    agent_name: str = DEFAULT_AGENT_NAME
    # the folder collected in the agent
    base_path: str = "/app/artifact"
    # the seed key (`metadata.seed[<key>]`) that lists the paths to collect, when set
    artifacts_key: str = "expected_artifacts"
    # paths to collect (relative to `base_path`); unset: everything
    artifact_paths: list[str] = []
    # collect from this env instead
    env_id: str | None = None
    # accepted for agent-env compatibility; not used here
    manifest_step_id: str | None = None
    # file names left out
    exclude_basenames: list[str] = []
    # collect from this sandbox instead
    sandbox_name: str | None = None
    # collect from this container of the sandbox
    container_name: str | None = None
    # a suffix of the stored artifact universe's id
    universe_id_suffix: str | None = None

    @field_validator("universe_id_suffix")
    @classmethod
    def _suffix_names_files(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._-]{0,100}", value):
            raise ValueError(f"universe_id_suffix {value[:80]!r} may hold only letters, digits, '.', '_' and '-'")
        return value

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
        sandbox = rt.provider.sandbox_of(agent)
        requested = self._requested_paths(ctx)
        paths = requested if requested is not None else self._listing(sandbox)
        files: dict[str, bytes] = {}
        warnings: list[str] = []
        for path in paths:
            if "://" in path:
                continue
            container_path = path if path.startswith("/") else str(PurePosixPath(self.base_path) / path)
            if PurePosixPath(container_path).name in self.exclude_basenames:
                continue
            try:
                files[self._key(container_path)] = sandbox.resolve(container_path).read_bytes()
            except (OSError, ValueError) as exc:
                warnings.append(f"{container_path}: {getattr(exc, 'strerror', None) or exc}")
        for warning in warnings:
            rt.log.warning("collect_artifacts '%s': cannot read %s", self.id, warning)

        universe = None
        artifacts: dict[str, str] = {}
        if files:
            stored = rt.artifacts.put(self._universe_id(ctx), "file_artifact_universe", files)
            universe = stored.ref()
            artifacts = {name: stored.object_url(name) for name in files}
        entry = {"artifacts": artifacts, "file_artifact_universe": universe}
        if warnings:
            entry["warnings"] = warnings
        ctx.metadata_map("collected_artifacts")[self.id] = entry
        ctx.metadata_map("artifacts").update(artifacts)
        ctx.metadata["file_artifact_universe"] = universe
        ctx.metadata_map("collect_produced_files")[self.id] = sorted(files)
        if requested and universe is None:
            raise RuntimeError(
                f"collect: resolved {len(requested)} artifact path(s) but produced no "
                f"file_artifact_universe (see per-file warnings for the cause): {warnings}"
            )

    def _requested_paths(self, ctx: TaskStepContext) -> list[str] | None:
        """step_params override > seed[artifacts_key] > artifact_paths; None = list base_path."""
        override = step_param(ctx, self.id, "artifact_paths")
        if override:
            return list(override)
        seeded = (ctx.metadata.get("seed") or {}).get(self.artifacts_key)
        if isinstance(seeded, str) and seeded.strip():
            return [p.strip() for p in seeded.split(",") if p.strip()]
        return list(self.artifact_paths) or None

    def _listing(self, sandbox) -> list[str]:
        root = sandbox.resolve(self.base_path)
        if not root.is_dir():
            return []
        return [p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]

    def _key(self, container_path: str) -> str:
        path = PurePosixPath(container_path)
        try:
            return path.relative_to(self.base_path).as_posix()
        except ValueError:
            return path.as_posix().lstrip("/")

    def _universe_id(self, ctx: TaskStepContext) -> str:
        """The stored universe's id: ``metadata.universe_id`` (a run's ``-D``), refused unless
        it can name a folder of the store, else the task instance's id made into one; plus
        the suffix."""
        given = ctx.metadata.get("universe_id")
        if given:
            check_id(given, f"collect_artifacts '{self.id}': metadata.universe_id")
        base = given or re.sub(r"[^A-Za-z0-9._-]", "_", ctx.instance_id or "unknown").lstrip(".-") or "unknown"
        return f"{base}{self.universe_id_suffix or ''}"

