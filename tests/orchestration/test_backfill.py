"""A dataset backfilled as Dagster users launch it: every row in ONE run (the single-run
backfill policy), on the project's executor, each row's score a partition of the task's
assets, at most ``max_sandboxes`` rows holding deployments at once, nothing left running.

From the instance (``dagster dev``: webserver and daemon, the backfill submitted through
GraphQL as the UI's *Launch backfill* sends it), from the asset graph (an asset backfill,
which Dagster runs as its implicit asset job) and from the job's page (the job's partition
set); and in one process (``dg launch --assets ... --partition-range``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import dagster as dg
import pytest
import psutil
from test_dagster_dev import PARTITIONS_QUERY, dagster_dev, graphql, wait_until
from test_pipelined_rows import most_at_once, spans

from agentenv_dagster import build_definitions
from agentenv_dagster.orchestration.execute import dagster_yaml
from agentenv_dagster.orchestration.io_manager import final_contexts
from agentenv_dagster.orchestration.rows import RANGE_END_TAG, RANGE_START_TAG
from projects import REPO, leaked_servers, make_project

LABELS = {"billing": "I was charged twice", "bug": "The export button crashes", "question": "How do I invite a teammate"}
ROWS = [(f"t{i:02d}", label) for i, label in enumerate(list(LABELS) * 4, start=1)]
TASK = textwrap.dedent("""\
    task_id: tickets
    description: label each ticket, two rows holding their sandbox at a time
    initial_prompt: "Label this ticket billing, bug or question in label.txt: ${row.text}"
    agent:
      type: replay
      episodes:
        - {match: "charged", reply: billing, actions: [{write_file: label.txt, content: billing}]}
        - {match: "crashes", reply: bug, actions: [{write_file: label.txt, content: bug}]}
        - {match: "How do I", reply: question, actions: [{write_file: label.txt, content: question}]}
    sandbox: {python: null}
    dataset:
      max_sandboxes: 2
      rows:
    """) + "".join(f"    - {{id: {key}, text: \"{LABELS[label]} ({key})\", label: {label}}}\n" for key, label in ROWS) + \
    textwrap.dedent("""\
    success_criteria:
      - type: classification_match
        path: label.txt
        expected_label: "${row.label}"
        allowed_labels: [billing, bug, question]
        description: the ticket's label
    """)
KEYS = [key for key, _ in ROWS]
VERIFICATION = ["verifications", "tickets", "success_criteria"]
RESULTS = ["results", "tickets"]
LOCATION = {"repositoryLocationName": "agentenv_tasks", "repositoryName": "__repository__"}

LAUNCH_BACKFILL = """mutation ($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
BACKFILL = """query ($id: String!) { partitionBackfillOrError(backfillId: $id) { ... on PartitionBackfill {
  status runs(limit: 100) { runId jobName status tags { key value } } } } }"""
UNFINISHED = """{ runsOrError(filter: {statuses: [QUEUED, NOT_STARTED, STARTING, STARTED, CANCELING]}) {
  ... on Runs { results { runId } } } }"""
SCORES = """query ($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
  assetMaterializations(limit: 100) { partition runId metadataEntries { label ... on FloatMetadataEntry { floatValue } } }
} } }"""
# what the UI sends: from the asset graph (the assets, all partitions) and from the job's page
FROM_THE_ASSET_GRAPH = {"assetSelection": [{"path": VERIFICATION}, {"path": RESULTS}], "allPartitions": True, "tags": []}
FROM_THE_JOB_PAGE = {"assetSelection": [{"path": VERIFICATION}, {"path": RESULTS}], "partitionNames": KEYS,
                     "fromFailure": False, "tags": [],
                     "selector": {"partitionSetName": "tickets_partition_set", "repositorySelector": LOCATION}}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", tasks={"tickets.yaml": TASK})
    for name in ("definitions.py", "workspace.yaml"):
        shutil.copy(REPO / name, root / name)
    (root / ".dagster_home").mkdir()
    (root / ".dagster_home" / "dagster.yaml").write_text(dagster_yaml(root / ".dagster_home"))
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def assert_every_row_ran_in_one_bounded_run(project, run_id: str) -> None:
    """Every row went through the run, graded right, at most the dataset's two at once."""
    contexts = {key: ctx.to_dict() for key, ctx in final_contexts(project / ".agentenv" / "state" / "runs", run_id).items()}
    assert sorted(contexts) == KEYS
    # a row holds its sandbox and agent from its first step until it leaves the run
    assert most_at_once(spans(contexts, "sandbox", "teardown_run")) == 2


def test_a_run_of_the_implicit_asset_job_takes_each_row_from_the_task(project):
    """What an asset backfill, Materialize in the asset graph and ``dg launch --assets`` run:
    Dagster's implicit asset job over a range of rows, the task's graph one node among others.
    Each row is filled from the task's dataset, so each is graded against its own label."""
    defs = build_definitions(project / "tasks")
    keys = {dg.AssetKey(VERIFICATION), dg.AssetKey(RESULTS)}
    job = defs.get_repository_def().get_implicit_job_def_for_assets(list(keys)).get_subset(asset_selection=keys)
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance, tags={RANGE_START_TAG: "t01", RANGE_END_TAG: "t06"}).success
        records = instance.fetch_materializations(dg.AssetKey(VERIFICATION), limit=100).records
    assert sorted((r.asset_materialization.partition, r.asset_materialization.metadata["score"].value)
                  for r in records) == [(key, 1.0) for key in KEYS[:6]]


