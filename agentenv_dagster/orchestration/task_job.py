"""A task plan as Dagster definitions: its op graph, the multi-asset it backs, and its job.

The graph mirrors the plan (a node per step, the ``depends_on`` edges, a final ``teardown_run``); each
verification and collection is an asset mapped from its step's node, ``results/<task>`` from the teardown,
so **Materialize** runs the task and code versions flag stale scores. A backfill runs its rows in one run.
"""

from __future__ import annotations

from dataclasses import dataclass

import dagster as dg

from ..config import AgentEnvConfig, RegressionSettings
from ..naming import dagster_name
from ..plan import TaskPlan
from ..steps.base import ARTIFACT, VERIFICATION
from .ops import AFTER, ARTIFACTS_INPUT, ASSET_OUTPUT, TEARDOWN_OP, step_op, teardown_op
from .regression import produces_verification, regression_tag
from .retries import span_tags
from .rows import ROWS, STEP_ASSETS_TAG, STEPS, register_plan, step_config
from .translator import TAG_CODE_VERSION, TAG_CONTENT_HASH, TAG_STEP_ID, TaskTranslator

POOL_TAG = "dagster/concurrency_key"  # a node's pool, as Dagster reads it from a node's tags
TaskAsset = tuple[dg.AssetKey, str, set[dg.AssetKey]]  # a node's asset: its key, description and what it is made from


@dataclass(frozen=True)
class TaskDefinitions:
    """What one task adds to a code location: the multi-asset its graph backs and its job."""

    assets: dg.AssetsDefinition
    job: dg.UnresolvedAssetJobDefinition


def build_task(plan: TaskPlan, translator: TaskTranslator, executor_def: dg.ExecutorDefinition,
               config: AgentEnvConfig) -> TaskDefinitions:
    register_plan(translator.get_graph_name(plan), plan)
    code_versions = asset_code_versions(plan, translator, config)
    regression = config.regression.for_task(plan.task_id)
    graph, outputs, inputs = task_graph(plan, translator, code_versions, regression if regression.enabled else None)
    condition = translator.get_automation_condition(plan)
    assets = dg.AssetsDefinition.from_graph(
        graph,
        keys_by_output_name={name: key for name, (key, _, _) in outputs.items()},
        keys_by_input_name=inputs,
        internal_asset_deps={name: made_from for name, (_, _, made_from) in outputs.items()},
        descriptions_by_output_name={name: description for name, (_, description, _) in outputs.items()},
        code_versions_by_output_name={name: code_versions[name] for name in outputs},
        partitions_def=translator.get_partitions_def(plan),
        group_name=translator.get_group_name(plan),
        backfill_policy=dg.BackfillPolicy.single_run(),
        tags_by_output_name={name: translator.get_asset_tags(plan) for name in outputs},
        automation_conditions_by_output_name=dict.fromkeys(outputs, condition) if condition is not None else None,
    )
    job = dg.define_asset_job(
        translator.get_job_name(plan), selection=dg.AssetSelection.assets(assets).without_checks(),
        tags=translator.get_job_tags(plan), executor_def=executor_def, description=translator.get_job_description(plan),
    )
    return TaskDefinitions(assets, job)


def asset_code_versions(plan: TaskPlan, translator: TaskTranslator, config: AgentEnvConfig) -> dict[str, str]:
    """The code version of each node's task asset, by node: a step's from its ancestry, the
    teardown's ``results`` from the whole task (``TaskTranslator.get_code_version``)."""
    versions = {translator.get_node_name(step): translator.get_code_version(plan, config, step)
                for step in plan.steps if translator.get_step_asset_outputs(plan, step)}
    return {**versions, TEARDOWN_OP: translator.get_code_version(plan, config)}


