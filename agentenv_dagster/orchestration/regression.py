"""The regression gate (``[regression]`` in ``.agentenv/config.toml``): the asset check ``no_regression`` of
every verification asset and suite. A score fails it when more than ``max_drop`` below the median of the
``window`` earlier scores of its asset and partition (no baseline under ``min_history``: it passes); earlier
scores of any code version count unless ``same_code_version``, since a change of agent, model or judge that
costs score is what the gate is for."""

from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass
from typing import Any

import dagster as dg

from ..config import RegressionSettings
from ..plan import TaskPlan
from ..steps.base import VERIFICATION, TaskStep
from .dagster_internals import CODE_VERSION_TAG, run_check_evaluations
from .rows import REGRESSION_TAG
from .translator import TaskTranslator

REGRESSION_CHECK = "no_regression"
SCORE = "score"
SUITE_TABLE_COLUMNS = (("metric", "string"), ("value", "float"), ("baseline_median", "float"), ("drop", "float"),
                       ("regressed", "bool"))
PAGES = 20  # pages of earlier materializations a baseline reads at most (other code versions, ungraded skipped)


def regression_tag(settings: RegressionSettings) -> dict[str, str]:
    """A verifier node's tag: its task's gate, which its op evaluates."""
    return {REGRESSION_TAG: settings.model_dump_json()}


def node_regression(assets: dict[str, Any]) -> RegressionSettings | None:
    """The gate of a verifier node, from its ``rows.node_assets`` (None: no gate)."""
    return RegressionSettings.model_validate_json(raw) if (raw := assets.get("regression")) else None


def produces_verification(translator: TaskTranslator, plan: TaskPlan, step: TaskStep) -> bool:
    return any(kind == VERIFICATION for kind, _, _ in translator.produced_asset_keys(plan.task_id, step))


def regression_check_specs(plan: TaskPlan, translator: TaskTranslator,
                           settings: RegressionSettings) -> list[dg.AssetCheckSpec]:
    """``no_regression`` on each verification asset of the task, partitioned as it is."""
    if not settings.enabled:
        return []
    partitions = translator.get_partitions_def(plan)
    scope = "of its code version" if settings.same_code_version else "of any code version"
    description = (f"The score is at most {settings.max_drop:g} below the median of the last {settings.window} "
                   f"earlier scores {scope} (of the same partition); passes with fewer than {settings.min_history}.")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)  # partitioned checks (see get_check_specs)
        return [dg.AssetCheckSpec(REGRESSION_CHECK, asset=key, description=description, blocking=settings.blocking,
                                  partitions_def=partitions)
                for step in plan.steps
                for kind, _, key in translator.produced_asset_keys(plan.task_id, step) if kind == VERIFICATION]


@dataclass(frozen=True)
class Comparison:
    """One metric (a verification's score, a suite's pass rate ...) against its baseline."""

    metric: str
    value: float
    earlier: tuple[float, ...]  # newest first
    settings: RegressionSettings

    @property
    def baseline(self) -> float | None:
        """The median of the earlier values; None while there are fewer than ``min_history``."""
        return statistics.median(self.earlier) if len(self.earlier) >= self.settings.min_history else None

    @property
    def drop(self) -> float | None:
        return None if self.baseline is None else round(self.baseline - self.value, 6)

    @property
    def regressed(self) -> bool:
        return self.drop is not None and self.drop > self.settings.max_drop

    def __str__(self) -> str:
        if self.baseline is None:
            return f"{self.metric} {self.value:.3f}: no baseline yet ({len(self.earlier)} earlier, needs " \
                   f"{self.settings.min_history})"
        verdict = f"{self.drop:.3f} below" if self.drop > 0 else "not below"
        return (f"{self.metric} {self.value:.3f} is {verdict} the median {self.baseline:.3f} of the last "
                f"{len(self.earlier)} (max_drop {self.settings.max_drop:g})")


def earlier_values(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, metrics: list[str],
                   settings: RegressionSettings, *, judged_run: str | None, code_version: str | None,
                   newest: tuple[list[dg.EventLogRecord], bool] | None = None) -> list[tuple[str, dict[str, float]]]:
    """(run id, values) of the latest ``window`` earlier materializations of ``key`` and ``partition`` with one of
    ``metrics`` as a number, newest first; ``newest``: records read already and whether they are all there is."""
    found: list[tuple[str, dict[str, float]]] = []

    def take(records: list[dg.EventLogRecord]) -> bool:
        for record in records:
            materialization = record.asset_materialization
            if record.run_id == judged_run or materialization is None or (
                    settings.same_code_version and (materialization.tags or {}).get(CODE_VERSION_TAG) != code_version):
                continue
            values = {m: number for m in metrics if (number := _number(materialization.metadata.get(m))) is not None}
            if values:
                found.append((record.run_id, values))
                if len(found) == settings.window:
                    return True
        return False

    most = PAGES * settings.window
    if newest is not None:
        records, all_of_them = newest
        if take(records[:most]) or all_of_them or len(records) >= most:
            return found
        found.clear()
    records_filter = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    cursor = None
    for _ in range(PAGES):
        page = instance.fetch_materializations(records_filter, limit=settings.window, cursor=cursor)
        if take(page.records) or not page.has_more:
            break
        cursor = page.cursor
    return found


