"""The Dagster face of the runtime: resources that hold settings and build plain runtimes.

Their defaults come from ``.agentenv/config.toml`` and the launchpad can override each; every op
builds a :class:`StepRuntime` from them, so step code never sees Dagster.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, ValidationError

from ..compiler import step_registry
from ..config import AgentEnvConfig, load_config
from ..context import TaskStepContext
from ..runtime.artifacts import FilesystemArtifactStore, ObjectStore
from ..runtime.base import RunInfo, StepRuntime, artifact_store
from ..runtime.local import Ledger
from ..runtime.s3 import S3ArtifactStore, S3Location, S3ObjectStore, s3_location
from ..spec.loader import validation_problems
from ..steps.base import TaskStep

RESOURCE_KEY, ARTIFACTS_KEY, JUDGE_KEY = "agentenv", "agentenv_artifacts", "agentenv_judge"


class ArtifactStoreResource(dg.ConfigurableResource):
    """The versioned artifact store and the object store: a folder (``root``), or an S3 bucket
    (``backend: s3``; ``root`` is then the local download cache), plus read-only bundle folders."""

    root: str
    bundle_dirs: list[str] = []
    backend: str = Field(default="filesystem", description="filesystem or s3")
    objects_root: str | None = None  # filesystem: where objects go (default: beside root)
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None

    def get_stores(self) -> tuple[FilesystemArtifactStore | S3ArtifactStore, ObjectStore | S3ObjectStore]:
        bundles = [Path(d) for d in self.bundle_dirs]
        if self.backend == "s3":
            location = S3Location(self.bucket, self.prefix, self.endpoint_url, self.region)
            return S3ArtifactStore(location, Path(self.root), bundles), S3ObjectStore(location)
        return (FilesystemArtifactStore(Path(self.root), bundles),
                ObjectStore(Path(self.objects_root or Path(self.root).parent / "objects")))


class JudgeResource(dg.ConfigurableResource):
    """The LLM judge (the Anthropic Messages API or a compatible ``base_url``). Its key is read from
    the variable ``api_key_env`` names (unset: as ``.agentenv/config.toml`` says): no secret in run config."""

    model: str
    base_url: str | None = None
    api_key_env: str | None = None


class AgentEnvResource(dg.ConfigurableResource):
    """``project_dir`` holds ``.agentenv/config.toml``; ``initial_context_path`` seeds a re-run with a saved context."""

    project_dir: str
    initial_context_path: str | None = None
    rows_in_flight: int = Field(default=32, ge=1, description="rows whose step runs at once, in each op")
    max_sandboxes: int | None = Field(
        default=None, ge=1, description="rows that hold their deployed sandboxes, containers, envs and agents at "
        "once (a row releases them as it leaves the run); default: twice rows_in_flight, so that as many rows "
        "can be graded as have their agents working")

    def load_config(self, judge: JudgeResource | None = None) -> AgentEnvConfig:
        config = load_config(Path(self.project_dir))
        if judge is None:
            return config
        model = config.model.model_copy(update={
            "roles": {**config.model.roles, "judge": judge.model},
            "base_url": judge.base_url,
            **({"api_key": f"env:{judge.api_key_env}"} if judge.api_key_env else {}),
        })
        return config.model_copy(update={"model": model})

    def run_dir(self, run_id: str) -> Path:
        return self.load_config().state_dir / "runs" / run_id

    def parse_step(self, step_type: str, fields: dict, node: str, config_path: str) -> TaskStep:
        """The step of node ``node`` from its fields at ``config_path`` in the run config (the launchpad can edit
        them); a failure naming the node and the fields when they are not a step."""
        if (cls := step_registry(self.load_config()).get(step_type)) is None:
            raise dg.Failure(f"Unknown task step type: {step_type}")
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            problems = [f"field '{f}': {m}" if f else m for f, m in validation_problems(exc, cls)]
            shown = "; ".join(problems[:5]) + (" ..." if len(problems) > 5 else "")  # the first five
            raise dg.Failure(description=(
                f"step '{node}': its fields in the run config ({config_path}) are not "
                f"a {step_type} step: {shown}. A step given there replaces the task's step whole: give all of its "
                f"fields, or leave it out to run the task's own")) from None

    def initial_context(self, run_id: str, task_id: str, row: str = "", seed: dict | None = None) -> TaskStepContext:
        """A root op's context: the saved one of ``task run --context``, or a fresh one; a dataset row's carries its
        values as the seed every step is filled from."""
        try:
            data = json.loads(Path(self.initial_context_path).read_text()) if self.initial_context_path else {}
        except (FileNotFoundError, ProcessLookupError):  # it may hold secrets: it ends with ``--context``'s process
            raise dg.Failure("the initial context (agentenv-dagster run --context) ended with the run that "
                             "passed it; launch again without initial_context_path, or from the CLI") from None
        ctx = TaskStepContext.from_dict(data)
        ctx.instance_id = ctx.instance_id or "-".join(filter(None, (task_id, run_id[:8], row.replace("|", "-"))))
        ctx.metadata.setdefault("run_group_id", run_id)
        ctx.metadata.setdefault("task_id", task_id)
        if seed:
            ctx.metadata["seed"] = {**(ctx.metadata.get("seed") or {}), **seed}
        return ctx

    def live_rows_bound(self, task_bound: int | None) -> int:
        """How many rows may hold their deployments at once: ``max_sandboxes``, else the task's own, else
        twice ``rows_in_flight``, so that grading rows never idle an agent lane."""
        return self.max_sandboxes or task_bound or 2 * self.rows_in_flight

    def step_runtime(self, context: dg.OpExecutionContext, task_id: str) -> StepRuntime:
        """What an op's rows run their step with (``async with``), with the op's judge and artifact stores."""
        run = RunInfo(run_id=context.run_id, task_id=task_id, run_dir=self.run_dir(context.run_id))
        store, objects = getattr(context.resources, ARTIFACTS_KEY).get_stores()
        judge: JudgeResource = getattr(context.resources, JUDGE_KEY)
        return StepRuntime(self.load_config(judge), run, context.log, artifacts=store, objects=objects)

    def end_row(self, run_id: str, ctx: TaskStepContext) -> list[str]:
        """End what one row deployed (as the row leaves the run); the instances that were running."""
        ledger = Ledger.of_run(self.run_dir(run_id))
        return [record.instance_id for record in (*ctx.deployed_agents, *ctx.deployed_envs, *ctx.deployed_sandboxes)
                if record.instance_id and ledger.terminate(record.instance_id)]

    def teardown(self, run_id: str) -> list[str]:
        """End everything the run deployed; later deployments of the run are refused."""
        return Ledger.of_run(self.run_dir(run_id)).close()


def agentenv_resources(config: AgentEnvConfig, **settings: Any) -> dict[str, dg.ConfigurableResource]:
    """The resources, with the project's settings and ``settings`` (fields of :class:`AgentEnvResource`) as their
    launchpad-visible defaults: given at construction, as Dagster runs a resource from the config it was built with."""
    store = artifact_store(config)
    store_settings = {"backend": "s3", **dataclasses.asdict(s3_location(config))} if config.stores.backend == "s3" \
        else {"objects_root": str(config.state_dir / "objects")}
    return {
        RESOURCE_KEY: AgentEnvResource(project_dir=str(config.root), **settings),
        ARTIFACTS_KEY: ArtifactStoreResource(root=str(store.root), bundle_dirs=[str(d) for d in store.bundle_dirs],
                                             **store_settings),
        JUDGE_KEY: JudgeResource(model=config.model.for_role("judge"), base_url=config.model.base_url),
    }