def task_graph(plan: TaskPlan, translator: TaskTranslator, code_versions: dict[str, str],
               regression: RegressionSettings | None = None) -> tuple[
        dg.GraphDefinition, dict[str, TaskAsset], dict[str, dg.AssetKey]]:
    """The task's op graph, the assets its outputs map to (output name -> TaskAsset) and the stored artifacts
    its inputs map from (input name -> key). ``code_versions`` (by node) and ``regression`` (the task's gate, or None)
    become node tags: what the ops stamp on their materializations and check their scores with."""
    deps: dict[dg.NodeInvocation, dict] = {}
    node_defs: dict[str, dg.OpDefinition] = {}
    outputs: dict[str, TaskAsset] = {}
    inputs: dict[str, dg.AssetKey] = {}
    input_mappings = []
    graph_name = translator.get_graph_name(plan)
    versioned = {node: {TAG_CODE_VERSION: version} for node, version in code_versions.items()}
    for step in plan.steps:
        node = translator.get_node_name(step)
        # an op per step, for its description; named after the graph: op names are unique in a repository
        op_def = step_op(step.type).with_replaced_properties(
            name=f"{graph_name}__{node}", description=translator.get_op_description(plan, step))
        node_defs[op_def.name] = op_def
        invocation = dg.NodeInvocation(
            op_def.name, alias=node, retry_policy=translator.get_retry_policy(step),
            tags={
                **translator.get_op_tags(step), TAG_STEP_ID: step.id,
                STEP_ASSETS_TAG: translator.get_step_assets_tag(plan, step),
                TAG_CONTENT_HASH: plan.document.content_hash, **versioned.get(node, {}),
                **(regression_tag(regression) if regression is not None and produces_verification(
                    translator, plan, step) else {}),
                **({POOL_TAG: pool} if (pool := translator.get_pool(plan, step)) else {}),
                **span_tags(plan, step, translator),
            },
        )
        sources = plan.context_sources(step.id)
        deps[invocation] = _fan_in(
            [translator.get_node_name(plan.step_by_id[d]) for d in sources],
            after=[translator.get_node_name(plan.step_by_id[d]) for d in plan.edges[step.id] if d not in sources],
        )
        for key, description in translator.get_step_asset_outputs(plan, step):  # one task asset a step, at most
            # made from the stored artifacts its ancestry loaded and the verifications it reads (an aggregate's)
            made_from = {translator.get_loaded_artifact_asset_key(a) for a in plan.artifact_lineage(step.id)}
            made_from |= {translator.get_verification_asset_key(plan.task_id, n.name)
                          for n in step.names_read() if n.kind == VERIFICATION}
            outputs[node] = (key, description, made_from)
        for artifact_id in sorted({n.name for n in step.names_read() if n.kind == ARTIFACT}):
            name = f"artifact__{dagster_name(artifact_id)}"
            inputs[name] = translator.get_loaded_artifact_asset_key(artifact_id)
            input_mappings.append(dg.InputMapping(graph_input_name=name, mapped_node_name=node,
                                                  mapped_node_input_name=ARTIFACTS_INPUT))
    teardown = teardown_op()
    node_defs[teardown.name] = teardown
    sinks = [translator.get_node_name(plan.step_by_id[s]) for s in plan.sinks]
    teardown_tags = {TAG_CONTENT_HASH: plan.document.content_hash, **versioned.get(TEARDOWN_OP, {})}
    deps[dg.NodeInvocation(teardown.name, alias=TEARDOWN_OP, tags=teardown_tags)] = _fan_in(sinks)
    outputs[TEARDOWN_OP] = (translator.get_results_asset_key(plan),
                            f"Each row's outcome in task `{plan.task_id}`: its status and each step's.",
                            {key for key, _, _ in outputs.values()})  # made from every other asset
    output_mappings = [dg.OutputMapping(graph_output_name=node, mapped_node_name=node,
                                        mapped_node_output_name=ASSET_OUTPUT) for node in outputs]
    graph = dg.GraphDefinition(
        name=graph_name, node_defs=list(node_defs.values()), dependencies=deps,
        description=translator.get_job_description(plan), input_mappings=input_mappings,
        output_mappings=output_mappings, config=graph_config(plan, translator),
    )
    return graph, outputs, inputs


def graph_config(plan: TaskPlan, translator: TaskTranslator) -> dg.ConfigMapping:
    """The task graph's config: ``steps``, each step's fields by node (the launchpad opens with them; a step given
    there replaces that step), and ``rows``, the rows the root ops start when not the run's partitions. A dataset's
    row values are not config: each row is filled from the task's own (``ops._RowsOfOp.admitted``)."""
    defaults = {translator.get_node_name(step): step_config(step) for step in plan.steps}
    roots = {translator.get_node_name(step) for step in plan.steps if not plan.edges[step.id]}
    schema = {
        STEPS: dg.Field(dg.Permissive(), default_value=defaults,
                        description="each step's fields, by node; a step given here replaces that step"),
        ROWS: dg.Field(dg.Array(str), is_required=False,
                       description="the rows (partition keys) to run, when not the run's partitions"),
    }

    def node_configs(config: dict) -> dict:
        rows = config.get(ROWS)
        return {node: {"config": {"step": fields, **({ROWS: rows} if rows and node in roots else {})}}
                for node, fields in {**defaults, **(config.get(STEPS) or {})}.items()}

    return dg.ConfigMapping(config_fn=node_configs, config_schema=schema)


def run_config(plan: TaskPlan, translator: TaskTranslator, rows: list[str] | None = None) -> dict:
    """The run config of a launch of the task as ``plan`` has it now: its steps (of the rows'
    variant, under an experiment) and, when given, the rows the root ops start."""
    steps = {translator.get_node_name(step): step_config(step)
             for step in plan.document.steps_for(rows[0] if rows else None)}
    config = {STEPS: steps, **({ROWS: list(rows)} if rows else {})}
    return {"ops": {translator.get_graph_name(plan): {"config": config}}}


def _fan_in(upstream: list[str], after: list[str] = ()) -> dict:
    """A node's ``depends_on`` edges: ``upstream`` hands it the rows whose contexts it merges, ``after`` only orders it
    (a dependency another one descends from: merging its context again would cost a dataset run a merge per row)."""
    return {
        name: dg.MultiDependencyDefinition([dg.DependencyDefinition(node, "result") for node in nodes])
        for name, nodes in (("upstream", upstream), (AFTER, after)) if nodes
    }


