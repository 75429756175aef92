"""``agentenv-dagster``: validate task documents, run them through Dagster, version them.

Exit codes: 0 success, 1 the run failed (or a document is invalid, for ``validate``),
2 bad input (unreadable or invalid task for ``run``, bad options).
"""

from __future__ import annotations

import glob
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from .compiler import compile_paths, discover, load_plan, step_registry
from .config import AgentEnvConfig, ConfigError, load_config
from .errors import SpecError, TaskLoadError
from .ids import check_id
from .plan import TaskPlan
from .spec.coder_eval.loader import YAML_SUFFIXES, coder_eval_kind
from .spec.store import TaskStore

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


@click.group()
def main() -> None:
    """Compile agent-env task documents into Dagster jobs and run them."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
def validate(paths: tuple[Path, ...]) -> None:
    """Exit 0 when every document under PATHS is valid; else one line per problem."""
    config = _config()
    files = [f for p in paths for f in (discover(p) if p.is_dir() else [p])]
    report = _load_or_exit(lambda: compile_paths(files, config))
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for error in report.errors:
        click.echo(str(error))
    if not report.errors:
        click.echo(f"{len(report.plans)} task document(s) valid")
    sys.exit(EXIT_FAILED if report.errors else EXIT_OK)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--output-dir", type=click.Path(path_type=Path), help="where the context / reports are written")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="agent-env: a value in the initial context (-D metadata.seed.name=acme); "
              "Coder Eval: a task override (-D run_limits.max_turns=30)")
@click.option("--grade-only", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Coder Eval: grade this finished workspace; no agent runs")
@click.option("--split", help="Coder Eval dataset: only the rows of this split")
@click.option("--sample", type=int, help="Coder Eval dataset: N rows drawn uniformly (seed 0)")
@click.option("--experiment", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Coder Eval: run every variant of this experiment (its folder's default.yaml is the base layer)")
@click.option("--rows-in-flight", type=click.IntRange(min=1), default=32, show_default=True,
              help="Coder Eval dataset: rows whose step runs at the same time")
@click.option("--failed-only", is_flag=True,
              help="Coder Eval dataset: only the rows that did not pass last time (failed partitions, "
              "unreached or failing verifications); Dagster's run tag agentenv/rows=failed does the same")
@click.option("--include-skipped", is_flag=True, help="Coder Eval: run the tasks marked skip: true too")
def run(paths: tuple[Path, ...], output_dir: Path | None, defines: tuple[str, ...], grade_only: Path | None,
        split: str | None, sample: int | None, experiment: Path | None, rows_in_flight: int,
        failed_only: bool, include_skipped: bool) -> None:
    """Compile each PATH and execute it through Dagster. An agent-env task (one JSON file)
    writes its final redacted context.json; Coder Eval tasks (YAML files, or folders of them:
    every task under each) write one run.json, run.md, task.html for all of them."""
    config = _config()
    if all(path.is_dir() or path.suffix.lower() in YAML_SUFFIXES for path in paths):
        from .orchestration.coder_eval import run_coder_eval_tasks  # Dagster only when running

        tasks = _coder_eval_tasks(paths)
        if grade_only and len(tasks) > 1:
            _bad_input(f"--grade-only grades one task's workspace; {len(tasks)} tasks were given")
        done = _load_or_exit(lambda: run_coder_eval_tasks(
            tasks, config, overrides=defines, grade_only_from=grade_only, output_dir=output_dir,
            split=split, sample=sample, experiment=experiment, rows_in_flight=rows_in_flight,
            failed_only=failed_only, include_skipped=include_skipped,
            on_warning=lambda warning: click.echo(f"warning: {warning}", err=True)))
        click.echo("\n".join(done.lines()))
        sys.exit(done.exit_code)
    if len(paths) > 1:
        _bad_input("an agent-env task document runs alone: give one JSON file (several paths are for Coder Eval tasks)")
    path = paths[0]
    plan = _load_or_exit(lambda: load_plan(path, config))
    initial = _defines_to_context(defines)
    sys.exit(_execute(plan, config, output_dir, initial))


@main.group()
def task() -> None:
    """The versioned task store: create versions, run (a slice of) one."""


@task.command("create")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--id", "task_id", required=True, help="the task id to store under")
def task_create(file: Path, task_id: str) -> None:
    """Validate FILE and store it as a new version of task ID (never overwrites)."""
    config = _config()
    _load_or_exit(lambda: check_id(task_id, "--id"))  # it names the task's folder in the store
    plan = _load_or_exit(lambda: load_plan(file, config))
    version = TaskStore(config.state_dir / "tasks").put(task_id, plan.document)
    click.echo(f"Created task '{task_id}' version {version}")


@task.command("run")
@click.option("--id", "task_id", required=True)
@click.option("--version", type=int, default=None, help="default: the latest")
@click.option("--start-step", type=int, default=0, help="0-based; earlier steps count as done")
@click.option("--end-step", type=int, default=None, help="exclusive")
@click.option("--context", "context_file", type=click.Path(exists=True, path_type=Path),
              help="a saved context.json to start from (re-grading without redeploying)")
@click.option("--output-dir", type=click.Path(path_type=Path))
def task_run(task_id: str, version: int | None, start_step: int, end_step: int | None,
             context_file: Path | None, output_dir: Path | None) -> None:
    """Run a stored task, or the slice [start-step, end-step) of it, through Dagster."""
    config = _config()
    store = TaskStore(config.state_dir / "tasks")
    initial = json.loads(context_file.read_text()) if context_file else {}

    def load() -> TaskPlan:
        plan = TaskPlan(store.get(task_id, version, step_registry(config)))
        if start_step or end_step is not None:
            plan = plan.slice(start_step, end_step, given_names=context_names(initial))
        errors = plan.join_errors()
        if errors:
            raise TaskLoadError(errors)
        return plan

    plan = _load_or_exit(load)
    sys.exit(_execute(plan, config, output_dir, initial))


@main.command()
@click.argument("run_id")
@click.argument("decision", required=False, type=click.Choice(["approve", "reject", "continue", "abort"]))
@click.option("--step", "step_id", help="the review step (default: the one awaiting a decision)")
@click.option("--instance", "instance_id", help="one row (task instance) only; default: every row of the step")
@click.option("--note", help="why: recorded in the run's context with the decision")
@click.option("--by", "decided_by", help="who decides (default: the user name)")
def review(run_id: str, decision: str | None, step_id: str | None, instance_id: str | None,
           note: str | None, decided_by: str | None) -> None:
    """Approve or reject a `review` step of run RUN_ID (a unique prefix will do); without a
    decision, list the reviews awaiting one."""
    import getpass

    from .runtime.review import ReviewError, RunReviews, find_run_dir

    config = _config()
    try:
        reviews = RunReviews.of_run(find_run_dir(config.state_dir / "runs", run_id))
        if decision is None:
            waiting = reviews.awaiting()
            for record in waiting:
                click.echo(json.dumps(record, indent=2))
            click.echo(f"{len(waiting)} review(s) awaiting a decision")
            return
        try:
            decided_by = decided_by or getpass.getuser()
        except (KeyError, OSError):  # no user name in this environment
            decided_by = "cli"
        record = reviews.decide(decision, step_id=step_id, instance_id=instance_id, note=note,
                                decided_by=decided_by)
    except ReviewError as exc:
        _bad_input(str(exc))
    click.echo(f"review '{record['step_id']}': {record['decision']} ({record['decided_by']})")


def context_names(data: dict[str, Any]) -> set[tuple[str, str]]:
    """The names a saved context already provides to a sliced run."""
    names = {("env", e.get("env_id")) for e in data.get("deployed_envs") or []}
    names |= {("agent", a.get("agent_name")) for a in data.get("deployed_agents") or []}
    names |= {("sandbox", s.get("sandbox_name")) for s in data.get("deployed_sandboxes") or []}
    names |= {("prompt", p.get("prompt_id")) for p in data.get("prompt_responses") or []}
    metadata = data.get("metadata") or {}
    names |= {("verification", v) for v in metadata.get("verifications") or {}}
    names |= {("producer", s) for s in metadata.get("collected_artifacts") or {}}
    return names


def _execute(plan: TaskPlan, config: AgentEnvConfig, output_dir: Path | None, initial: dict) -> int:
    from .orchestration.execute import execute_plan  # Dagster only when running

    result = execute_plan(plan, config, initial_context=initial, output_dir=output_dir)
    click.echo(result.summary())
    return EXIT_OK if result.success else EXIT_FAILED


def _config() -> AgentEnvConfig:
    try:
        return load_config()
    except ConfigError as exc:
        _bad_input(str(exc))


def _coder_eval_tasks(paths: tuple[Path, ...]) -> list[Path]:
    """The task files PATHS name, once each: a file, a folder (every Coder Eval task under it)
    or a quoted glob pattern (``'tasks/**/*.yaml'``). A path that names none ends the run with
    exit 1, as upstream's unmatched task pattern does."""
    files: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        if path.is_dir():
            found = [p for p in sorted(path.rglob("*")) if coder_eval_kind(p) == "task"]
        elif path.is_file():
            found = [path]
        else:
            found = [Path(p) for p in sorted(glob.glob(str(path), recursive=True)) if coder_eval_kind(p) == "task"]
        if not found:
            click.echo(f"error: {path}: no Coder Eval task {'under it' if path.is_dir() else 'there'}", err=True)
            sys.exit(EXIT_FAILED)
        for file in found:
            if (resolved := file.resolve()) not in seen:
                seen.add(resolved)
                files.append(file)
    return files


def _bad_input(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _load_or_exit(load):
    try:
        return load()
    except TaskLoadError as exc:
        for error in exc.errors:
            click.echo(str(error), err=True)
    except (SpecError, ConfigError, LookupError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
    sys.exit(EXIT_BAD_INPUT)


def _defines_to_context(defines: tuple[str, ...]) -> dict[str, Any]:
    context: dict[str, Any] = {}
    for define in defines:
        key, sep, raw = define.partition("=")
        if not sep or not key:
            _bad_input(f"-D expects KEY=VALUE, got {define!r}")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        target = context
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    return context


if __name__ == "__main__":  # pragma: no cover
    main()
