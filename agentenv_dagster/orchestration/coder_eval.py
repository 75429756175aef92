"""Run Coder Eval tasks through Dagster and write their reports (the CLI's ``run TASK.yaml...``).

A task's selected rows are one Dagster run per variant and replicate; each row's context becomes a
task.json record, summed up in run.json / run.md / task.html with upstream's exit code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import dagster as dg

from ..compiler import checked_plan, coder_eval_document, experiment_documents, step_registry
from ..config import AgentEnvConfig
from ..context import TaskStepContext
from ..errors import SpecError, TaskLoadError
from ..naming import job_name
from ..plan import TaskPlan
from ..reports.evaluation import evaluation_result
from ..reports.experiment import experiment_result
from ..reports.models import EvaluationResult, RunSummary, exit_code
from ..reports.render import WrittenReports, write_reports, write_suite, write_task_json
from ..reports.suite import suite_rollup
from ..runtime.artifacts import ObjectStore
from ..spec.coder_eval import (
    LoadedCoderEvalTask, TaskDefinition, load_coder_eval_experiment, load_coder_eval_task, load_dataset_rows,
)
from ..spec.coder_eval.dataset import SAMPLE_SEED, select_rows
from ..spec.coder_eval.variants import experiment_variants
from ..spec.loader import variant_key
from ..spec.coder_eval.lowering import PROMPT_ID, VERIFIER_ID
from .definitions import build_job
from .execute import execute_plan, opened_instance
from .progress import console_config, noted
from .rows import REPLICATE_TAG, UNPARTITIONED, VARIANT_TAG, rows_not_passed, task_graph_of
from .staleness import plan_asset_graph, stale_rows
from .step_events import REPORTS_TAG, REPORTS_TASK_TAG
from .suites import latest_row_results, suite_asset
from .translator import TaskTranslator


log = logging.getLogger("agentenv_dagster")


@dataclass
class CoderEvalRun:
    summary: RunSummary
    results: list[EvaluationResult]
    reports: WrittenReports
    suites: list[dict[str, Any]] = field(default_factory=list)  # a dataset's, one per variant
    notes: list[str] = field(default_factory=list)  # what was selected but did not run, and why
    run_ids: list[str] = field(default_factory=list)  # the Dagster runs it made (rows, suites)

    @property
    def exit_code(self) -> int:
        """Upstream's: 1 when a task failed or errored, or a suite gate fell short."""
        return 1 if any(not suite["passed"] for suite in self.suites) else exit_code(self.summary)

    def lines(self) -> list[str]:
        variants = len({r.variant_id for r in self.results}) > 1
        lines = [
            f"{r.final_status.icon} {f'[{r.variant_id}] ' if variants else ''}{r.task_id}: {r.final_status.value}"
            + (f" (score {r.weighted_score:.3f})" if r.weighted_score is not None else "")
            + (f" - {r.error_message}" if r.error_message else "")
            for r in self.results
        ]
        lines += [f"  skipped {s.path}: {s.reason}" for s in self.summary.skipped_tasks]
        lines += [f"  {note}" for note in self.notes]
        for suite in self.suites:
            variant = f" [{suite['variant_id']}]" if len(self.suites) > 1 else ""
            lines.append(f"  suite {suite['suite_id']}{variant}: {'passed' if suite['passed'] else 'FAILED'} "
                         f"(pass rate {suite['pass_rate']})")
            lines += [
                f"    {c['metric']} = {c['actual_value']} (min {c['min_value']}): {'ok' if c['passed'] else 'SHORT'}"
                for a in suite["criterion_aggregates"] for c in a["checks"]
            ]
        lines += [f"  reports: {self.reports.run_json.parent}  (run.json, run.md, task.html)"]
        return lines


