"""The suite asset of a dataset task: each row's latest verification rolled up per criterion, with
``suite_thresholds`` as blocking checks; under an experiment a suite is one variant's rows (a partition)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from ..config import RegressionSettings
from ..naming import dagster_name
from ..plan import TaskPlan
from ..reports.results import EvaluationResult, FinalStatus
from ..reports.suite import suite_rollup
from ..spec.loader import TaskDocument
from ..steps.base import VERIFICATION
from .regression import suite_check_result, suite_check_spec
from .rows import latest_replicates
from .translator import TaskTranslator

SUITES_SENSOR = "agentenv_suites"
# Unlike ``eager()``, a row never run (outside a sample, or not reached yet) does not hold the suite back
ROWS_UPDATED = (dg.AutomationCondition.any_deps_updated().since_last_handled()
                & ~dg.AutomationCondition.any_deps_in_progress() & ~dg.AutomationCondition.in_progress()
                ).with_label("rows updated, none running")


def suite_asset(plan: TaskPlan, translator: TaskTranslator,
                regression: RegressionSettings | None = None) -> dg.AssetsDefinition | None:
    """The task's suite asset (None: not a dataset with criteria), gated by blocking checks on its thresholds
    and, with an enabled ``regression`` gate, ``no_regression`` on its metrics."""
    document = plan.document
    criteria = _criteria(plan, translator)
    if not document.row_ids() or criteria is None:  # a suite is a dataset's (under an experiment, a variant's)
        return None
    step, verification = criteria
    thresholds = [c.get("suite_thresholds") for c in step.criteria]  # a variant cannot change the criteria
    key = translator.get_suite_asset_key(plan.task_id)
    names = _check_names(thresholds)
    checks = [dg.AssetCheckSpec(name, asset=key, blocking=True,
                                description=f"suite {metric} of criterion {index + 1} >= {thresholds[index][metric]}")
              for (index, metric), name in names.items()]
    gate = regression if regression is not None and regression.enabled else None
    checks += [suite_check_spec(key, gate)] if gate is not None else []
    variants = list(document.variant_steps or ())
    what = (f"experiment job `{plan.task_id}`: each variant's rows" if variants
            else f"dataset task `{plan.task_id}`: its rows")

    @dg.asset(
        key=key, check_specs=checks, group_name=translator.get_group_name(plan), kinds={"agentenv"},
        automation_condition=ROWS_UPDATED,
        partitions_def=dg.StaticPartitionsDefinition(variants) if variants else None,
        deps=[verification],  # a variant's partition reads its variant x row ones: Dagster infers the mapping
        description=f"The suite of {what} rolled up.")
    def _suite(context):
        from ..reports.render import suite_markdown  # Jinja: not on every run worker's import path

        variant = context.partition_key if variants else None
        rows = [k for k in document.partitions if document.variant_of(k) == variant]
        replicates = document.replicates_of(variant)
        results = _row_results(context.instance, verification, plan.task_id, document, rows, replicates)
        suite = suite_rollup(plan.task_id, results, thresholds, variant_id=variant or "default")
        check_results = [dg.AssetCheckResult(check_name=names[aggregate["criterion_index"], check["metric"]],
                                             passed=check["passed"],
                                             metadata={"actual": check["actual_value"], "minimum": check["min_value"]})
                         for aggregate in suite["criterion_aggregates"] for check in aggregate["checks"]]
        if gate is not None:
            check_results.append(suite_check_result(context.instance, key, variant, _gated_metrics(suite), gate))
        return dg.MaterializeResult(
            metadata={
                **({"variant": variant} if variant else {}),
                "rows_run": len(results), "rows_total": len(rows) * replicates, "pass_rate": suite["pass_rate"],
                "average_weighted_score": suite["average_weighted_score"], "passed": suite["passed"],
                **_metric_series(suite),
                "criterion_aggregates": dg.MetadataValue.json(suite["criterion_aggregates"]),
                "summary": dg.MetadataValue.md(suite_markdown(suite)),
            }, check_results=check_results)

    return _suite


def suites_sensor(suites: list[dg.AssetsDefinition]) -> list[dg.AutomationConditionSensorDefinition]:
    """Keeps the suites current: whatever updated the rows, the daemon materializes the suite after it."""
    return [dg.AutomationConditionSensorDefinition(
        SUITES_SENSOR, target=dg.AssetSelection.assets(*suites), default_status=dg.DefaultSensorStatus.RUNNING,
        description="Rolls a dataset's suite up again once its rows were updated and none is running.",
    )] if suites else []


def _metric_series(suite: dict[str, Any]) -> dict[str, float]:
    """Each criterion's metrics as numbers of their own (``criterion_1/accuracy``), which the Plots tab charts."""
    return {f"criterion_{a['criterion_index'] + 1}/{name}": float(value)
            for a in suite["criterion_aggregates"] for name, value in a["metrics"].items()}


