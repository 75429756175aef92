"""TaskTranslator: every naming and mapping decision from a task plan to Dagster specs.

Like dagster-dbt's translator, users subclass it and override a small ``get_*`` method instead of forking the compiler.
"""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

import dagster as dg

from ..config import AgentEnvConfig
from ..errors import clip
from ..naming import job_name, node_name
from ..plan import TaskPlan
from ..steps.base import AGENT, ARTIFACT, PRODUCER, SELF, VERIFICATION, TaskStep
from .rows import CONTENT_HASH_TAG, TASK_ID_TAG

TAG_TASK_ID = TASK_ID_TAG
TAG_TASK_VERSION = "agentenv/task_version"
TAG_CONTENT_HASH = CONTENT_HASH_TAG
TAG_FORMAT = "agentenv/format"
TAG_STEP_TYPE = "agentenv/step_type"
TAG_STEP_ID = "agentenv/step_id"  # node tag: the step a node runs (its id in the task document)
TAG_SEED = "agentenv/seed"  # the task's default token values (JSON); edit it in the launchpad to retarget a run
TAG_CODE_VERSION = "agentenv/code_version"  # node tag: the code version its assets' materializations carry

log = logging.getLogger("agentenv_dagster")


class TaskTranslator:
    """How task plans become Dagster definitions: names, tags, pools, retries, partitions, asset
    keys, checks and code versions. Subclass it, override the ``get_*`` methods you need (e.g.
    ``return "eval_" + super().get_job_name(plan)``) and pass an instance to ``build_repository``
    or ``build_definitions`` (see [Customizing](customizing.md#the-translator)). A result must stay
    a valid Dagster name or spec: a task whose definitions Dagster refuses becomes a ``<file>__invalid`` job."""

    def get_job_name(self, plan: TaskPlan) -> str:
        """The task id made a Dagster name (``reply-to-dana`` → ``reply_to_dana``); two tasks with one
        job name are a compile error. Asset keys come from the task id, so renaming jobs keeps their history."""
        return job_name(plan.task_id)

    def get_graph_name(self, plan: TaskPlan) -> str:
        """The op graph holding the task's steps, the one node of its job: ``reply_to_dana_steps``, so
        op step keys read ``reply_to_dana_steps.<step id>``."""
        return f"{self.get_job_name(plan)}_steps"

    def get_node_name(self, step: TaskStep) -> str:
        """A step's node: its id made a Dagster name (``ask-user`` → ``ask_user``), unique within a task."""
        return node_name(step.id)

    def get_job_tags(self, plan: TaskPlan) -> dict[str, str]:
        """Tags of every run of the task: id, version, content hash, format and (a stored task's) seed.
        Keep these keys when overriding (``{**super().get_job_tags(plan), "team": "support"}``): sensors,
        retries and re-execution read them."""
        return {
            TAG_TASK_ID: plan.task_id,
            TAG_TASK_VERSION: str(plan.document.version or "unversioned"),
            TAG_CONTENT_HASH: plan.document.content_hash,
            TAG_FORMAT: plan.document.format,
            **({TAG_SEED: json.dumps(plan.document.seed, sort_keys=True)} if plan.document.seed else {}),
        }

    def get_job_description(self, plan: TaskPlan) -> str:
        """The job's description in the UI: the task's own (Coder Eval), its first prompt and its origin,
        e.g. ``agent-env task `reply_to_dana` from `tasks/reply_to_dana.json` (7 steps)``."""
        origin = f"{plan.document.format} task `{plan.task_id}` from `{plan.document.source}` ({len(plan.steps)} steps)"
        prompt = next((" ".join(p.split()) for s in plan.steps if isinstance(p := getattr(s, "prompt", None), str)
                       and p.strip()), "")
        lines = [plan.document.description or "", f'Prompt: "{clip(prompt, 160)}"' if prompt else "", origin]
        return "\n\n".join(line for line in lines if line)

    def get_op_description(self, plan: TaskPlan, step: TaskStep) -> str:
        """A step's op in the UI: its id, type and what it reads and writes, e.g.
        ``Step `reply` (prompt_agent): reads agent `assistant`; writes prompt `reply`.``"""
        parts = [f"{verb} {', '.join(listed)}"
                 for verb, names in (("reads", step.names_read()), ("writes", step.names_written()))
                 if (listed := sorted({f"{n.kind} `{step.id if n.field == SELF else n.name}`" for n in names}))]
        rows = " for each row of the run" if plan.document.partitions else ""
        return f"Step `{step.id}` ({step.type}){rows}" + (": " + "; ".join(parts) if parts else "") + "."

    def get_op_tags(self, step: TaskStep) -> dict[str, str]:
        """Tags of a step's node (``agentenv/step_type``); executors read them, so per-step settings such
        as Kubernetes resources go here:

        ```python
        def get_op_tags(self, step):
            tags = super().get_op_tags(step)
            if step.type == "prompt_agent":
                tags["dagster-k8s/config"] = '{"container_config": {"resources": {"limits": {"memory": "4Gi"}}}}'
            return tags
        ```
        """
        return {TAG_STEP_TYPE: step.type}

    def get_pool(self, plan: TaskPlan, step: TaskStep) -> str | None:
        """The pool of a ``prompt_agent`` step, one per agent id and model (``agentenv_agent_claude_code``),
        so a limit set on it (``dagster instance concurrency set``) holds across runs; None for other steps.

        ```python
        def get_pool(self, plan, step):
            return "llm_calls" if step.type in ("prompt_agent", "rubrics_verifier") else None
        ```
        """
        agents = [n.name for n in step.names_read() if n.kind == AGENT]
        if step.type != "prompt_agent" or not agents:
            return None
        deploy = next((plan.step_by_id[a] for a in plan.ancestors(step.id)
                       if (AGENT, agents[0]) in plan.written_by(plan.step_by_id[a])), None)
        if deploy is None:
            return None
        model = (getattr(deploy, "agent_config", None) or {}).get("model") or getattr(step, "model", None)
        parts = ["agentenv_agent", getattr(deploy, "a2a_agent_id", None) or "default", *([model] if model else [])]
        return node_name("_".join(parts))

    def get_retry_policy(self, step: TaskStep) -> dg.RetryPolicy | None:
        """A ``retry_config`` naming the step itself retries the op in place; one naming an ancestor
        re-executes the span in a child run (``retries.py``), so it has no policy here.

        ```python
        def get_retry_policy(self, step):
            if step.type == "prompt_agent":  # every prompt: twice more, 10 s apart
                return dg.RetryPolicy(max_retries=2, delay=10)
            return super().get_retry_policy(step)
        ```
        """
        config = step.retry_config
        if config and config.retry_from_step_id == step.id and config.max_retries > 0:
            return dg.RetryPolicy(max_retries=config.max_retries)
        return None

    def get_partitions_def(self, plan: TaskPlan) -> dg.PartitionsDefinition | None:
        """A dataset's row ids as static partitions; under an experiment, variants x rows
        (``<row>|<variant>``) or the variants alone; None without rows. Row-level launches,
        backfills and the suite read the keys, so an override should keep the row ids."""
        document = plan.document
        if document.variant_steps is None:
            return dg.StaticPartitionsDefinition(list(document.partitions)) if document.partitions else None
        variants = dg.StaticPartitionsDefinition(list(document.variant_steps))
        if not (rows := document.row_ids()):
            return variants
        return dg.MultiPartitionsDefinition({"row": dg.StaticPartitionsDefinition(rows), "variant": variants})

    def get_group_name(self, plan: TaskPlan) -> str:
        """The asset group of the task's assets: its job name (``"evals"`` would put every task in one)."""
        return job_name(plan.task_id)

    def get_automation_condition(self, plan: TaskPlan) -> dg.AutomationCondition | None:
        """The automation condition of the task's assets, for Dagster's ``default_automation_condition_sensor``
        (see [Regressions and staleness](regressions-and-staleness.md#keeping-scores-current-from-the-daemon)).
        None: nothing is automatic. A true condition on any asset runs the whole task (a dataset: the
        rows it holds for), as its assets materialize together."""
        return None

    # -- assets ----------------------------------------------------------------------------
    def get_verification_asset_key(self, task_id: str, verifier_id: str) -> dg.AssetKey:
        """A verification's asset: ``verifications/<job>/<verifier_id>``."""
        return dg.AssetKey(["verifications", job_name(task_id), verifier_id])

    def get_collection_asset_key(self, task_id: str, step_id: str) -> dg.AssetKey:
        """What a ``collect_artifacts`` step gathers: ``artifacts/<job>/<step id>``."""
        return dg.AssetKey(["artifacts", job_name(task_id), step_id])

    def get_suite_asset_key(self, task_id: str) -> dg.AssetKey:
        """A dataset task's rolled-up rows: ``suites/<job>``."""
        return dg.AssetKey(["suites", job_name(task_id)])

    def get_loaded_artifact_asset_key(self, artifact_id: str) -> dg.AssetKey:
        """A stored artifact, which steps load or write by name: ``artifacts/<artifact_id>``, shared by
        every task that names it."""
        return dg.AssetKey(["artifacts", artifact_id])

    def produced_asset_keys(self, task_id: str, step: TaskStep) -> list[tuple[str, str, dg.AssetKey]]:
        """(kind, name, key) of the assets a step materializes, from its declared writes, e.g.
        ``[("verification", "sent", AssetKey(["verifications", "reply_to_dana", "sent"]))]``. A stored artifact it
        names (a snapshot's universe) replaces a task-scoped one. Override the ``get_*_asset_key`` methods instead."""
        written = list(step.names_written())
        named = any(n.kind == ARTIFACT for n in written)
        keys = []
        for name in written:
            if name.kind == VERIFICATION:
                keys.append((VERIFICATION, name.name, self.get_verification_asset_key(task_id, name.name)))
            elif name.kind == ARTIFACT:
                keys.append((ARTIFACT, name.name, self.get_loaded_artifact_asset_key(name.name)))
            elif name.kind == PRODUCER and name.field == SELF and not named:
                keys.append((PRODUCER, step.id, self.get_collection_asset_key(task_id, step.id)))
        return keys

    def get_step_assets_tag(self, plan: TaskPlan, step: TaskStep) -> str:
        """The asset keys a step's op reports and its verifications' checks, as JSON for a node tag, so
        a run uses the translator that built the job (ops are shared). Not meant to be overridden."""
        produced = self.produced_asset_keys(plan.task_id, step)
        verifies = any(kind == VERIFICATION for kind, _, _ in produced)
        return json.dumps({
            "produced": [[kind, name, key.path] for kind, name, key in produced],
            "loaded": {n.name: self.get_loaded_artifact_asset_key(n.name).path
                       for n in step.names_read() if n.kind == ARTIFACT},
            "checks": [name for name, _ in step.verification_checks()] if verifies else [],
        })

    def get_step_asset_outputs(self, plan: TaskPlan, step: TaskStep) -> list[tuple[dg.AssetKey, str]]:
        """(key, description) of the task-scoped assets a step's node materializes: its verification or
        what it collects (stored artifacts are shared by tasks: ``get_artifact_specs``)."""
        what = {VERIFICATION: "verification", PRODUCER: "artifacts produced"}
        return [(key, f"The {what[kind]} of step `{step.id}` ({step.type}) of task `{plan.task_id}`.")
                for kind, _, key in self.produced_asset_keys(plan.task_id, step) if kind != ARTIFACT]

    def get_results_asset_key(self, plan: TaskPlan) -> dg.AssetKey:
        """Each row's outcome (its status and each step's), written by the task's last node: ``results/<job>``."""
        return dg.AssetKey(["results", self.get_job_name(plan)])

    def get_asset_tags(self, plan: TaskPlan) -> dict[str, str]:
        """Tags on every asset of the task (``agentenv_task_id: <job>``), for the catalog's filters."""
        return {TAG_TASK_ID.replace("/", "_"): self.get_job_name(plan)}

    def get_code_version(self, plan: TaskPlan, config: AgentEnvConfig, step: TaskStep | None = None) -> str:
        """A hash of what decides an asset's value, so Dagster shows it stale once that changes: the step
        and its ancestry (every variant's; for ``results``, ``step`` None, every step), the seed, the
        registry entries of the agents and envs they deploy (a replay script's content too), and the
        models of their ``[model]`` roles (``get_model_roles``) with provider protocol and params.
        Not keys, endpoints, prices, descriptions, run settings, nor a dataset's rows (data: a new
        row is one missing partition, not every score stale).

        ```python
        def get_code_version(self, plan, config, step=None):  # a new grader release makes every score stale
            return super().get_code_version(plan, config, step) + "-grader2"
        ```
        """
        ids = {s.id for s in plan.steps} if step is None else {step.id, *plan.ancestors(step.id)}
        variants = {v: [s for s in steps if s.id in ids] for v, steps in (plan.document.variant_steps or {}).items()}
        steps = [s for s in plan.steps if s.id in ids]
        runs_on = {json.dumps(self._runs_on(s, config), sort_keys=True, default=str)
                   for s in [*steps, *(s for vs in variants.values() for s in vs)]}
        parts = {"task": plan.task_id, "steps": [s.to_document() for s in steps],
                 "variants": {v: [s.to_document() for s in vs] for v, vs in variants.items()},
                 "seed": plan.document.seed, "runs_on": sorted(runs_on)}
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def get_model_roles(self, step: TaskStep) -> list[str]:
        """The ``[model]`` roles deciding what ``step`` records, for its code version: ``judge`` for a
        rubric without a model of its own and for criteria with a ``judge_model`` (``llm_judge``,
        ``agent_judge``); a deployed agent's model comes with its entry. Override it for a custom judge:

        ```python
        def get_model_roles(self, step):
            return ["judge"] if step.type == "tone_check" else super().get_model_roles(step)
        ```
        """
        if step.type == "rubrics_verifier":
            return [] if getattr(step, "default_model", None) else ["judge"]
        if step.type == "success_criteria":
            from ..criteria.registry import CRITERION_TYPES

            judged = any(callable(getattr(CRITERION_TYPES.get(c.get("type")), "judge_model", None))
                         for c in getattr(step, "criteria", None) or [] if isinstance(c, dict))
            return ["judge"] if judged else []
        return []

    def _runs_on(self, step: TaskStep, config: AgentEnvConfig) -> dict[str, Any]:
        """What a step runs on that its document does not say: the agent or env it deploys
        (a rubric's judge agent), and the models of its roles."""
        found: dict[str, Any] = {}
        if step.type == "deploy_agent":
            agent_id = getattr(step, "a2a_agent_id", None) or config.agents.default_a2a_agent_id
            found["agent"] = _agent_version(config, agent_id, getattr(step, "agent_config", None) or {})
        elif step.type == "deploy_env":
            env_id = getattr(step, "env_id", None) or ""
            entry = config.env_entry(env_id)
            found["env"] = [env_id, entry.model_dump(mode="json", exclude_none=True, exclude={"mcp_url"})
                            if entry is not None else None]
        elif step.type == "rubrics_verifier" and getattr(step, "use_agent_judge", False):
            agent_id = getattr(step, "judge_a2a_agent_id", None) or config.agents.judge_a2a_agent_id
            found["judge_agent"] = _agent_version(config, agent_id, {})
        if roles := self.get_model_roles(step):
            found["models"] = {role: _model_version(config, config.model.for_role(role)) for role in roles}
            found["params"] = config.model.params
        return found

    def get_artifact_specs(self, plans: list[TaskPlan]) -> list[dg.AssetSpec]:
        """One spec per stored artifact any task loads or writes: a universe one task snapshots and
        another loads is one asset, downstream of what the writer loaded."""
        upstream: dict[str, set[str]] = {}
        writers: dict[str, list[str]] = {}
        for plan in plans:
            for step in plan.steps:
                lineage = plan.artifact_lineage(step.id)
                upstream.update({a: upstream.get(a, set()) for a in lineage})
                for kind, artifact_id, _ in self.produced_asset_keys(plan.task_id, step):
                    if kind == ARTIFACT:
                        upstream.setdefault(artifact_id, set()).update(lineage)
                        writers.setdefault(artifact_id, []).append(f"`{plan.task_id}`/`{step.id}`")
        return [dg.AssetSpec(
            key=self.get_loaded_artifact_asset_key(artifact_id), group_name="artifacts",
            deps=[self.get_loaded_artifact_asset_key(d) for d in deps],
            description=f"Stored artifact `{artifact_id}` (versioned in the artifact store)."
                        + (f" Written by {', '.join(writers[artifact_id])}." if artifact_id in writers else ""),
        ) for artifact_id, deps in _acyclic(upstream).items()]

    def get_check_specs(self, plan: TaskPlan) -> list[dg.AssetCheckSpec]:
        """The checks each verifier declares (``passed``; Coder Eval adds one per gating criterion),
        partitioned like its asset so the UI shows which rows passed (a Dagster preview: its
        warning is silenced, the project pins Dagster).

        ```python
        def get_check_specs(self, plan):  # make every check blocking
            return [spec._replace(blocking=True) for spec in super().get_check_specs(plan)]
        ```
        """
        partitions = self.get_partitions_def(plan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dg.PreviewWarning)
            return [
                dg.AssetCheckSpec(name=name, asset=key, description=description, partitions_def=partitions)
                for step in plan.steps
                for kind, _, key in self.produced_asset_keys(plan.task_id, step)
                if kind == VERIFICATION
                for name, description in step.verification_checks()
            ]


