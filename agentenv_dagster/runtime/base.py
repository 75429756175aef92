"""StepRuntime: what a step may use while it runs, built once per step execution.

It knows nothing of Dagster: the same object serves the plain asyncio walker and the ops.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..config import AgentEnvConfig
from .a2a_client import A2AClient
from .artifacts import FilesystemArtifactStore, ObjectStore
from .dataplane import DataPlaneClient
from .judge import LLMJudge, llm_judge
from .local import LocalProvider


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    task_id: str
    run_dir: Path


class StepRuntime:
    def __init__(
        self, config: AgentEnvConfig, run: RunInfo, logger: logging.Logger | None = None,
        *, artifacts: FilesystemArtifactStore | None = None,
    ):
        self.config = config
        self.run = run
        self.log = logger or logging.getLogger("agentenv_dagster")
        self.provider = LocalProvider(config, run.run_dir)
        self.artifacts = artifacts or artifact_store(config)
        self.objects = ObjectStore(config.state_dir / "objects")
        self.http: httpx.AsyncClient | None = None

    async def __aenter__(self) -> "StepRuntime":
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(180.0, connect=10.0))
        self.a2a = A2AClient(self.http)
        self.dataplane = DataPlaneClient(self.http)
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.http.aclose()

    def judge(self, model: str | None = None) -> LLMJudge:
        return llm_judge(self.config, model)


def artifact_store(config: AgentEnvConfig) -> FilesystemArtifactStore:
    return FilesystemArtifactStore(
        config.state_dir / "artifacts", [config.path(d) for d in config.stores.artifact_dirs]
    )