def run_coder_eval_tasks(
    paths: Sequence[Path], config: AgentEnvConfig, *, overrides: Sequence[str] = (),
    grade_only_from: Path | None = None, output_dir: Path | None = None, instance: dg.DagsterInstance | None = None,
    split: str | None = None, sample: int | None = None, sample_seed: int = SAMPLE_SEED, experiment: Path | None = None,
    rows_in_flight: int | None = None, max_sandboxes: int | None = None, failed_only: bool = False,
    stale_only: bool = False, include_skipped: bool = False,
    on_warning: Callable[[str], None] | None = None,
) -> CoderEvalRun:
    """Every task x variant x replicate as one Dagster run over its selected rows (``rows_in_flight`` at a
    time), with one run.json (and experiment.json) for them all. ``failed_only`` / ``stale_only`` keep the
    rows that did not pass last time / whose assets Dagster shows stale or missing; ``skip: true`` tasks are
    reported as skipped unless ``include_skipped``; load warnings go to ``on_warning``. Raises
    ``TaskLoadError`` (a bad task, two tasks with one id) before anything runs."""
    tasks = [load_coder_eval_task(path) for path in paths]
    for warning in (w for t in tasks for w in t.warnings):
        (on_warning or log.warning)(warning)
    _refuse_shared_ids(tasks)
    started = _now()
    run_id = started.strftime("%Y-%m-%d_%H-%M-%S")
    out = output_dir or config.root / "out" / (job_name(tasks[0].task.task_id) if len(tasks) == 1 else run_id)
    skipped = [{"path": str(t.source), "reason": "skip: true"} for t in tasks if t.task.skip and not include_skipped]
    registry = step_registry(config)
    prepared = [  # every task resolved (variants, -D, rows) before any runs: a problem stops them all
        (loaded, _prepare(loaded, config, registry, instance, overrides=overrides, grade_only_from=grade_only_from,
                          split=split, sample=sample, sample_seed=sample_seed, experiment=experiment,
                          failed_only=failed_only, stale_only=stale_only))
        for loaded in tasks if include_skipped or not loaded.task.skip
    ]
    results: list[EvaluationResult] = []
    suites: list[dict[str, Any]] = []
    run_ids: list[str] = []
    for loaded, variants in prepared:
        task_results = _rows_runs(loaded, variants, config, out, instance, rows_in_flight=rows_in_flight,
                                  max_sandboxes=max_sandboxes, run_ids=run_ids)
        suites += _task_suites(loaded.task, variants, config, out, instance, task_results, run_ids)
        results += task_results
    summary = RunSummary.from_results(run_id, started, _now(), results, skipped=skipped)
    reports = write_reports(out, summary, results, task_jsons_written=True)
    if experiment is not None:
        definition = load_coder_eval_experiment(experiment).experiment
        report = experiment_result(definition.experiment_id, definition.description,
                                   [v.variant_id for v in definition.variants], results)
        (out / "experiment.json").write_text(json.dumps(report, indent=2, default=str))
        for variant_id, aggregate in report["variant_aggregates"].items():
            (out / variant_id).mkdir(parents=True, exist_ok=True)
            (out / variant_id / "variant.json").write_text(json.dumps(aggregate, indent=2))
    notes = [note for _, variants in prepared for v in variants for note in v.notes]
    return CoderEvalRun(summary, results, reports, suites, notes, run_ids)


def run_coder_eval_task(path: Path, config: AgentEnvConfig, **options: Any) -> CoderEvalRun:
    """One task file: :func:`run_coder_eval_tasks` of ``[path]``."""
    return run_coder_eval_tasks([path], config, **options)


def _refuse_shared_ids(tasks) -> None:
    """Two files with one task id would write over each other's results (upstream refuses too)."""
    first: dict[str, Path] = {}
    errors = []
    for t in tasks:
        if t.task.task_id in first:
            errors.append(SpecError(f"task id '{t.task.task_id}' is also the id of {first[t.task.task_id]}",
                                    file=str(t.source), field="task_id"))
        first.setdefault(t.task.task_id, t.source)
    if errors:
        raise TaskLoadError(errors)


@dataclass(frozen=True)
class _VariantRun:
    """A task under one variant (or as it is), resolved: its plan and the partitions it runs."""

    variant_id: str | None
    task: TaskDefinition
    repeats: int
    plan: TaskPlan
    keys: list[str] | None  # None: the task has no dataset
    kept: list[str] = field(default_factory=list)  # the selected rows not run again (--failed-only, --stale-only)
    notes: tuple[str, ...] = ()  # what of it does not run and why (and why the rest does, --stale-only)


