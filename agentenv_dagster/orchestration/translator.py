"""TaskTranslator: every naming and mapping decision from a task plan to Dagster specs.

Like dagster-dbt's translator, users subclass it and override a small ``get_*`` method
instead of forking the compiler, then pass it to ``build_definitions`` or
``build_repository``.
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
from ..naming import job_name, node_name
from ..plan import TaskPlan
from ..steps.base import AGENT, ARTIFACT, PRODUCER, SELF, VERIFICATION, TaskStep
from .rows import CONTENT_HASH_TAG, STEP_ASSETS_TAG, TASK_ID_TAG

TAG_TASK_ID = TASK_ID_TAG
TAG_TASK_VERSION = "agentenv/task_version"
TAG_CONTENT_HASH = CONTENT_HASH_TAG
TAG_FORMAT = "agentenv/format"
TAG_STEP_ASSETS = STEP_ASSETS_TAG
TAG_STEP_TYPE = "agentenv/step_type"
TAG_STEP_ID = "agentenv/step_id"  # node tag: the step a node runs (its id in the task document)
TAG_SEED = "agentenv/seed"  # the task's default token values (JSON); edit it in the launchpad to retarget a run
TAG_CODE_VERSION = "agentenv/code_version"  # node tag: the code version its assets' materializations carry

log = logging.getLogger("agentenv_dagster")


class TaskTranslator:
    """How task plans become Dagster definitions: names, tags, pools, retries, partitions,
    asset keys, checks and code versions. Subclass it and override what you need:

    ```python
    from agentenv_dagster import build_repository
    from agentenv_dagster.orchestration.translator import TaskTranslator

    class TeamTranslator(TaskTranslator):
        def get_job_name(self, plan):
            return "eval_" + super().get_job_name(plan)

    defs = build_repository("tasks", translator=TeamTranslator())
    ```

    A method's result must stay a valid Dagster name or spec: a task whose definitions Dagster
    refuses becomes a ``<file>__invalid`` job that says why.
    """

    def get_job_name(self, plan: TaskPlan) -> str:
        """The task's job name: the task id with characters outside ``[A-Za-z0-9_]`` mapped to
        ``_`` (``reply-to-dana`` → ``reply_to_dana``). Two tasks with one job name are a
        compile error. Asset keys are made from the task id by the ``get_*_asset_key``
        methods, so renaming jobs keeps the assets' history.

        ```python
        def get_job_name(self, plan):
            return f"eval_{super().get_job_name(plan)}"
        ```
        """
        return job_name(plan.task_id)

    def get_graph_name(self, plan: TaskPlan) -> str:
        """The task's op graph, the one node of its job (its steps are the graph's nodes):
        ``reply_to_dana_steps`` for the job ``reply_to_dana``; op step keys read
        ``reply_to_dana_steps.<step id>``.

        ```python
        def get_graph_name(self, plan):
            return self.get_job_name(plan) + "_graph"
        ```
        """
        return f"{self.get_job_name(plan)}_steps"

    def get_node_name(self, step: TaskStep) -> str:
        """A step's node in the graph: its id made a valid Dagster name (``ask-user`` →
        ``ask_user``). Node names must stay unique within a task.

        ```python
        def get_node_name(self, step):
            return f"{step.type}__{super().get_node_name(step)}"
        ```
        """
        return node_name(step.id)

    def get_job_tags(self, plan: TaskPlan) -> dict[str, str]:
        """Tags every run of the task's job carries: task id, version, content hash, format and
        (for a stored task with a seed) its seed. Keep these keys when overriding: sensors,
        retries and re-execution read them.

        ```python
        def get_job_tags(self, plan):
            return {**super().get_job_tags(plan), "team": "support"}
        ```
        """
        return {
            TAG_TASK_ID: plan.task_id,
            TAG_TASK_VERSION: str(plan.document.version or "unversioned"),
            TAG_CONTENT_HASH: plan.document.content_hash,
            TAG_FORMAT: plan.document.format,
            **({TAG_SEED: json.dumps(plan.document.seed, sort_keys=True)} if plan.document.seed else {}),
        }

    def get_job_description(self, plan: TaskPlan) -> str:
        """The job's description in the UI: the task's own description (Coder Eval), what its
        first prompt asks, and where it comes from, e.g. ``Prompt: "Reply to Dana." — agent-env
        task `reply_to_dana` from `tasks/reply_to_dana.json` (7 steps)``.

        ```python
        def get_job_description(self, plan):
            return super().get_job_description(plan) + " Owner: support."
        ```
        """
        origin = f"{plan.document.format} task `{plan.task_id}` from `{plan.document.source}` ({len(plan.steps)} steps)"
        prompt = next((p for s in plan.steps if isinstance(p := getattr(s, "prompt", None), str) and p.strip()), "")
        lines = [plan.document.description or "", f'Prompt: "{_excerpt(prompt)}"' if prompt else "", origin]
        return "\n\n".join(line for line in lines if line)

    def get_op_description(self, plan: TaskPlan, step: TaskStep) -> str:
        """What a step's op says in the UI: its id, type and what it reads and writes, e.g.
        ``Step `reply` (prompt_agent): reads agent `assistant`; writes prompt `reply`.``

        ```python
        def get_op_description(self, plan, step):
            return super().get_op_description(plan, step) + " Owned by the support team."
        ```
        """
        parts = [f"Step `{step.id}` ({step.type})"]
        for verb, names in (("reads", step.names_read()), ("writes", step.names_written())):
            listed = sorted({f"{n.kind} `{step.id if n.field == SELF else n.name}`" for n in names})
            if listed:
                parts.append(f"{verb} {', '.join(listed)}")
        rows = " for each row of the run" if plan.document.partitions else ""
        return f"{parts[0]}{rows}" + (": " + "; ".join(parts[1:]) if parts[1:] else "") + "."

    def get_op_tags(self, step: TaskStep) -> dict[str, str]:
        """Tags of a step's node (``agentenv/step_type``). Executors read node tags, so this is
        where per-step settings such as Kubernetes resources go:

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
        """The Dagster pool of a step that talks to an agent: one per agent id (and model),
        so a rate limit set on it (``dagster instance concurrency set``) holds across runs.
        ``agentenv_agent_claude_code`` for a ``prompt_agent`` of the agent ``claude-code``;
        None (no pool) for other steps.

        ```python
        def get_pool(self, plan, step):
            return "llm_calls" if step.type in ("prompt_agent", "rubrics_verifier") else None
        ```
        """
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
        """``retry_config`` naming the step itself retries the op in place; one naming an
        ancestor is a re-execution of the span in a child run (``retries.py``), so it has no
        policy here.

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
        """A dataset task's rows as static partitions (a row id is a partition key); a task
        under an experiment, its variants x rows (``<row>|<variant>``), or its variants alone;
        None for a task without rows. Partition keys are what row-level launches, backfills
        and the suite read, so an override should keep the row ids as keys.

        ```python
        def get_partitions_def(self, plan):
            partitions = super().get_partitions_def(plan)
            return None if plan.task_id.startswith("smoke-") else partitions
        ```
        """
        document = plan.document
        if document.variant_steps is not None:
            variants = dg.StaticPartitionsDefinition(list(document.variant_steps))
            rows = document.row_ids()
            if not rows:
                return variants
            return dg.MultiPartitionsDefinition({"row": dg.StaticPartitionsDefinition(rows), "variant": variants})
        rows = document.partitions
        return dg.StaticPartitionsDefinition(list(rows)) if rows else None

    def get_group_name(self, plan: TaskPlan) -> str:
        """The asset group of the task's assets in the UI: its job name.

        ```python
        def get_group_name(self, plan):
            return "evals"  # every task's assets in one group
        ```
        """
        return job_name(plan.task_id)

    def get_automation_condition(self, plan: TaskPlan) -> dg.AutomationCondition | None:
        """The declarative automation condition of the task's assets, which Dagster's
        ``default_automation_condition_sensor`` evaluates (turn it on in the UI's Automation
        page). None, the default: nothing is automatic, and the ``agentenv_stale_scores``
        sensor re-runs stale scores when turned on. The task's assets materialize together,
        so a true condition on any of them runs the whole task (a dataset: the rows it holds for).

        ```python
        def get_automation_condition(self, plan):  # run a task again once what decides its scores changed
            return dg.AutomationCondition.code_version_changed()
        ```
        """
        return None

    # -- assets ----------------------------------------------------------------------------
    def get_verification_asset_key(self, task_id: str, verifier_id: str) -> dg.AssetKey:
        """A verification's asset: ``verifications/<job>/<verifier_id>``.

        ```python
        def get_verification_asset_key(self, task_id, verifier_id):
            return super().get_verification_asset_key(task_id, verifier_id).with_prefix("evals")
        ```
        """
        return dg.AssetKey(["verifications", job_name(task_id), verifier_id])

    def get_collection_asset_key(self, task_id: str, step_id: str) -> dg.AssetKey:
        """What a ``collect_artifacts`` step gathers: ``artifacts/<job>/<step id>``.

        ```python
        def get_collection_asset_key(self, task_id, step_id):
            return dg.AssetKey(["outputs", job_name(task_id), step_id])
        ```
        """
        return dg.AssetKey(["artifacts", job_name(task_id), step_id])

    def get_suite_asset_key(self, task_id: str) -> dg.AssetKey:
        """A dataset task's rolled-up rows: ``suites/<job>``.

        ```python
        def get_suite_asset_key(self, task_id):
            return super().get_suite_asset_key(task_id).with_prefix("evals")
        ```
        """
        return dg.AssetKey(["suites", job_name(task_id)])

    def get_loaded_artifact_asset_key(self, artifact_id: str) -> dg.AssetKey:
        """A stored artifact: what steps load, and what a step writing it by name materializes:
        ``artifacts/<artifact_id>``, shared by every task that names it.

        ```python
        def get_loaded_artifact_asset_key(self, artifact_id):
            return dg.AssetKey(["datasets", artifact_id])
        ```
        """
        return dg.AssetKey(["artifacts", artifact_id])

    def produced_asset_keys(self, task_id: str, step: TaskStep) -> list[tuple[str, str, dg.AssetKey]]:
        """(kind, name, key) of the assets a step materializes, from its declared writes. A
        stored artifact the step names (a snapshot's universe) is that artifact's own asset,
        the one ``load_artifact`` reads, in place of a task-scoped one. It calls the
        ``get_*_asset_key`` methods; override those rather than this.

        ```python
        translator.produced_asset_keys("reply-to-dana", plan.step_by_id["sent"])
        # [("verification", "sent", AssetKey(["verifications", "reply_to_dana", "sent"]))]
        ```
        """
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
        """The asset keys a step's op reports, and the checks of its verifications, carried as
        a node tag so a run uses the translator that built the job (ops are shared; the node
        knows its step). Derived from ``produced_asset_keys``; not meant to be overridden.

        ```python
        json.loads(translator.get_step_assets_tag(plan, plan.step_by_id["sent"]))["checks"]
        # ["passed"]
        ```
        """
        produced = self.produced_asset_keys(plan.task_id, step)
        return json.dumps({
            "produced": [[kind, name, key.path] for kind, name, key in produced],
            "loaded": {
                n.name: self.get_loaded_artifact_asset_key(n.name).path
                for n in step.names_read() if n.kind == ARTIFACT
            },
            "checks": [name for name, _ in step.verification_checks()]
            if any(kind == VERIFICATION for kind, _, _ in produced) else [],
        })

    def get_step_asset_outputs(self, plan: TaskPlan, step: TaskStep) -> list[tuple[dg.AssetKey, str]]:
        """The task-scoped assets a step's node materializes (its verification, or what it
        collects), each with its description. Stored artifacts a step writes are shared by
        tasks (``get_artifact_specs``), not the task's own.

        ```python
        def get_step_asset_outputs(self, plan, step):
            return [(key, f"{text} Owner: support.") for key, text in super().get_step_asset_outputs(plan, step)]
        ```
        """
        outputs = []
        for kind, _, key in self.produced_asset_keys(plan.task_id, step):
            if kind != ARTIFACT:
                what = "verification" if kind == VERIFICATION else "artifacts produced"
                outputs.append((key, f"The {what} of step `{step.id}` ({step.type}) of task `{plan.task_id}`."))
        return outputs

    def get_results_asset_key(self, plan: TaskPlan) -> dg.AssetKey:
        """Each row's outcome (its status, and each step's): what the task's last node writes,
        ``results/<job>``.

        ```python
        def get_results_asset_key(self, plan):
            return dg.AssetKey(["runs", self.get_job_name(plan)])
        ```
        """
        return dg.AssetKey(["results", self.get_job_name(plan)])

    def get_asset_tags(self, plan: TaskPlan) -> dict[str, str]:
        """Tags on every asset of the task (``agentenv_task_id: <job>``), for the catalog's
        filters.

        ```python
        def get_asset_tags(self, plan):
            return {**super().get_asset_tags(plan), "format": plan.document.format}
        ```
        """
        return {TAG_TASK_ID.replace("/", "_"): self.get_job_name(plan)}

    def get_code_version(self, plan: TaskPlan, config: AgentEnvConfig, step: TaskStep | None = None) -> str:
        """What decides an asset's value, hashed: Dagster shows the asset stale once it
        changes. For a step's asset (its verification, what it collects) that is the step and
        its ancestry as the task document has them (under an experiment, every variant's),
        the task's default token values, and what those steps run on: the registry entries of
        the agents and envs they deploy (a replay script's content too) and the models of the
        ``[model]`` roles they use (``get_model_roles``) with their providers' protocol and
        ``[model] params``. For the task's ``results`` (``step`` None), every step's.

        Not part of it: keys, endpoints (``base_url``, ``mcp_url``), prices, descriptions,
        run settings (rows in flight, sandboxes, the executor), and a dataset's rows (data,
        not code: adding a row makes only that row's partitions missing, not every row's
        score stale).

        ```python
        def get_code_version(self, plan, config, step=None):  # a new grader release makes every score stale
            return super().get_code_version(plan, config, step) + "-grader2"
        ```
        """
        document = plan.document
        ids = ({s.id for s in plan.steps} if step is None
               else {step.id, *plan.ancestors(step.id)})
        variants = {v: [s for s in steps if s.id in ids] for v, steps in (document.variant_steps or {}).items()}
        steps = [s for s in plan.steps if s.id in ids]
        runs_on = {json.dumps(self._runs_on(s, config), sort_keys=True, default=str)
                   for s in [*steps, *(s for vs in variants.values() for s in vs)]}
        parts = {
            "task": plan.task_id,
            "steps": [s.to_document() for s in steps],
            "variants": {v: [s.to_document() for s in vs] for v, vs in variants.items()},
            "seed": document.seed,
            "runs_on": sorted(runs_on),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def get_model_roles(self, step: TaskStep) -> list[str]:
        """The ``[model]`` roles whose models decide what ``step`` records, for its assets'
        code versions: ``judge`` for a rubric that names no model of its own and for Coder Eval
        criteria with a judge (``llm_judge``, ``agent_judge``: a criterion type with a
        ``judge_model``). A deployed agent's model comes with its registry entry. Override it
        for a custom step that grades with a judge:

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
        roles = self.get_model_roles(step)
        if roles:
            found["models"] = {role: _model_version(config, config.model.for_role(role)) for role in roles}
            found["params"] = config.model.params
        return found

    def get_artifact_specs(self, plans: list[TaskPlan]) -> list[dg.AssetSpec]:
        """One spec per stored artifact any task loads or writes, so a universe one task
        snapshots and another loads is one asset: downstream of what the writing step had
        loaded, upstream of what the loading task produces.

        ```python
        def get_artifact_specs(self, plans):
            return [spec.replace_attributes(owners=["team:data"]) for spec in super().get_artifact_specs(plans)]
        ```
        """
        upstream: dict[str, set[str]] = {}
        writers: dict[str, list[str]] = {}
        for plan in plans:
            for step in plan.steps:
                lineage = plan.artifact_lineage(step.id)
                for artifact_id in lineage:
                    upstream.setdefault(artifact_id, set())
                for kind, artifact_id, _ in self.produced_asset_keys(plan.task_id, step):
                    if kind == ARTIFACT:
                        upstream.setdefault(artifact_id, set()).update(lineage)
                        writers.setdefault(artifact_id, []).append(f"`{plan.task_id}`/`{step.id}`")
        specs = []
        for artifact_id, deps in _acyclic(upstream).items():
            written = f" Written by {', '.join(writers[artifact_id])}." if artifact_id in writers else ""
            specs.append(dg.AssetSpec(
                key=self.get_loaded_artifact_asset_key(artifact_id), group_name="artifacts",
                deps=[self.get_loaded_artifact_asset_key(d) for d in deps],
                description=f"Stored artifact `{artifact_id}` (versioned in the artifact store).{written}",
            ))
        return specs

    def get_check_specs(self, plan: TaskPlan) -> list[dg.AssetCheckSpec]:
        """The checks each verifier declares (``passed``; Coder Eval adds one per gating
        criterion) on its verification asset, partitioned as it is: a row's check is evaluated
        on that row, and the UI shows which rows passed and which fell short. (Partitioned
        checks are a Dagster preview, whose warning is left out: the project pins Dagster.)

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


# an agent entry's fields that leave its scores as they are
AGENT_FIELDS_NOT_DECIDING = {"description", "delay_seconds", "cli_path"}


def _agent_version(config: AgentEnvConfig, agent_id: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """An agent as it decides scores: its registry entry (a replay script's content hashed in)
    and the model it runs on (its own, the step's, or ``[model]``'s agent role)."""
    entry = config.agent_entry(agent_id)
    if entry is None:
        return {"id": agent_id, "entry": None}
    data = entry.model_dump(mode="json", exclude_none=True, exclude=AGENT_FIELDS_NOT_DECIDING)
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
    """A model as it decides scores: its name and how its provider is spoken to (not where
    it is served, nor its key)."""
    try:
        resolved = config.model.resolve(model)
    except ValueError:
        return {"model": model}
    return {"model": model, **resolved.settings.model_dump(mode="json", exclude={"base_url", "api_key"})}


def _acyclic(upstream: dict[str, set[str]]) -> dict[str, list[str]]:
    """The artifact lineage without cycles, which Dagster refuses: a snapshot written back to
    the universe it loaded adds a version, not an edge; an edge closing a longer loop (task A
    turns X into Y, task B Y into X) is left out, with a warning."""
    kept: dict[str, list[str]] = {a: [] for a in sorted(upstream)}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(kept.get(node, ()))
        return False

    for artifact_id in kept:
        for dep in sorted(upstream[artifact_id] - {artifact_id}):
            if reaches(dep, artifact_id):
                log.warning("asset lineage: left out artifact '%s' -> '%s', which would close a cycle",
                            dep, artifact_id)
            else:
                kept[artifact_id].append(dep)
    return kept


def _excerpt(text: str, limit: int = 160) -> str:
    """A prompt on one line, cut at ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"
