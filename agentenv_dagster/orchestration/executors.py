"""The executor every job gets: multiprocess (forkserver) by default, or what the project
chooses (``[dagster] executor`` in ``.agentenv/config.toml``, or ``AGENTENV_DAGSTER_EXECUTOR``).

The jobs do not change between executors: ops hand each other their contexts through the IO
manager, so with the S3 one (``[stores] backend = "s3"``) and a Postgres instance the same
job runs with its steps on Celery workers (``celery``) or in Kubernetes Jobs (``k8s``,
``dagster_k8s.k8s_job_executor``; see README "Running in production").
"""

from __future__ import annotations

import dagster as dg

from ..config import AgentEnvConfig, resolve_reference

FORKSERVER_EXECUTOR = dg.multiprocess_executor.configured(
    # the local storage too: it reads Dagster's migration scripts once, for every step process
    {"start_method": {"forkserver": {"preload_modules": [
        "dagster", "agentenv_dagster.orchestration.ops", "agentenv_dagster.orchestration.sqlite_storage"]}}},
    name="multiprocess_forkserver",
)


def job_executor(config: AgentEnvConfig) -> dg.ExecutorDefinition:
    choice = config.dagster.chosen_executor()
    if choice == "in_process":
        return dg.in_process_executor
    if choice == "celery":
        return celery_executor(config)
    if choice == "k8s":
        return k8s_executor(config)
    return FORKSERVER_EXECUTOR


def celery_executor(config: AgentEnvConfig) -> dg.ExecutorDefinition:
    """``dagster_celery.celery_executor`` with the project's broker and result backend (the
    workers must be started with the same: ``deploy/celery.yaml``)."""
    try:
        from dagster_celery import celery_executor as celery
    except ImportError as exc:  # the prod extra is not installed
        raise ImportError(
            "[dagster] executor = \"celery\" needs dagster-celery: pip install 'agentenv-dagster[prod]'"
        ) from exc
    settings = config.dagster.celery
    return celery.configured(
        {
            "broker": _string_source(settings.broker),
            "backend": _string_source(settings.backend),
            **({"include": settings.include} if settings.include else {}),
        },
        name="celery",
    )


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
    if value.startswith("env:"):
        import os

        name = value[4:].partition("?")[0]
        if os.environ.get(name):
            return {"env": name}
    return resolve_reference(value)
