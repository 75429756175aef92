"""Review decisions from the Dagster UI: a run tag becomes the decision file a waiting ``review`` step polls
for (``runtime/review.py``; the step itself never sees Dagster).

The tag ``agentenv/review=approved`` (or ``rejected``), optionally with ``agentenv/review_note=<why>``, on a
run's page decides every review awaiting in that run, those awaiting later included, on the next tick of the
``agentenv_review_tags`` sensor (running by default); ``agentenv-dagster review RUN_ID approve|reject --step
STEP`` decides gates one by one.
"""

from __future__ import annotations

import logging

import dagster as dg

from ..runtime.review import RunReviews
from .resources import AgentEnvResource
from .sensors import resource_of_run

TAG_REVIEW = "agentenv/review"
TAG_REVIEW_NOTE = "agentenv/review_note"
REVIEW_TAGS_SENSOR = "agentenv_review_tags"

log = logging.getLogger("agentenv_dagster")


def apply_review_tags(instance: dg.DagsterInstance, resource: AgentEnvResource,
                      logger: logging.Logger | None = None) -> list[tuple[str, str, str]]:
    """Decide the awaiting reviews of every started run tagged ``agentenv/review``; (run, step, decision) of each."""
    written = []
    tagged = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={TAG_REVIEW: ["approved", "rejected"]})
    for run in instance.get_runs(filters=tagged):
        reviews, value = RunReviews.of_run(resource_of_run(resource, run).run_dir(run.run_id)), run.tags[TAG_REVIEW]
        for awaiting in reviews.awaiting():
            step_id, instance_id = awaiting["step_id"], awaiting["instance_id"]
            if reviews.get(step_id, instance_id) is not None:
                continue  # decided already; the step has not noticed yet
            record = reviews.decide(value, step_id=step_id, instance_id=instance_id, note=run.tags.get(TAG_REVIEW_NOTE),
                                    decided_by=f"dagster run tag {TAG_REVIEW}={value}", source="dagster-tag")
            written.append((run.run_id, step_id, record["decision"]))
            message = f"agentenv: review '{step_id}' {value} by the run tag {TAG_REVIEW}"
            (logger or log).info(f"run {run.run_id}: {message}")
            instance.report_engine_event(message, dagster_run=run)
    return written


def review_tag_sensor() -> dg.SensorDefinition:
    @dg.sensor(
        name=REVIEW_TAGS_SENSOR, default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=5,
        description=f"Turns the run tag {TAG_REVIEW}=approved|rejected into the decision of the run's "
                    "waiting review steps.")
    def _sensor(context: dg.SensorEvaluationContext, agentenv: AgentEnvResource):  # the RESOURCE_KEY resource
        if not apply_review_tags(context.instance, agentenv, context.log):
            return dg.SkipReason("no tagged run has a review awaiting a decision")

    return _sensor
