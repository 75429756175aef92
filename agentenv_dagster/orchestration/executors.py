"""The executor a job gets: the project's side-by-side ``agentenv`` executor, Dagster's in-process
one for a chain of steps with no dataset (nothing to overlap), or what ``[dagster] executor`` (or
``AGENTENV_DAGSTER_EXECUTOR``) chooses. The jobs are the same under each: with the S3 IO manager and
a Postgres instance their steps run on Celery workers or in Kubernetes Jobs (docs/architecture.md).
"""

from __future__ import annotations

import os

import dagster as dg

from ..config import AgentEnvConfig, resolve_reference
from ..plan import TaskPlan
from .streams import request_stop, running_side_by_side


@dg.executor(
    name="agentenv",
    config_schema={"retries": dg.Field(dg.Selector({"enabled": {}, "disabled": {}}), is_required=False,
                                       default_value={"enabled": {}},
                                       description="Dagster's retries of failed steps: enabled or disabled")},
)
def agentenv_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
    """Every step of a run in a thread of the run's process, side by side: a step starts as
    soon as the streams it reads exist."""
    from .dagster_internals import RetryMode, ThreadedExecutor

    retries = RetryMode.from_config(init_context.executor_config["retries"])
    return ThreadedExecutor(retries, in_step_thread=running_side_by_side, on_interrupt=request_stop)


def job_executor(config: AgentEnvConfig, plan: TaskPlan | None = None) -> dg.ExecutorDefinition:
    """The project's choice, else the side-by-side executor (in-process for a chain of steps with no dataset)."""
    choice = config.dagster.chosen_executor()
    if choice == "in_process" or (choice is None and plan is not None and runs_as_chain(plan)):
        return dg.in_process_executor
    if choice in ("celery", "k8s"):
        return celery_executor(config) if choice == "celery" else k8s_executor(config)
    return dg.multiprocess_executor if choice == "multiprocess" else agentenv_executor


def runs_as_chain(plan: TaskPlan) -> bool:
    """Whether nothing of the task could overlap: one row, and each step a descendant of the one before it."""
    steps = [step.id for step in plan.steps]
    return not plan.document.partitions and all(previous in plan.ancestors(step)
                                                for previous, step in zip(steps, steps[1:]))


def celery_executor(config: AgentEnvConfig) -> dg.ExecutorDefinition:
    """``dagster_celery.celery_executor`` with the project's broker and result backend (the
    workers must be started with the same: ``deploy/celery.yaml``)."""
    try:
        from dagster_celery import celery_executor as celery
    except ImportError as exc:  # the prod extra is not installed
        raise ImportError("[dagster] executor = \"celery\" needs dagster-celery: "
                          "pip install 'agentenv-dagster[prod]'") from exc
    settings = config.dagster.celery
    return celery.configured({"broker": _string_source(settings.broker), "backend": _string_source(settings.backend),
                              **({"include": settings.include} if settings.include else {})}, name="celery")


def k8s_executor(config: AgentEnvConfig) -> dg.ExecutorDefinition:
    """``dagster_k8s.k8s_job_executor`` with ``[dagster.k8s]`` as its config (a Job per step,
    in the image of the code location)."""
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as exc:
        raise ImportError("[dagster] executor = \"k8s\" needs dagster-k8s: pip install dagster-k8s==0.29.27") from exc
    return k8s_job_executor.configured(dict(config.dagster.k8s), name="k8s") if config.dagster.k8s else k8s_job_executor


def _string_source(value: str) -> str | dict[str, str]:
    """An ``env:NAME`` whose variable is set stays a reference (``{"env": NAME}``, read where
    the run executes), so a broker password never sits in the job's definition."""
    if value.startswith("env:") and os.environ.get(name := value[4:].partition("?")[0]):
        return {"env": name}
    return resolve_reference(value)
