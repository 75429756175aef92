"""Custom step types for the registry tests, imported through ``module:Class`` pointers
(``custom_steps:EchoStep``): tests/ is on ``sys.path`` (rootdir conftest, no packages)."""

from __future__ import annotations

from agentenv_dagster.steps.base import VERIFICATION, TaskStep


class EchoStep(TaskStep):
    """A custom step with one required field and no context joins."""

    type_name = "echo"

    message: str
    repeat: int = 1


class AggregateScoresStep(TaskStep):
    """Reads verifications by id (as agent-env's ``aggregate_verifiers``): a join on verifier_id."""

    type_name = "aggregate_scores"
    reads = {"verifier_ids": VERIFICATION}
    writes = {"verifier_id": VERIFICATION}

    verifier_ids: list[str]
    verifier_id: str | None = None


class CollidingStep(TaskStep):
    """Claims a built-in type name."""

    type_name = "deploy_env"


class UntypedStep(TaskStep):
    """Keeps the base ``type_name`` ("task_step")."""


class NotAStep:
    """Not a TaskStep at all."""

    type_name = "not_a_step"