def _agent_version(config: AgentEnvConfig, agent_id: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """An agent as it decides scores: its registry entry (a replay script's content hashed in) and the model it
    runs on (its own, the step's, or ``[model]``'s agent role)."""
    entry = config.agent_entry(agent_id)
    if entry is None:
        return {"id": agent_id, "entry": None}
    # fields that leave an agent's scores as they are
    data = entry.model_dump(mode="json", exclude_none=True, exclude={"description", "delay_seconds", "cli_path"})
    if entry.script:
        script = config.path(entry.script)
        data["script"] = _file_digest(script, script.stat().st_mtime_ns) if script.is_file() else entry.script
    kind = overrides.get("kind", entry.kind)
    model = overrides.get("model") or entry.model or (config.model.for_role("agent") if kind != "replay" else None)
    return {"id": agent_id, "entry": data, **({"model": _model_version(config, model)} if model else {})}


@lru_cache(maxsize=256)
def _file_digest(path: Path, modified_ns: int) -> str:
    """A file's content hash (read once while it is unchanged: every task deploying the agent asks)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _model_version(config: AgentEnvConfig, model: str) -> dict[str, Any]:
    """A model as it decides scores: its name and how its provider is spoken to (not its endpoint nor its key)."""
    try:
        resolved = config.model.resolve(model)
    except ValueError:
        return {"model": model}
    return {"model": model, **resolved.settings.model_dump(mode="json", exclude={"base_url", "api_key"})}


def _acyclic(upstream: dict[str, set[str]]) -> dict[str, list[str]]:
    """The artifact lineage without cycles, which Dagster refuses: a snapshot written back to the universe it loaded
    adds a version, not an edge; an edge closing a longer loop (A turns X into Y, B Y into X) is left out, warned."""
    kept: dict[str, list[str]] = {a: [] for a in sorted(upstream)}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        seen.add(start)
        return start == goal or any(reaches(d, goal, seen) for d in kept.get(start, ()) if d not in seen)

    for artifact_id in kept:
        for dep in sorted(upstream[artifact_id] - {artifact_id}):
            if reaches(dep, artifact_id, set()):
                log.warning("asset lineage: left out artifact '%s' -> '%s', which would close a cycle",
                            dep, artifact_id)
            else:
                kept[artifact_id].append(dep)
    return kept

