"""``agentenv-dagster``: validate task documents, run them through Dagster, version them.

Exit codes: 0 success, 1 the run failed (or a document is invalid, for ``validate``),
2 bad input (a path that does not exist, an unreadable or invalid task for ``run``, bad
options). Documents are read within the limits of ``docs/input-limits.md``.
"""

from __future__ import annotations

import glob
import json
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from .compiler import CompileReport, compile_paths, discover, load_extensions, load_plan, step_registry
from .config import AgentEnvConfig, ConfigError, load_config
from .context import TaskStepContext
from .errors import SpecError, TaskLoadError
from .ids import check_id
from .plan import TaskPlan
from .spec.coder_eval.base import describe_errors
from .spec.coder_eval.loader import YAML_SUFFIXES, coder_eval_kind
from .spec.documents import check_values, load_json
from .spec.store import TaskStore

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


@click.group()
@click.version_option(package_name="agentenv-dagster", prog_name="agentenv-dagster")
def main() -> None:
    """Compile agent-env task documents into Dagster jobs and run them."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--format", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON document (files, errors with file/line/step/field/message, warnings) on stdout")
def validate(paths: tuple[Path, ...], output_format: str) -> None:
    """Exit 0 when every document under PATHS is valid; else one line per problem."""
    config = _config()
    files = [f for p in paths for f in (discover(p) if p.is_dir() else [p])]
    report = _load_or_exit(lambda: compile_paths(files, config))
    if output_format == "json":
        click.echo(json.dumps(_validation_document(files, report), indent=2))
    else:
        _echo_validation(report)
    sys.exit(EXIT_FAILED if report.errors else EXIT_OK)


def _echo_validation(report: CompileReport) -> None:
    for warning in report.warnings:
        click.echo(f"warning: {warning}", err=True)
    for error in report.errors:
        click.echo(str(error))
    if not report.errors:
        click.echo(f"{len(report.plans)} task document(s) valid")


def _validation_document(files: list[Path], report: CompileReport) -> dict[str, Any]:
    """What ``validate --format json`` prints: for CI annotations and editors."""
    return {"files": [str(f) for f in files], "valid": len(report.plans),
            "errors": [error.to_dict() for error in report.errors], "warnings": list(report.warnings)}


def _output_options(command):
    """``--verbose`` / ``--quiet``: what a run shows while it goes on (docs/getting-started.md)."""
    command = click.option("-q", "--quiet", is_flag=True,
                           help="no progress and no Dagster event lines: only the summary (for scripts)")(command)
    return click.option("-v", "--verbose", is_flag=True,
                        help="Dagster's event lines on the console (as `dagster` prints them) instead of the "
                        "progress display")(command)


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--output-dir", type=click.Path(path_type=Path), help="where the context / reports are written")
@click.option("-D", "defines", multiple=True, metavar="KEY=VALUE",
              help="agent-env: a value in the initial context (-D metadata.seed.name=acme); "
              "Coder Eval: a task override (-D run_limits.max_turns=30)")
@click.option("--grade-only", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Coder Eval: grade this finished workspace; no agent runs")
@click.option("--split", help="Coder Eval dataset: only the rows of this split")
@click.option("--sample", type=click.IntRange(min=1), help="Coder Eval dataset: N rows drawn uniformly (see --seed)")
@click.option("--seed", type=int, default=0, show_default=True, help="Coder Eval dataset: the seed of the --sample draw")
@click.option("--experiment", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Coder Eval: run every variant of this experiment (its folder's default.yaml is the base layer)")
@click.option("--rows-in-flight", type=click.IntRange(min=1), default=32, show_default=True,
              help="Coder Eval dataset: rows whose step runs at the same time, in each step")
@click.option("--max-sandboxes", type=click.IntRange(min=1), default=None,
              help="Coder Eval dataset: rows holding their sandbox, container and agent at once (a row "
              "releases them as it leaves the run) [default: the task's dataset.max_sandboxes, else twice --rows-in-flight]")
@click.option("--failed-only", is_flag=True,
              help="Coder Eval dataset: only the rows that did not pass last time (failed partitions, "
              "unreached or failing verifications); Dagster's run tag agentenv/rows=failed does the same")
@click.option("--stale-only", is_flag=True,
              help="only the tasks, and of a dataset the rows, whose scores Dagster shows stale (a changed "
              "task, agent, model, judge or upstream artifact) or that were never materialized; says which it "
              "skipped and why")
@click.option("--fail-on-regression", is_flag=True,
              help="exit 1 when a no_regression check failed: a score more than [regression] max_drop below "
              "the median of its earlier ones")
@click.option("--include-skipped", is_flag=True, help="Coder Eval: run the tasks marked skip: true too")
@click.option("--junit", type=click.Path(dir_okay=False, path_type=Path),
              help="Coder Eval: also write the results as JUnit XML to this file, for CI")
@_output_options
def run(paths: tuple[Path, ...], output_dir: Path | None, defines: tuple[str, ...], grade_only: Path | None,
        split: str | None, sample: int | None, seed: int, experiment: Path | None, rows_in_flight: int,
        max_sandboxes: int | None, failed_only: bool, stale_only: bool, fail_on_regression: bool,
        include_skipped: bool, junit: Path | None, verbose: bool, quiet: bool) -> None:
    """Compile each PATH and execute it through Dagster. An agent-env task (one JSON file)
    writes its final redacted context.json; Coder Eval tasks (YAML files, or folders of them:
    every task under each) write one run.json, run.md, task.html for all of them.

    While it runs: on a terminal, a live display of each run's rows (done, passed, failed,
    errored), the steps running, elapsed time and ETA; elsewhere, a line now and then (both on
    stderr). At the end: the results, a `regression:` line for each score that regressed
    (exit 1 with --fail-on-regression), and each Dagster run's address in the UI."""
    config = _config()
    if verbose and quiet:
        _bad_input("--verbose and --quiet: choose one")
    if all(path.is_dir() or path.suffix.lower() in YAML_SUFFIXES for path in paths):
        from .orchestration.coder_eval import run_coder_eval_tasks  # Dagster only when running

        tasks = _coder_eval_tasks(paths)
        if grade_only and len(tasks) > 1:
            _bad_input(f"--grade-only grades one task's workspace; {len(tasks)} tasks were given")
        with _progress(verbose, quiet) as progress:
            done = _load_or_exit(lambda: run_coder_eval_tasks(
                tasks, config, overrides=defines, grade_only_from=grade_only, output_dir=output_dir,
                split=split, sample=sample, sample_seed=seed, experiment=experiment, rows_in_flight=rows_in_flight,
                max_sandboxes=max_sandboxes,
                failed_only=failed_only, stale_only=stale_only, include_skipped=include_skipped,
                on_warning=lambda warning: click.echo(f"warning: {warning}", err=True)))
        click.echo("\n".join(done.lines()))
        click.echo(f"  view:    agentenv-dagster view {done.reports.run_json.parent}")
        regressed = _echo_regressions(config, done.run_ids)
        if junit is not None:
            from .reports.junit import write_junit

            write_junit(junit, done.summary, done.results, done.suites, done.reports.run_json.parent)
            click.echo(f"  junit: {junit}")
        _echo_lines(progress.summary_lines())
        sys.exit(done.exit_code or (EXIT_FAILED if regressed and fail_on_regression else EXIT_OK))
    if junit is not None:
        _bad_input("--junit is for Coder Eval tasks (YAML): an agent-env task writes its context.json")
    if len(paths) > 1:
        _bad_input("an agent-env task document runs alone: give one JSON file (several paths are for Coder Eval tasks)")
    path = paths[0]
    plan = _load_or_exit(lambda: load_plan(path, config))
    initial = _defines_to_context(defines)
    if stale_only and _fresh(plan, config, path):
        sys.exit(EXIT_OK)
    sys.exit(_execute(plan, config, output_dir, initial, verbose=verbose, quiet=quiet,
                      fail_on_regression=fail_on_regression))


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
@_output_options
def task_run(task_id: str, version: int | None, start_step: int, end_step: int | None,
             context_file: Path | None, output_dir: Path | None, verbose: bool, quiet: bool) -> None:
    """Run a stored task, or the slice [start-step, end-step) of it, through Dagster (shown as
    ``run`` shows it)."""
    config = _config()
    if verbose and quiet:
        _bad_input("--verbose and --quiet: choose one")
    store = TaskStore(config.state_dir / "tasks")
    initial = _saved_context(context_file) if context_file else {}

    def load() -> TaskPlan:
        plan = TaskPlan(store.get(task_id, version, step_registry(config)))
        if start_step or end_step is not None:
            plan = plan.slice(start_step, end_step, given_names=context_names(initial))
        errors = plan.join_errors()
        if errors:
            raise TaskLoadError(errors)
        return plan

    plan = _load_or_exit(load)
    sys.exit(_execute(plan, config, output_dir, initial, verbose=verbose, quiet=quiet))


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


