"""`dagster dev` on the project: jobs listed, a launch from the launchpad's API, assets and
checks as the UI reads them (GraphQL), a dataset row launched as its partition, and every
process ended afterwards."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx
import pytest
import yaml
from dagster_graphql import DagsterGraphQLClient

from agentenv_dagster.runtime.processes import is_running, terminate
from agentenv_dagster.orchestration.execute import dagster_yaml
from browser import ARTIFACTS, CHROMIUM, chromium
from projects import REPO, leaked_servers, make_project

ASSETS_QUERY = """{
  assetNodes {
    assetKey { path }
    dependencyKeys { path }
    assetChecksOrError { ... on AssetChecks { checks { name executionForLatestMaterialization { status } } } }
    assetMaterializations(limit: 1) {
      metadataEntries { label ... on FloatMetadataEntry { floatValue } ... on BoolMetadataEntry { boolValue } }
    }
  }
}"""
LAUNCHPAD_QUERY = """{ runConfigSchemaOrError(selector: {repositoryLocationName: "agentenv_tasks",
    repositoryName: "__repository__", pipelineName: "reply_to_dana"}) { ... on RunConfigSchema { rootDefaultYaml } } }"""
JOBS_QUERY = """{ repositoriesOrError { ... on RepositoryConnection { nodes { jobs { name } } } } }"""
SUITES_SENSOR_TICKS = """{ sensorOrError(sensorSelector: {repositoryLocationName: "agentenv_tasks",
  repositoryName: "__repository__", sensorName: "agentenv_suites"}) {
  ... on Sensor { sensorState { ticks(limit: 1) { status } } } } }"""
SUITE_QUERY = """{ assetNodeOrError(assetKey: {path: ["suites", "triage_tickets"]}) { ... on AssetNode {
  assetMaterializations(limit: 1) { runId metadataEntries { label ... on IntMetadataEntry { intValue } } }
} } }"""
REEXECUTE = """mutation ($parent: String!) { launchPipelineReexecution(reexecutionParams:
  {parentRunId: $parent, strategy: ALL_STEPS}) { __typename ... on LaunchRunSuccess { run { runId } } } }"""
RUN_ORIGIN_QUERY = """query ($id: ID!) { runOrError(runId: $id) { ... on Run { jobName
  repositoryOrigin { repositoryLocationName } } } }"""
PARTITIONS_QUERY = """query ($path: [String!]!) { assetNodeOrError(assetKey: {path: $path}) { ... on AssetNode {
  partitionKeysByDimension { name partitionKeys }
  assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
  assetChecksOrError { ... on AssetChecks { checks { name partitionStatuses {
    ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } } } } }
} } }"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def graphql(port: int, text: str, variables: dict | None = None) -> dict:
    """The data the webserver on ``port`` answers a GraphQL query with, as the UI asks it."""
    answer = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": text, "variables": variables or {}},
                        timeout=60)
    answer.raise_for_status()
    body = answer.json()
    assert not body.get("errors"), body["errors"]
    return body["data"]


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def dagster_dev(project):
    """``dagster dev`` of ``project``'s workspace on a free port, its instance the project's
    ``.dagster_home``: ``(port, process)`` once the webserver answers; stopped afterwards."""
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    dev = subprocess.Popen(
        [sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)],
        cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        def up():
            try:
                return httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 120, "the webserver")
        yield port, dev
    finally:
        terminate(dev.pid, grace_seconds=20)
        dev.wait(timeout=30)
    wait_until(lambda: not is_running(dev.pid), 30, "dagster dev to stop")


def launch_and_wait(client: DagsterGraphQLClient, job: str, run_config: dict, **options) -> str:
    """Launches ``job`` as the launchpad does; its run id, once the run has succeeded."""
    run_id = client.submit_job_execution(job, repository_location_name="agentenv_tasks", run_config=run_config,
                                         **options)
    status = wait_until(
        lambda: (s := client.get_run_status(run_id)).value in ("SUCCESS", "FAILURE", "CANCELED") and s,
        240, f"the launched run of {job}")
    assert status.value == "SUCCESS"
    return run_id