def _prepare(
    loaded: LoadedCoderEvalTask, config: AgentEnvConfig, registry, instance: dg.DagsterInstance | None, *,
    overrides: Sequence[str], grade_only_from: Path | None, split: str | None, sample: int | None,
    sample_seed: int, experiment: Path | None, failed_only: bool, stale_only: bool,
) -> list[_VariantRun]:
    """Each variant's run (under an experiment, in its group's job), resolved without running anything."""
    documents = [] if experiment is None else experiment_documents(loaded, experiment, registry, overrides=overrides,
                                                                   grade_only_from=grade_only_from)
    # each variant's job under the experiment, as the code location groups them
    groups = {variant: plan for plan in map(checked_plan, documents) for variant in plan.document.variant_steps}
    variants = []
    for variant_id, resolved, repeats in experiment_variants(loaded.task, experiment, overrides):
        plan = groups.get(variant_id) or checked_plan(coder_eval_document(replace(loaded, task=resolved), registry,
                                                                          grade_only_from=grade_only_from))
        rows = _selected_rows(resolved, loaded.source, split, sample, sample_seed)
        # under an experiment's job, the partitions are this variant's rows (or the variant alone)
        keys = rows if not groups else [variant_key(r, variant_id) for r in rows] if rows is not None else [variant_id]
        kept: list[str] = []
        notes: list[str] = []
        label = f"{loaded.task.task_id}{f' [{variant_id}]' if variant_id else ''}"
        if failed_only and keys:
            with opened_instance(config, instance) as active:
                again = rows_not_passed(active, task_graph_of(build_job(plan)), keys)
            keys, kept = again, [k for k in keys if k not in again]
            if not keys:
                notes.append(f"{label}: all {len(kept)} selected rows passed last time; none runs again "
                             "(--failed-only)")
        if stale_only and keys != []:
            keys, fresh, said = _stale_only(plan, config, instance, keys, label)
            kept += fresh
            notes += said
        variants.append(_VariantRun(variant_id, resolved, repeats, plan, keys, kept, tuple(notes)))
    return variants


def _stale_only(plan: TaskPlan, config: AgentEnvConfig, instance: dg.DagsterInstance | None, keys: list[str] | None,
                label: str) -> tuple[list[str] | None, list[str], list[str]]:
    """Of ``keys`` (None: no rows), those whose assets are stale or missing, the fresh ones, and notes of both."""
    with opened_instance(config, instance) as active:
        found = stale_rows(active, plan_asset_graph(plan, config), plan, keys if keys is not None else [UNPARTITIONED])
    if keys is None:
        if not found.stale:
            return [], [], [f"skipped {label}: fresh, each of its scores is current (--stale-only)"]
        return None, [], [f"{label} is stale: {found.summary()}"]
    fresh = [k for k in keys if k not in found.stale]
    notes = [f"skipped {len(fresh)} fresh row(s) of {label} (--stale-only): {', '.join(fresh[:10])}"
             + (" ..." if len(fresh) > 10 else "")] if fresh else []
    notes += [f"{label}: {len(found.stale)} stale row(s): {found.summary()}"] if found.stale else []
    return [k for k in keys if k in found.stale], fresh, notes


def _task_suites(task: TaskDefinition, variants: list[_VariantRun], config: AgentEnvConfig, out: Path,
                 instance: dg.DagsterInstance | None, results: list[EvaluationResult],
                 run_ids: list[str]) -> list[dict[str, Any]]:
    """A dataset task's suites from its ``results``, one per variant (upstream's ``<variant>/<suite_id>``), and
    once rows ran (``--failed-only`` may run none) its suite asset materialized, the runs added to ``run_ids``."""
    if task.dataset is None:
        return []
    if any(v.keys for v in variants):
        run_ids += _materialize_suites(variants, config, instance)
    suites = []
    for variant in variants:
        variant_id = variant.variant_id or "default"
        thresholds = [getattr(c, "suite_thresholds", None) for c in variant.task.success_criteria]
        rows = [r for r in results if r.variant_id == variant_id]
        if variant.kept:  # the rows not run again count as they last ran (the suite asset's view)
            with opened_instance(config, instance) as active:
                kept = latest_row_results(variant.plan, active, variant.kept, task.task_id, variant.variant_id)
            # in the order of the dataset's partitions (replicates of a row together)
            position = {f"{task.task_id}/{variant.plan.document.row_of(k)}": i
                        for i, k in enumerate(variant.plan.document.partitions)}
            rows = sorted(kept + rows, key=lambda r: position.get(r.task_id, len(position)))
        suite = suite_rollup(task.task_id, rows, thresholds, variant_id)
        write_suite(out / variant_id / task.task_id, suite)
        suites.append(suite)
    return suites