@main.command()
@click.argument("out_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--port", type=click.IntRange(0, 65535), default=0, show_default="a free one")
def view(out_dir: Path | None, port: int) -> None:
    """Serve a run's reports on 127.0.0.1 until Ctrl-C: task.html (every row, a filter for
    the failed ones, the variants side by side) and each row's page (its trajectory and the
    grading). OUT_DIR is a run's --output-dir; by default the project's out/ (every run)."""
    from .reports.viewer import ReportServer

    folder = out_dir or _config().root / "out"
    if not folder.is_dir():
        _bad_input(f"{folder}: no such folder (give the --output-dir of a run)")
    try:
        server = ReportServer(folder, port)
    except OSError as exc:
        _bad_input(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}")
    click.echo(f"Serving {folder} at {server.url} (Ctrl-C to stop)")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where it started ignored (`... &`)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped")
    finally:
        server.server_close()


def _saved_context(path: Path) -> dict[str, Any]:
    """A saved context.json for ``task run --context``, read within the input limits and
    checked against the context's shape; a problem ends the command with exit 2."""
    try:
        data = load_json(path)
    except SpecError as exc:
        _bad_input(str(exc))
    if not isinstance(data, dict):
        _bad_input(f"{path}: a saved context is a JSON object, got {type(data).__name__}")
    try:
        TaskStepContext.from_dict(data)
    except ValidationError as exc:
        for error in describe_errors(exc, TaskStepContext):
            click.echo(f"error: {error.located(str(path))}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    return data


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


def _execute(plan: TaskPlan, config: AgentEnvConfig, output_dir: Path | None, initial: dict, *,
             verbose: bool, quiet: bool, fail_on_regression: bool = False) -> int:
    from .orchestration.execute import execute_plan  # Dagster only when running

    with _progress(verbose, quiet) as progress:
        result = execute_plan(plan, config, initial_context=initial, output_dir=output_dir)
    click.echo(result.summary())
    regressed = _echo_regressions(config, [result.run_id])
    _echo_lines(progress.summary_lines())
    if not result.success:
        return EXIT_FAILED
    return EXIT_FAILED if regressed and fail_on_regression else EXIT_OK


def _fresh(plan: TaskPlan, config: AgentEnvConfig, path: Path) -> bool:
    """``--stale-only`` for an agent-env task: whether each of its assets is current (then
    it is skipped, saying so); else why it runs."""
    from .orchestration.execute import opened_instance
    from .orchestration.staleness import plan_asset_graph, stale_rows

    with opened_instance(config) as instance:
        found = stale_rows(instance, plan_asset_graph(plan, config), plan, [""])
    if not found.stale:
        click.echo(f"skipped {path}: task '{plan.task_id}' is fresh, each of its scores is current (--stale-only)")
        return True
    click.echo(f"task '{plan.task_id}' is stale: {found.summary()}")
    return False


def _echo_regressions(config: AgentEnvConfig, run_ids: list[str]) -> bool:
    """Say which scores of the runs regressed (their failed ``no_regression`` checks); whether any did."""
    from .orchestration.execute import opened_instance
    from .orchestration.regression import run_regressions

    if not run_ids:
        return False
    with opened_instance(config) as instance:
        regressions = run_regressions(instance, run_ids)
    for regression in regressions:
        click.echo(f"  {regression}")
    return bool(regressions)


def _progress(verbose: bool, quiet: bool):
    """The progress of the runs a command executes, on stderr (``orchestration/progress.py``)."""
    from .orchestration.progress import choose_mode, reporting  # Dagster only when running

    return reporting(choose_mode(quiet=quiet, verbose=verbose, stream=sys.stderr), sys.stderr)


def _echo_lines(lines: list[str]) -> None:
    for line in lines:
        click.echo(line)


def _config() -> AgentEnvConfig:
    """The project's config, its custom criteria registered (tasks are read after this)."""
    try:
        config = load_config()
        load_extensions(config)
        return config
    except ConfigError as exc:
        _bad_input(str(exc))


def _coder_eval_tasks(paths: tuple[Path, ...]) -> list[Path]:
    """The task files PATHS name, once each: a file, a folder (every Coder Eval task under it)
    or a quoted glob pattern (``'tasks/**/*.yaml'``). A path that does not exist is bad input
    (exit 2); a folder or pattern that names no task ends the run with exit 1, as upstream's
    unmatched task pattern does."""
    files: list[Path] = []
    seen: set[Path] = set()
    for path in paths:
        if not (path.exists() or glob.has_magic(str(path))):
            _bad_input(f"{path}: no such file or folder")
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
        value = _define_value(key, raw)
        target = context
        *parents, leaf = key.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[leaf] = value
    metadata = context.get("metadata")
    if isinstance(metadata, dict) and "universe_id" in metadata:  # it names a folder of the artifact store
        _load_or_exit(lambda: check_id(metadata["universe_id"], "-D metadata.universe_id"))
    return context


def _define_value(key: str, raw: str) -> Any:
    """A ``-D`` value: JSON when it parses (within the input limits), else the text itself."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw
    except RecursionError:
        _bad_input(f"-D {key}: nested too deeply")
    try:
        check_values(value)
    except SpecError as exc:
        _bad_input(f"-D {key}: {exc}")
    return value


if __name__ == "__main__":  # pragma: no cover
    main()
