"""TaskTranslator: every naming and mapping decision from a task plan to Dagster specs.

Like dagster-dbt's translator, users subclass it and override a small ``get_*`` method
instead of forking the compiler.
"""

from __future__ import annotations

import json

import dagster as dg

from ..naming import job_name, node_name
from ..plan import TaskPlan
from ..steps.base import AGENT, ARTIFACT, PRODUCER, SELF, VERIFICATION, TaskStep

TAG_TASK_ID = "agentenv/task_id"
TAG_TASK_VERSION = "agentenv/task_version"
TAG_CONTENT_HASH = "agentenv/content_hash"
TAG_FORMAT = "agentenv/format"
TAG_STEP_ASSETS = "agentenv/assets"


class TaskTranslator:
    def get_job_name(self, plan: TaskPlan) -> str:
        return job_name(plan.task_id)

    def get_node_name(self, step: TaskStep) -> str:
        return node_name(step.id)

    def get_job_tags(self, plan: TaskPlan) -> dict[str, str]:
        return {
            TAG_TASK_ID: plan.task_id,
            TAG_TASK_VERSION: str(plan.document.version or "unversioned"),
            TAG_CONTENT_HASH: plan.document.content_hash,
            TAG_FORMAT: plan.document.format,
        }

    def get_job_description(self, plan: TaskPlan) -> str:
        return f"{plan.document.format} task `{plan.task_id}` from `{plan.document.source}` ({len(plan.steps)} steps)"

    def get_op_tags(self, step: TaskStep) -> dict[str, str]:
        return {"agentenv/step_type": step.type}

    def get_pool(self, plan: TaskPlan, step: TaskStep) -> str | None:
        """The Dagster pool of a step that talks to an agent: one per agent id (and model),
        so a rate limit set on it (``dagster instance concurrency set``) holds across runs."""
        agents = [n.name for n in step.names_read() if n.kind == AGENT]
        if step.type != "prompt_agent" or not agents:
            return None
        deploys = [plan.step_by_id[a] for a in plan.ancestors(step.id)
                   if (AGENT, agents[0]) in plan.written_by(plan.step_by_id[a])]
        if not deploys:
            return None
        deploy = deploys[0]
        model = (getattr(deploy, "agent_config", None) or {}).get("model") or getattr(step, "model", None)
        parts = ["agentenv_agent", getattr(deploy, "a2a_agent_id", None) or "default", *([model] if model else [])]
        return node_name("_".join(parts))

    def get_retry_policy(self, step: TaskStep) -> dg.RetryPolicy | None:
        """``retry_config`` naming the step itself retries the op in place."""
        config = step.retry_config
        if config and config.retry_from_step_id == step.id and config.max_retries > 0:
            return dg.RetryPolicy(max_retries=config.max_retries)
        return None

    def get_partitions_def(self, plan: TaskPlan) -> dg.PartitionsDefinition | None:
        """A dataset task's rows as static partitions (a row id is a partition key)."""
        rows = plan.document.partitions
        return dg.StaticPartitionsDefinition(list(rows)) if rows else None

    def get_group_name(self, plan: TaskPlan) -> str:
        return job_name(plan.task_id)

    # -- assets ----------------------------------------------------------------------------
    def get_verification_asset_key(self, task_id: str, verifier_id: str) -> dg.AssetKey:
        return dg.AssetKey(["verifications", task_id, verifier_id])

    def get_collection_asset_key(self, task_id: str, step_id: str) -> dg.AssetKey:
        return dg.AssetKey(["artifacts", task_id, step_id])

    def get_suite_asset_key(self, task_id: str) -> dg.AssetKey:
        return dg.AssetKey(["suites", task_id])

    def get_loaded_artifact_asset_key(self, artifact_id: str) -> dg.AssetKey:
        return dg.AssetKey(["artifacts", artifact_id])

    def produced_asset_keys(self, task_id: str, step: TaskStep) -> list[tuple[str, str, dg.AssetKey]]:
        """(kind, name, key) of the assets a step materializes, from its declared writes."""
        keys = []
        for name in step.names_written():
            if name.kind == VERIFICATION:
                keys.append((VERIFICATION, name.name, self.get_verification_asset_key(task_id, name.name)))
            elif name.kind == PRODUCER and name.field == SELF:
                keys.append((PRODUCER, step.id, self.get_collection_asset_key(task_id, step.id)))
        return keys

    def get_step_assets_tag(self, plan: TaskPlan, step: TaskStep) -> str:
        """The asset keys a step's op reports, carried as a node tag so a run uses the
        translator that built the job (ops are shared; the node knows its step)."""
        return json.dumps({
            "produced": [[kind, name, key.path] for kind, name, key in self.produced_asset_keys(plan.task_id, step)],
            "loaded": {
                n.name: self.get_loaded_artifact_asset_key(n.name).path
                for n in step.names_read() if n.kind == ARTIFACT
            },
        })

    def get_asset_specs(self, plan: TaskPlan) -> list[dg.AssetSpec]:
        specs = []
        for step in plan.steps:
            deps = [self.get_loaded_artifact_asset_key(a) for a in plan.artifact_lineage(step.id)]
            # a step that reads verifications (aggregate_verifiers) is downstream of them
            deps += [self.get_verification_asset_key(plan.task_id, n.name) for n in step.names_read()
                     if n.kind == VERIFICATION]
            for kind, _, key in self.produced_asset_keys(plan.task_id, step):
                what = "verification" if kind == VERIFICATION else "artifacts produced"
                specs.append(dg.AssetSpec(
                    key=key, deps=deps, group_name=self.get_group_name(plan),
                    partitions_def=self.get_partitions_def(plan),
                    description=f"The {what} of step `{step.id}` ({step.type}) of task `{plan.task_id}`.",
                    kinds={"agentenv"}, tags={TAG_TASK_ID.replace("/", "_"): job_name(plan.task_id)},
                    metadata={"step_id": step.id, "task_source": plan.document.source},
                ))
        return specs

    def get_loaded_artifact_specs(self, plans: list[TaskPlan]) -> list[dg.AssetSpec]:
        artifact_ids = sorted({a for p in plans for s in p.steps for a in p.artifact_lineage(s.id)})
        return [
            dg.AssetSpec(key=self.get_loaded_artifact_asset_key(a), group_name="artifacts",
                         description=f"Stored artifact `{a}` (versioned in the artifact store).")
            for a in artifact_ids
        ]

    def get_check_specs(self, plan: TaskPlan) -> list[dg.AssetCheckSpec]:
        """The checks each verifier declares (``passed``; Coder Eval adds one per gating
        criterion) on its verification asset."""
        return [
            dg.AssetCheckSpec(name=name, asset=key, description=description)
            for step in plan.steps
            for kind, _, key in self.produced_asset_keys(plan.task_id, step)
            if kind == VERIFICATION
            for name, description in step.verification_checks()
        ]