def look_at_the_ui(tmp_path, base: str) -> None:
    """The verification asset's page and its lineage as a browser renders them (the UI is a
    JavaScript app: Chromium runs it for a virtual 20 s), kept as screenshots."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pages = {"verification": "/assets/verifications/reply_to_dana/sent",
             "lineage": "/assets/verifications/reply_to_dana/sent?view=lineage",
             "suite": "/assets/suites/triage_tickets"}
    for name, path in pages.items():
        dom = chromium(tmp_path / f"profile-{name}", base + path, "--virtual-time-budget=20000", "--dump-dom",
                       timeout=120)
        if name == "suite":  # the dataset's suite, rolled up by the daemon
            assert "triage-tickets" in dom and "pass_rate" in dom, dom[-2000:]
        elif name == "verification":
            assert "sent" in dom and "reply_to_dana" in dom, dom[-2000:]
            assert "score" in dom and "passed" in dom  # the materialization's metadata
        else:
            assert "sent" in dom and "reply_to_dana" in dom, dom[-2000:]
            assert "inbox" in dom  # the loaded artifact upstream of the verification
        shot = ARTIFACTS / f"dagster-ui-{name}.png"
        chromium(tmp_path / f"profile-{name}-shot", base + path, "--virtual-time-budget=20000",
                 f"--screenshot={shot}", "--window-size=1400,1000", "--hide-scrollbars", timeout=120)
        assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def re_execute_a_cli_run(client: DagsterGraphQLClient, port: int, project, env: dict) -> None:
    """A run the CLI made of a task the code location has is a run of the location's job: the
    UI lists it under the job and re-executes it (Re-execute all)."""
    done = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/reply_to_dana.json"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (parent,) = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("run ")]
    run = graphql(port, RUN_ORIGIN_QUERY, {"id": parent})["runOrError"]
    assert run == {"jobName": "reply_to_dana", "repositoryOrigin": {"repositoryLocationName": "agentenv_tasks"}}
    launched = graphql(port, REEXECUTE, {"parent": parent})["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    child = launched["run"]["runId"]
    status = wait_until(
        lambda: (s := client.get_run_status(child)).value in ("SUCCESS", "FAILURE", "CANCELED") and s,
        240, "the re-executed run")
    assert status.value == "SUCCESS"


def launch_a_row_and_see_the_partitions(client: DagsterGraphQLClient, port: int, project) -> None:
    """A dataset task's row launched as its partition (the launchpad's partition config and
    tag), and the partitions as the asset page and its checks' Partitions tab read them: the
    row materialized and its check passed, the others not run; the experiment's suite has a
    partition per variant. Then the daemon rolls the
    task's suite up by itself."""
    from agentenv_dagster import build_definitions

    job = build_definitions(project / "tasks").resolve_job_def("triage_tickets")
    config = job.partitioned_config.get_run_config_for_partition_key("t2")
    # the automation sensor's first tick only takes stock: rows updated before it do not count
    wait_until(lambda: graphql(port, SUITES_SENSOR_TICKS)["sensorOrError"]["sensorState"]["ticks"], 180,
               "the suites sensor's first tick")
    launch_and_wait(client, "triage_tickets", config, tags={"dagster/partition": "t2"})

    def node(*path: str) -> dict:
        return graphql(port, PARTITIONS_QUERY, {"path": list(path)})["assetNodeOrError"]

    rows = node("verifications", "triage_tickets", "success_criteria")
    assert rows["partitionKeysByDimension"][0]["partitionKeys"] == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert rows["assetPartitionStatuses"] == {"materializedPartitions": ["t2"], "failedPartitions": []}
    checks = {c["name"]: c["partitionStatuses"] for c in rows["assetChecksOrError"]["checks"]}
    assert checks["passed"] == {"succeededPartitions": ["t2"], "failedPartitions": []}  # the row's check passed
    suite = node("suites", "triage_tickets__triage_prompts")
    assert [d["partitionKeys"] for d in suite["partitionKeysByDimension"]] == [["full", "terse"]]

    def rolled_up() -> dict | None:  # by the daemon's automation sensor, on its own
        done = graphql(port, SUITE_QUERY)["assetNodeOrError"]["assetMaterializations"]
        return done and {e["label"]: e.get("intValue") for e in done[0]["metadataEntries"]}

    assert wait_until(rolled_up, 180, "the suite's automatic roll-up")["rows_run"] == 1