def _gated_metrics(suite: dict[str, Any]) -> dict[str, float]:
    """What a suite's regression gate compares: pass rate, average score and each gated metric, by metadata label."""
    metrics = {"pass_rate": suite["pass_rate"], "average_weighted_score": suite["average_weighted_score"],
               **{f"criterion_{a['criterion_index'] + 1}/{c['metric']}": c["actual_value"]
                  for a in suite["criterion_aggregates"] for c in a["checks"]}}
    return {name: float(value) for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def _check_names(thresholds: list[dict[str, float] | None]) -> dict[tuple[int, str], str]:
    """A check name per gate, unique on the asset (a label like ``f1.case-management`` is no Dagster name)."""
    names: dict[tuple[int, str], str] = {}
    for index, gate in enumerate(thresholds):
        for metric in gate or {}:
            name = dagster_name(f"criterion_{index + 1}_{metric}")
            while name in names.values():
                name += "_"
            names[index, metric] = name
    return names


def latest_row_results(plan: TaskPlan, instance: dg.DagsterInstance, rows: list[str], task_id: str,
                       variant: str | None = None) -> list[EvaluationResult]:
    """What the suite asset counts for ``rows`` (partition keys): each one's latest verification as the result
    of row-task ``<task_id>/<row>``; ``run --failed-only`` counts the rows it does not run again so."""
    criteria = _criteria(plan, TaskTranslator())
    return [] if criteria is None else _row_results(instance, criteria[1], task_id, plan.document, rows,
                                                    plan.document.replicates_of(variant))


def _criteria(plan: TaskPlan, translator: TaskTranslator) -> tuple[Any, dg.AssetKey] | None:
    """The success_criteria step a suite rolls up and its verification asset (None: nothing to roll up)."""
    step = next((s for s in plan.steps if s.type == "success_criteria" and getattr(s, "criteria", None)), None)
    if step is None:
        return None
    (key,) = [key for kind, _, key in translator.produced_asset_keys(plan.task_id, step) if kind == VERIFICATION]
    return step, key


def _row_results(instance: dg.DagsterInstance, key: dg.AssetKey, task_id: str, document: TaskDocument,
                 rows: list[str], replicates: int) -> list[EvaluationResult]:
    """Each row's (and replicate's) latest verification as a task result, in dataset order; unrun rows left out."""
    found = latest_replicates(instance, key, rows, replicates, ("passed", "prompt_error", "score", "results"))
    return [_result(f"{task_id}/{document.row_of(row)}", {k: v.value for k, v in found[(row, r)].items()})
            for row in rows for r in range(replicates) if (row, r) in found]


def _result(task_id: str, metadata: dict[str, Any]) -> EvaluationResult:
    passed = metadata.get("passed")
    status = (FinalStatus.ERROR if metadata.get("prompt_error") else
              FinalStatus.NOT_GRADED if passed is None else FinalStatus.SUCCESS if passed else FinalStatus.FAILURE)
    return EvaluationResult(task_id=task_id, final_status=status, weighted_score=metadata.get("score"),
                            success_criteria_results=metadata.get("results") or [])