def test_rows_that_stop_in_the_implicit_asset_job_s_run_are_failed_partitions(project):
    """An asset backfill's run (the implicit asset job over a range) whose rows stop before their
    verification: Dagster planned each row's check evaluations when it created the run, so the
    stopped rows are reported failed without planning those again (its storage refuses a second
    planned evaluation of a partition in one run); the step fails with the rows' own error."""
    (project / "tasks" / "tickets.yaml").write_text(
        TASK.replace("success_criteria:", 'pre_run:\n  - {command: "exit 3"}\nsuccess_criteria:'))
    keys = {dg.AssetKey(VERIFICATION), dg.AssetKey(RESULTS)}
    repository = build_definitions(project / "tasks").get_repository_def()
    job = repository.get_implicit_job_def_for_assets(list(keys)).get_subset(asset_selection=keys)
    rows, partitions = KEYS[:3], dg.StaticPartitionsDefinition(KEYS)
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance, raise_on_error=False,
                                        tags={RANGE_START_TAG: rows[0], RANGE_END_TAG: rows[-1]})
        (failure,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        assert failure.step_key == "tickets_steps.pre_run"
        assert failure.step_failure_data.error.message.startswith(
            "dagster._core.definitions.events.Failure: 3 rows failed; the first: step 'pre_run' (run_commands) "
            "failed: pre_run command 'exit 3' failed: exit code 3")
        status = instance.get_status_by_partition(dg.AssetKey(VERIFICATION), rows, partitions)
        assert {k: v.value for k, v in status.items()} == dict.fromkeys(rows, "FAILED")
        check = dg.AssetCheckKey(dg.AssetKey(VERIFICATION), "passed")
        state = instance.event_log_storage.get_asset_check_state([(check, partitions)])[check]
        assert {row: s.value for s, subset in state.subsets.items()
                for row in subset.subset_value.get_partition_keys()} == dict.fromkeys(rows, "EXECUTION_FAILED")


@pytest.mark.slow
def test_dg_launch_of_the_assets_runs_every_row_in_one_bounded_run(project):
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    selection = f'key:"{"/".join(VERIFICATION)}" or key:"{"/".join(RESULTS)}"'
    done = subprocess.run(["dg", "launch", "--assets", selection, "--partition-range", f"{KEYS[0]}...{KEYS[-1]}",
                           "-f", "definitions.py"], cwd=project, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        (run,) = instance.get_runs()
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert instance.get_materialized_partitions(dg.AssetKey(VERIFICATION)) == set(KEYS)
    assert_every_row_ran_in_one_bounded_run(project, run.run_id)


def backfill_every_row(port: int, params: dict) -> dict:
    """Submits a backfill as the UI does; its one run, once the daemon has completed it."""
    launched = graphql(port, LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    backfill = wait_until(
        lambda: (b := graphql(port, BACKFILL, {"id": launched["backfillId"]})["partitionBackfillOrError"])["status"]
        not in ("REQUESTED", "CANCELING", "FAILING") and b, 300, "the backfill to complete")
    assert backfill["status"] == "COMPLETED_SUCCESS", backfill
    (run,) = backfill["runs"]  # the single-run backfill policy: every row in one run
    tags = {t["key"]: t["value"] for t in run["tags"]}
    assert (run["status"], tags[RANGE_START_TAG], tags[RANGE_END_TAG]) == ("SUCCESS", KEYS[0], KEYS[-1])
    return run


def assert_the_run_scored_every_row(port: int, run_id: str) -> None:
    def scores(path: list[str]) -> dict[str, float | None]:
        found = graphql(port, SCORES, {"path": path})["assetNodeOrError"]["assetMaterializations"]
        return {m["partition"]: next((e.get("floatValue") for e in m["metadataEntries"] if e["label"] == "score"), None)
                for m in found if m["runId"] == run_id}

    assert scores(VERIFICATION) == {key: 1.0 for key in KEYS}  # each row graded against its own label
    assert sorted(scores(RESULTS)) == KEYS
    for path in (VERIFICATION, RESULTS):
        node = graphql(port, PARTITIONS_QUERY, {"path": path})["assetNodeOrError"]
        assert node["assetPartitionStatuses"] == {"materializedPartitions": KEYS, "failedPartitions": []}
    node = graphql(port, PARTITIONS_QUERY, {"path": VERIFICATION})["assetNodeOrError"]
    checks = {c["name"]: c["partitionStatuses"] for c in node["assetChecksOrError"]["checks"]}
    assert checks["passed"] == {"succeededPartitions": KEYS, "failedPartitions": []}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_backfill_launched_from_the_ui_runs_every_row_in_one_bounded_run(project):
    with dagster_dev(project) as (port, dev):
        # from the asset graph: Dagster's implicit asset job runs the task's graph
        run = backfill_every_row(port, FROM_THE_ASSET_GRAPH)
        assert run["jobName"] == "__ASSET_JOB"
        assert_the_run_scored_every_row(port, run["runId"])
        assert_every_row_ran_in_one_bounded_run(project, run["runId"])
        # from the job's page: the task's own job
        run = backfill_every_row(port, FROM_THE_JOB_PAGE)
        assert run["jobName"] == "tickets"
        assert_the_run_scored_every_row(port, run["runId"])
        assert_every_row_ran_in_one_bounded_run(project, run["runId"])
        assert graphql(port, UNFINISHED)["runsOrError"]["results"] == []  # no run queued or still going
    # nor any process it started (webserver, daemon, code servers, run workers; they end as their
    # parents stop them, or on their heartbeat): the fixture checks the rows' sandboxes and agents
    def group():
        return [p.info["cmdline"][:6] for p in psutil.process_iter(["cmdline"]) if _in_group(p, dev.pid)]
    try:
        wait_until(lambda: not group(), 60, "every process of dagster dev to end")
    except AssertionError:
        assert group() == []


def _in_group(process: psutil.Process, group: int) -> bool:
    try:
        return os.getpgid(process.pid) == group and process.status() != psutil.STATUS_ZOMBIE
    except (ProcessLookupError, psutil.Error):
        return False