def compare(values: dict[str, float], earlier: list[tuple[str, dict[str, float]]],
            settings: RegressionSettings) -> list[Comparison]:
    return [Comparison(metric, value, tuple(v[metric] for _, v in earlier if metric in v), settings)
            for metric, value in values.items()]


def score_evaluation(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, score: float | None,
    settings: RegressionSettings, *, judged_run: str | None, code_version: str | None,
    target: Any = None, newest: tuple[list[dg.EventLogRecord], bool] | None = None,
) -> dg.AssetCheckEvaluation:
    """A verification's ``no_regression`` evaluation of ``score`` (None: not graded, which passes)."""
    common = {"asset_key": key, "check_name": REGRESSION_CHECK, "partition": partition,
              "target_materialization_data": target, "blocking": settings.blocking}
    if score is None:
        return dg.AssetCheckEvaluation(**common, passed=True, description="not graded: no score to compare",
                                       metadata={"baseline": "not graded: no score to compare"})
    earlier = earlier_values(instance, key, partition, [SCORE], settings, judged_run=judged_run,
                             code_version=code_version, newest=newest)
    (comparison,) = compare({SCORE: score}, earlier, settings)
    metadata: dict[str, Any] = {
        "score": score, "window": settings.window, "max_drop": settings.max_drop,
        "baseline_scores": dg.MetadataValue.json(list(comparison.earlier)),
        "baseline_runs": dg.MetadataValue.json([run for run, _ in earlier])}
    if comparison.baseline is None:
        metadata["baseline"] = (f"no baseline yet ({len(comparison.earlier)} earlier score(s), "
                                f"needs {settings.min_history})")
    else:
        metadata.update(baseline_median=comparison.baseline, drop=comparison.drop)
    return dg.AssetCheckEvaluation(**common, passed=not comparison.regressed, metadata=metadata,
                                   description=str(comparison), severity=dg.AssetCheckSeverity.ERROR)


def suite_check_result(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None, metrics: dict[str, float],
                       settings: RegressionSettings) -> dg.AssetCheckResult:
    """A suite's ``no_regression`` result, from its asset's body (the new materialization is not stored yet)."""
    earlier = earlier_values(instance, key, partition, list(metrics), settings, judged_run=None, code_version=None)
    comparisons = compare(metrics, earlier, settings)
    regressed = [c for c in comparisons if c.regressed]
    rows = [dg.TableRecord({"metric": c.metric, "value": c.value, "baseline_median": c.baseline, "drop": c.drop,
                            "regressed": c.regressed}) for c in comparisons]
    return dg.AssetCheckResult(
        check_name=REGRESSION_CHECK, passed=not regressed, severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(map(str, regressed)) or f"no metric more than {settings.max_drop:g} below its baseline",
        metadata={
            "metrics": dg.MetadataValue.table(rows, schema=dg.TableSchema(
                columns=[dg.TableColumn(name, kind) for name, kind in SUITE_TABLE_COLUMNS])),
            "regressed": dg.MetadataValue.json([c.metric for c in regressed]),
            "baseline_runs": dg.MetadataValue.json([run for run, _ in earlier]),
            "window": settings.window, "max_drop": settings.max_drop,
        })


def suite_check_spec(key: dg.AssetKey, settings: RegressionSettings) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(REGRESSION_CHECK, asset=key, blocking=settings.blocking,
                             description=f"Each suite metric (pass rate, average score, the gated metrics) "
                                         f"is at most {settings.max_drop:g} below the median of its last "
                                         f"{settings.window} earlier values.")


def run_regressions(instance: dg.DagsterInstance, run_ids: list[str]) -> list[str]:
    """The failed ``no_regression`` checks of the runs, as the CLI reports them."""
    return [f"regression: {e.asset_key.to_user_string()}{f' [{e.partition}]' if e.partition else ''}: "
            f"{e.description or 'regressed'}"
            for run_id in run_ids for e in run_check_evaluations(instance, run_id)
            if e.check_name == REGRESSION_CHECK and not e.passed]


def _number(value: Any) -> float | None:
    value = getattr(value, "value", value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None  # NaN is no score

