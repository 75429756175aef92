"""StepRuntime: what a step may use while it runs, built once per step execution; the same object (which knows
nothing of Dagster) serves the plain asyncio walker and the ops."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, AsyncIterator

import httpx

from ..config import AgentEnvConfig
from ..redaction import redact_text
from .a2a_client import A2AClient
from .artifacts import FilesystemArtifactStore, ObjectStore
from .dataplane import DataPlaneClient
from .judge import LLMJudge, llm_judge
from .local import LocalProvider

if TYPE_CHECKING:
    from .s3 import S3ArtifactStore, S3ObjectStore

    ArtifactStore = FilesystemArtifactStore | S3ArtifactStore


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    task_id: str
    run_dir: Path


class StepRuntime:
    def __init__(
        self, config: AgentEnvConfig, run: RunInfo, logger: logging.Logger | None = None,
        *, artifacts: ArtifactStore | None = None, objects: ObjectStore | S3ObjectStore | None = None,
    ):
        self.config = config
        self.run = run
        self.log = RedactingLogger(logger or logging.getLogger("agentenv_dagster"))
        self.provider = LocalProvider(config, run.run_dir)
        self.artifacts = artifacts or artifact_store(config)
        self.objects = objects or object_store(config)

    async def __aenter__(self) -> "StepRuntime":
        self._connect(http_client())
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.provider.aclose()
        await self._disconnect()

    def _connect(self, http: httpx.AsyncClient) -> None:
        http.auth = self.provider.server_auth  # the run's token, to the run's own servers only
        self.http = http
        self.a2a = A2AClient(http)
        self.dataplane = DataPlaneClient(http)

    async def _disconnect(self) -> None:
        await self.a2a.aclose()
        await self.http.aclose()

    @contextlib.asynccontextmanager
    async def lanes(self, count: int) -> AsyncIterator[asyncio.Queue["StepRuntime"]]:
        """``count`` views of this runtime for rows run at once, each with its own small connection pool
        (httpx scans every pooled connection for every queued request: one shared pool costs CPU per row)."""
        views: asyncio.Queue[StepRuntime] = asyncio.Queue()
        for _ in range(count):
            view = copy.copy(self)
            view._connect(http_client(max_connections=4))  # one row at a time uses a lane
            views.put_nowait(view)
        try:
            yield views
        finally:
            while not views.empty():
                await views.get_nowait()._disconnect()

    def judge(self, model: str | None = None, base_url: str | None = None, api_key: str | None = None) -> LLMJudge:
        return llm_judge(self.config, model, base_url, api_key)


class RedactingLogger(logging.LoggerAdapter):
    """A step's logger: every known secret in a message replaced by ``***`` (``redaction.py``) before it is recorded."""

    def log(self, level: int, msg: object, *args: object, **kwargs) -> None:
        if self.isEnabledFor(level):
            text = str(msg) % args if args else str(msg)
            self.logger.log(level, redact_text(text), **kwargs)


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default verification, built once per process (loading the CA bundle is not free)."""
    return httpx.create_ssl_context()


def http_client(max_connections: int = 100) -> httpx.AsyncClient:
    """A step runtime's client: plain httpx, for every agent, env, data plane and object URL."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    return httpx.AsyncClient(timeout=httpx.Timeout(180.0, connect=10.0), verify=_tls(), limits=limits)


def artifact_store(config: AgentEnvConfig) -> "ArtifactStore":
    """The project's artifact store: the state folder, or its bucket (``[stores] backend``)."""
    bundles = [config.path(d) for d in config.stores.artifact_dirs]
    if config.stores.backend == "s3":
        from .s3 import S3ArtifactStore, s3_location

        return S3ArtifactStore(s3_location(config), config.state_dir / "cache" / "s3", bundles)
    return FilesystemArtifactStore(config.state_dir / "artifacts", bundles)


def object_store(config: AgentEnvConfig) -> "ObjectStore | S3ObjectStore":
    """Where trajectories and transcripts go: beside the artifacts."""
    if config.stores.backend == "s3":
        from .s3 import S3ObjectStore, s3_location

        return S3ObjectStore(s3_location(config))
    return ObjectStore(config.state_dir / "objects")