STALE_QUERY = """{ assetNodes(assetKeys: [{path: ["verifications", "reply_to_dana", "tone"]},
  {path: ["verifications", "reply_to_dana", "sent"]}]) { assetKey { path } staleStatus staleCauses { reason } } }"""
RELOAD = """mutation { reloadRepositoryLocation(repositoryLocationName: "agentenv_tasks") { __typename } }"""


def a_new_judge_makes_the_rubric_stale(port: int, project) -> None:
    """The asset page's stale status: both scores current after the runs; once the judge
    model changes (and the location reloads), the rubric's score is stale, the env outcome's
    (which no judge grades) is not."""
    def statuses() -> dict[str, tuple[str, list[str]]]:
        return {n["assetKey"]["path"][-1]: (n["staleStatus"], [c["reason"] for c in n["staleCauses"]])
                for n in graphql(port, STALE_QUERY)["assetNodes"]}

    assert statuses() == {"tone": ("FRESH", []), "sent": ("FRESH", [])}
    config = project / ".agentenv" / "config.toml"
    config.write_text(config.read_text() + '\n[model.roles]\njudge = "claude-opus-4-1"\n')
    assert graphql(port, RELOAD)["reloadRepositoryLocation"]["__typename"] == "WorkspaceLocationEntry"
    changed = wait_until(lambda: (now := statuses())["tone"][0] == "STALE" and now, 120, "the rubric to go stale")
    assert changed == {"tone": ("STALE", ["has a new code version"]), "sent": ("FRESH", [])}


@pytest.mark.slow
def test_dagster_dev_lists_launches_and_shows_scores(tmp_path):
    project = make_project(tmp_path / "p", extra_config='[experiments]\n"experiments/triage_prompts.yaml" = ["triage-tickets"]\n')
    shutil.copytree(REPO / "experiments", project / "experiments")
    (project / "tasks" / "broken.json").write_text("[{]")
    shutil.copy(REPO / "definitions.py", project / "definitions.py")
    shutil.copy(REPO / "workspace.yaml", project / "workspace.yaml")
    (project / ".dagster_home").mkdir()
    (project / ".dagster_home" / "dagster.yaml").write_text(dagster_yaml(project / ".dagster_home"))
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    with dagster_dev(project) as (port, _dev):
        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        jobs = graphql(port, JOBS_QUERY)["repositoriesOrError"]["nodes"][0]["jobs"]
        assert {"reply_to_dana", "broken__invalid"} <= {j["name"] for j in jobs}

        # the launchpad opens with the steps' fields, and launches what its editor holds
        prefilled = yaml.safe_load(graphql(port, LAUNCHPAD_QUERY)["runConfigSchemaOrError"]["rootDefaultYaml"])
        assert prefilled["ops"]["reply_to_dana_steps"]["config"]["steps"]["reply"]["prompt"] == "Reply to Dana."
        launch_and_wait(client, "reply_to_dana", prefilled)

        nodes = {tuple(n["assetKey"]["path"]): n for n in graphql(port, ASSETS_QUERY)["assetNodes"]}
        sent = nodes[("verifications", "reply_to_dana", "sent")]
        metadata = {e["label"]: e.get("floatValue", e.get("boolValue")) for e in sent["assetMaterializations"][0]["metadataEntries"]}
        assert metadata["score"] == 1.0 and metadata["passed"] is True
        checks = {c["name"]: c["executionForLatestMaterialization"] for c in sent["assetChecksOrError"]["checks"]}
        assert checks == {"passed": {"status": "SUCCEEDED"},  # the checks tab: the score passed, and
                          "no_regression": {"status": "SUCCEEDED"}}  # did not drop (no baseline yet)
        collected = nodes[("artifacts", "reply_to_dana", "collect")]
        assert ["artifacts", "inbox"] in [d["path"] for d in collected["dependencyKeys"]]
        assert collected["assetMaterializations"]
        launch_a_row_and_see_the_partitions(client, port, project)
        re_execute_a_cli_run(client, port, project, env)
        a_new_judge_makes_the_rubric_stale(port, project)
        if CHROMIUM:
            look_at_the_ui(tmp_path, f"http://127.0.0.1:{port}")
    assert leaked_servers(project / ".agentenv" / "state") == []