def _rows_runs(
    loaded: LoadedCoderEvalTask, variants: list[_VariantRun], config: AgentEnvConfig, out: Path,
    instance: dg.DagsterInstance | None, *, rows_in_flight: int | None, max_sandboxes: int | None, run_ids: list[str],
) -> list[EvaluationResult]:
    """Each variant's and replicate's rows run, each row's task.json written; the runs added to ``run_ids``."""
    task, path = loaded.task, loaded.source
    results = []
    for variant in variants:
        keys, repeats, row_of = variant.keys, variant.repeats, variant.plan.document.row_of
        fields = {  # the same for each of the variant's rows
            "description": task.description, "agent_type": variant.task.agent.type if variant.task.agent else "none",
            "resolved_task": variant.task.model_dump(mode="json", exclude_none=True), "source_file": str(path),
            "prices": config.model.prices, "variant_id": variant.variant_id or "default",
        }
        for replicate in range(repeats if keys != [] else 0):  # selected rows: one run, a partition each
            label = "/".join(p for p in (variant.variant_id, str(replicate) if repeats > 1 else None) if p)
            tags = {VARIANT_TAG: variant.variant_id or "default", REPLICATE_TAG: str(replicate),
                    # where its rows' pages go: their verifications link them
                    REPORTS_TAG: str(out.resolve()), REPORTS_TASK_TAG: task.task_id}
            done = execute_plan(variant.plan, config, instance=instance, partition_keys=keys or None,
                                rows_in_flight=rows_in_flight, max_sandboxes=max_sandboxes, tags=tags,
                                output_dir=out / "contexts" / job_name(task.task_id) / (label or "task"))
            run_ids.append(done.run_id)
            # a dataset row's task id is ``<task_id>/<row_id>``, as upstream names its row-tasks
            results += [_row_result(out, done.contexts[key], replicate_index=replicate, **fields,
                                    task_id="/".join(filter(None, (task.task_id, row_of(key)))))
                        for key in keys or [""] if key in done.contexts]
    return results


def _row_result(out: Path, context: TaskStepContext, **fields: Any) -> EvaluationResult:
    """A row's finished context as its task.json record, written."""
    started, completed = _span(context)
    response = context.find_prompt_response(PROMPT_ID)
    url = response.agent_trajectory_object_url if response else None
    result = evaluation_result(context, started=started, completed=completed, verifier_id=VERIFIER_ID,
                               prompt_id=PROMPT_ID, trajectory=json.loads(ObjectStore.read(url)) if url else None,
                               **fields)
    write_task_json(out, result)
    return result


def _materialize_suites(variants: list[_VariantRun], config: AgentEnvConfig,
                        instance: dg.DagsterInstance | None) -> list[str]:
    """Materialize the suite asset of each job the task's variants ran in (under an experiment, their partitions)
    as the UI would, so the instance holds the same rollup and threshold checks as the run's suite.json files."""
    run_ids = []
    for task_id in dict.fromkeys(v.plan.task_id for v in variants):  # each job the variants ran in, once
        group = [v for v in variants if v.plan.task_id == task_id]
        asset = suite_asset(group[0].plan, TaskTranslator(), config.regression.for_task(task_id))
        if asset is None:
            continue
        with opened_instance(config, instance) as active:
            for variant_id in [v.variant_id for v in group]:  # None: the task alone, its asset unpartitioned
                done = dg.materialize([asset], instance=active, raise_on_error=False, partition_key=variant_id,
                                      run_config=console_config())
                noted(active, done.run_id, asset.key.to_user_string() + (f" [{variant_id}]" if variant_id else ""))
                run_ids.append(done.run_id)
    return run_ids


def _selected_rows(task, path: Path, split: str | None, sample: int | None, sample_seed: int) -> list[str] | None:
    if task.dataset is None:
        return None
    rows = load_dataset_rows(task.dataset, path.parent.resolve())
    chosen, _ = select_rows(rows, task.dataset, split=split, sample=sample, seed=sample_seed)
    return [str(row[task.dataset.id_field]) for row in chosen]


def _span(context) -> tuple[datetime, datetime]:
    """When the row's first step started and its last one ended (its steps' timings)."""
    timings = [t for t in (context.metadata.get("step_timings") or {}).values() if "duration_seconds" in t]
    if not timings:
        return _now(), _now()
    starts = [datetime.fromisoformat(t["started_at_utc"]) for t in timings]
    ends = [s + timedelta(seconds=t["duration_seconds"]) for s, t in zip(starts, timings)]
    return min(starts), max(ends)


def _now() -> datetime:
    return datetime.now(timezone.utc)

