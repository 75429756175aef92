"""run_docker_container and run_container_unit_tests_verifier against a real, private Docker
engine (``scripts/docker_engine.sh`` through the session ``docker_engine`` fixture: where
Docker cannot be installed or started, the engine tests are skipped with the script's
reason). Every run ends with the walker's teardown, and each test checks that no container
of its run is left."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import docker
import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runner import run_plan
from agentenv_dagster.steps.containers import parse_junit_xml, parse_pytest_summary
from agentenv_dagster.steps.execution import StepFailed

BUSYBOX = "agentenv-sandbox:busybox"
BOX = {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"}

# What `pytest -rA` prints at the end of a run with one failure, one skip and one xfail.
PYTEST_OUTPUT = """\
============================= test session starts ==============================
collected 5 items

tests/test_app.py .F.sx                                                  [100%]

=================================== FAILURES ===================================
___________________________________ test_div ___________________________________
E       assert 1 == 2
=========================== short test summary info ============================
PASSED tests/test_app.py::test_add
PASSED tests/test_app.py::test_sub[1-2]
SKIPPED [1] tests/test_app.py:20: needs a GPU
XFAIL tests/test_app.py::test_known - bug 12
FAILED tests/test_app.py::test_div - assert 1 == 2
============== 1 failed, 2 passed, 1 skipped, 1 xfailed in 0.05s ===============
"""

JUNIT_XML = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_app" name="test_add" time="0.001"/>
<testcase classname="tests.test_app" name="test_div" time="0.002"><failure message="assert 1 == 2">trace</failure></testcase>
<testcase classname="tests.test_app" name="test_gpu" time="0"><skipped message="needs a GPU"/></testcase>
</testsuite></testsuites>
"""


def project(tmp_path: Path):
    """A project whose bundle artifact ``web`` is a Docker context built on the busybox image."""
    (tmp_path / ".agentenv").mkdir()
    (tmp_path / ".agentenv" / "config.toml").write_text('[stores]\nstate_dir = "state"\nartifact_dirs = ["bundles"]\n')
    web = tmp_path / "bundles" / "web"
    web.mkdir(parents=True)
    (web / "Dockerfile").write_text(
        f"FROM {BUSYBOX}\nARG FLAVOUR=plain\nRUN echo \"$FLAVOUR\" > /flavour\nCOPY app /app\nWORKDIR /app\n"
        'CMD ["/bin/sh", "-c", "touch /tmp/ready; exec sleep 1000"]\n'
    )
    (web / "app").mkdir()
    (web / "app" / "hello.sh").write_text("echo hello from the image\n")
    return load_config(tmp_path)


def run(tmp_path: Path, config, steps: list[dict], ctx: TaskStepContext | None = None) -> TaskStepContext:
    """Run the steps with the plain asyncio walker in ``ctx`` (pass one to read it after a
    fatal failure); ``metadata.run_group_id`` is the run id, which labels its containers."""
    path = tmp_path / "task.json"
    path.write_text(json.dumps(steps))
    ctx = TaskStepContext() if ctx is None else ctx
    ctx.metadata["run_group_id"] = run_id = uuid.uuid4().hex
    asyncio.run(run_plan(load_plan(path, config), config, context=ctx, run_id=run_id))
    return ctx


def containers_of(run_id: str) -> list:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"agentenv.run_id={run_id}"})
    finally:
        client.close()


def entry(ctx: TaskStepContext, verifier_id: str) -> dict:
    return ctx.metadata["verifications"][verifier_id]


# -- parsing (no engine) ------------------------------------------------------------------------

def test_pytest_short_summary_becomes_one_row_per_test():
    rows = parse_pytest_summary(PYTEST_OUTPUT)
    assert [(r["id"], r["outcome"], r.get("result")) for r in rows] == [
        ("tests/test_app.py::test_add", "passed", True),
        ("tests/test_app.py::test_sub[1-2]", "passed", True),
        ("tests/test_app.py:20", "skipped", None),
        ("tests/test_app.py::test_known", "xfailed", True),
        ("tests/test_app.py::test_div", "failed", False),
    ]
    assert rows[4]["message"] == "assert 1 == 2" and rows[2]["skipped"] is True
    assert parse_pytest_summary("no summary here\nPASSED x::y\n") == []


def test_junit_xml_becomes_one_row_per_test():
    rows = parse_junit_xml(JUNIT_XML)
    assert [(r["id"], r["outcome"], r.get("score")) for r in rows] == [
        ("tests.test_app::test_add", "passed", 1.0),
        ("tests.test_app::test_div", "failed", 0.0),
        ("tests.test_app::test_gpu", "skipped", None),
    ]
    assert rows[1]["message"] == "assert 1 == 2"


@pytest.mark.parametrize(("step", "message"), [
    ({"type": "run_docker_container", "sandbox_name": "box"},
     "Must pass exactly one of `docker_context_artifact_id` or `docker_context_url`"),
    ({"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "docker_context_artifact_id": "web"},
     "Pass `image` or a docker context"),
    ({"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "command_override": "x",
      "keep_alive_with_base_command": True}, "Pass either `command_override` or `keep_alive_with_base_command`"),
    ({"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "volumes": ["data:/data"]},
     "SRC and DST must be absolute paths"),
    ({"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "env_vars": {"A-B": "1"}},
     "env_vars key 'A-B' is not a POSIX name"),
    ({"type": "run_container_unit_tests_verifier", "sandbox_name": "box", "container_name": "c", "command": "true"},
     "no step it depends on writes container 'box/c'"),
])
def test_documents_refused_at_load(tmp_path, step, message):
    config = project(tmp_path)
    path = tmp_path / "task.json"
    path.write_text(json.dumps([BOX, {"id": "s", **step}]))
    with pytest.raises(TaskLoadError, match=message):
        load_plan(path, config)


def test_without_an_engine_the_step_fails_saying_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    config = project(tmp_path)
    with pytest.raises(StepFailed, match="no Docker engine at unix:///nonexistent/docker.sock"):
        run(tmp_path, config, [BOX, {"id": "c", "type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX}])


# -- against the engine -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_built_container_serves_the_task_and_its_unit_tests_grade_it(docker_engine, tmp_path):
    config = project(tmp_path)
    junit = JUNIT_XML.replace('"', '\\"')
    steps = [
        BOX,
        {"id": "web", "type": "run_docker_container", "sandbox_name": "box", "container_name": "app",
         "docker_context_artifact_id": "web", "build_args": {"FLAVOUR": "spicy"}, "env_vars": {"GREETING": "hi"},
         "volumes": ["/app/shared:/shared"], "ready_command": "test -f /tmp/ready", "ports": [8000]},
        {"id": "tests", "type": "run_container_unit_tests_verifier", "sandbox_name": "box", "container_name": "app",
         "verifier_id": "unit", "score_aggregator": "weighted_average",
         "setup_commands": ["cp /flavour /shared/flavour"], "env_vars": {"SUITE": "app"},
         "command": (f"sh hello.sh > /shared/hello.txt; echo \"$GREETING $SUITE $(id -u)\" > /shared/env.txt; "
                     f"printf '%s' '{PYTEST_OUTPUT}'; exit 1"),
         "result_paths": ["/flavour", "/missing.json"]},
        {"id": "junit", "type": "run_container_unit_tests_verifier", "sandbox_name": "box", "container_name": "app",
         "command": f"echo \"{junit}\" > /tmp/report.xml", "junit_xml_path": "/tmp/report.xml"},
    ]
    ctx = run(tmp_path, config, steps)

    assert "failed_steps" not in ctx.metadata
    [container] = ctx.metadata["deployed_docker_containers"]
    assert {k: container[k] for k in ("container_name", "sandbox_name", "image_tag", "ports", "status", "step_id")} == {
        "container_name": "app", "sandbox_name": "box", "image_tag": "app:latest", "ports": [8000],
        "status": "running", "step_id": "web",
    }
    assert container["sandbox_id"] == ctx.deployed_sandboxes[0].sandbox_id
    assert container["working_dir"] == "/app"
    assert container["port_urls"]["8000"].startswith("http://127.0.0.1:")
    shared = Path(ctx.deployed_sandboxes[0].sandbox_root) / "app" / "shared"
    # The sandbox folder is mounted; the command ran in the image's WORKDIR, as the user, with env.
    assert (shared / "hello.txt").read_text() == "hello from the image\n"
    assert (shared / "env.txt").read_text() == "hi app 0\n"
    assert (shared / "flavour").read_text() == "spicy\n"

    unit = entry(ctx, "unit")
    # Per-test rows from the -rA summary: a failing test is a graded 0 for that row, not a step error.
    assert [(r["id"], r["outcome"]) for r in unit["results"]] == [
        ("tests/test_app.py::test_add", "passed"), ("tests/test_app.py::test_sub[1-2]", "passed"),
        ("tests/test_app.py:20", "skipped"), ("tests/test_app.py::test_known", "xfailed"),
        ("tests/test_app.py::test_div", "failed"),
    ]
    assert unit["score"] == 0.75  # 3 of 4 counted rows pass; the skipped one is left out
    assert (unit["exit_code"], unit["timed_out"], unit["graded"]) == (1, False, True)
    assert unit["tests"] == {"source": "pytest", "total": 5, "failed": 1, "passed": 2, "skipped": 1, "xfailed": 1}
    assert unit["extracted_files"] == {"/flavour": "spicy\n", "/missing.json": None}
    assert unit["stdout_head"].startswith("=====")
    stdout_path = Path(unit["stdout_artifact"]["object_url"].removeprefix("file://"))
    assert "short test summary info" in stdout_path.read_text()

    report = entry(ctx, "junit")
    assert [(r["id"], r["outcome"]) for r in report["results"]] == [
        ("tests.test_app::test_add", "passed"), ("tests.test_app::test_div", "failed"),
        ("tests.test_app::test_gpu", "skipped"),
    ]
    assert (report["score"], report["tests"]["source"]) == (0.0, "junit")  # all_pass
    assert containers_of(ctx.metadata["run_group_id"]) == []  # torn down with the run


@pytest.mark.slow
def test_exit_code_reward_and_timeout_modes_in_a_container_sandbox(docker_engine, tmp_path):
    config = project(tmp_path)
    sandbox = {**BOX, "container": {"image": BUSYBOX}}
    verifier = {"type": "run_container_unit_tests_verifier", "sandbox_name": "box", "fail_task_on_error": False}
    steps = [
        sandbox,
        {"id": "ok", **verifier, "command": "test -d /work && echo fine"},
        {"id": "who", **verifier, "command": "test $(id -u) = 1234", "user": "1234"},
        {"id": "bad", **verifier, "command": "echo broken >&2; exit 3"},
        {"id": "reward", **verifier, "command": "echo 0.5 > /tmp/reward.txt; exit 1", "reward_path": "/tmp/reward.txt"},
        {"id": "noreward", **verifier, "command": "true", "reward_path": "/tmp/none.txt"},
        {"id": "slow", **verifier, "command": "echo started; sleep 30", "timeout_sec": 1},
        {"id": "setup", **verifier, "command": "true", "setup_commands": ["exit 7"]},
    ]
    ctx = run(tmp_path, config, steps)

    ok, bad = entry(ctx, "ok"), entry(ctx, "bad")
    assert ok["results"] == [{"id": "exit_code", "score": 1.0, "result": True, "message": "exit_code=0 timed_out=False"}]
    assert (ok["score"], ok["stdout_head"]) == (1.0, "fine\n")
    assert entry(ctx, "who")["score"] == 1.0  # ran as the step's `user`
    # A non-zero exit with nothing else to grade by: recorded, then the step fails (upstream).
    assert (bad["score"], bad["exit_code"], bad["stderr_head"]) == (0.0, 3, "broken\n")
    reward, noreward = entry(ctx, "reward"), entry(ctx, "noreward")
    assert reward["results"] == [{"id": "reward", "score": 0.5, "result": False,
                                  "message": "reward=0.5 (exit_code=1 timed_out=False)"}]
    assert reward["score"] == 0.5
    assert noreward["score"] == 0.0 and "missing or non-numeric" in noreward["results"][0]["message"]
    slow = entry(ctx, "slow")
    assert (slow["timed_out"], slow["stdout_head"], slow["score"]) == (True, "started\n", 0.0)
    assert "setup" not in ctx.metadata["verifications"]
    failures = {f["step_id"]: f["error"] for f in ctx.metadata["failed_steps"]}
    assert failures["bad"].startswith("Verifier 'bad' exited 3; stderr (last 1500 chars):\nbroken")
    assert failures["slow"] == "Verifier 'slow' timed out after 1s"
    assert failures["setup"].startswith("Verifier 'setup' setup command 1 exited 7")
    assert set(failures) == {"bad", "slow", "setup"}
    assert containers_of(ctx.metadata["run_group_id"]) == []


def test_a_container_mode_sandbox_is_tested_in_its_own_container_and_hosts_none(docker_engine, tmp_path):
    config = project(tmp_path)
    steps = [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container",
         "image": BUSYBOX, "port": 8000, "env_vars": {"SUITE": "app"}},
        {"id": "tests", "type": "run_container_unit_tests_verifier", "sandbox_name": "box", "verifier_id": "unit",
         "command": 'test "$SUITE" = app && pwd'},
        {"id": "web", "type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX,
         "fail_task_on_error": False},
        {"id": "load", "type": "load_artifact", "sandbox_name": "box", "artifact_id": "web",
         "fail_task_on_error": False},
    ]
    ctx = run(tmp_path, config, steps)

    unit = entry(ctx, "unit")
    # the sandbox's env_vars reach the exec; it runs in the image's WORKDIR (none: /)
    assert (unit["score"], unit["stdout_head"]) == (1.0, "/\n")
    failures = {f["step_id"]: f["error"] for f in ctx.metadata["failed_steps"]}
    assert failures == {
        "web": "Cannot run docker container on sandbox 'box' (mode='container'); only VM-mode sandboxes "
               "support docker build/run",
        "load": "Sandbox 'box' is a container-mode sandbox: its files live in its container, with no local "
                "folder (use a vm-mode sandbox for this step)",
    }
    assert containers_of(ctx.metadata["run_group_id"]) == []


@pytest.mark.slow
def test_wait_for_exit_records_the_outcome_and_fails_on_a_bad_exit(docker_engine, tmp_path):
    config = project(tmp_path)
    once = {"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "wait_for_exit": True,
            "fail_task_on_error": False, "volumes": ["/out:/out"]}
    steps = [
        BOX,
        {"id": "good", **once, "container_name": "good", "command_override": "sh -c 'echo $X > /out/x.txt'",
         "env_vars": {"X": "42"}},
        {"id": "bad", **once, "container_name": "bad", "command_override": "sh -c 'echo out; echo err >&2; exit 3'"},
        {"id": "slow", **once, "container_name": "slow", "command_override": "sleep 30", "timeout_seconds": 1},
    ]
    ctx = run(tmp_path, config, steps)

    records = {c["container_name"]: c for c in ctx.metadata["deployed_docker_containers"]}
    assert (records["good"]["status"], records["good"]["exit_code"]) == ("exited", 0)
    assert (Path(ctx.deployed_sandboxes[0].sandbox_root) / "out" / "x.txt").read_text() == "42\n"
    assert (records["bad"]["exit_code"], records["bad"]["stdout_head"], records["bad"]["stderr_head"]) == (3, "out\n", "err\n")
    assert (records["slow"]["status"], records["slow"]["timed_out"]) == ("timed_out", True)
    failures = {f["step_id"]: f["error"] for f in ctx.metadata["failed_steps"]}
    assert failures == {
        "bad": "Container 'bad' exited 3; stderr (last 1500 chars):\nerr\n",
        "slow": "Container 'slow' did not exit within 1.0s",
    }
    assert containers_of(ctx.metadata["run_group_id"]) == []


@pytest.mark.slow
def test_a_ready_command_waits_for_the_container_and_reports_one_that_stops_first(docker_engine, tmp_path):
    config = project(tmp_path)
    service = {"type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX, "fail_task_on_error": False,
               "ready_command": "test -f /tmp/ready", "ready_timeout_seconds": 20}
    steps = [
        BOX,
        {"id": "late", **service, "container_name": "late",
         "command_override": "sh -c 'sleep 1; touch /tmp/ready; exec sleep 1000'"},
        {"id": "crash", **service, "container_name": "crash",
         "command_override": "sh -c 'echo cannot bind the port; exit 4'"},
    ]
    ctx = run(tmp_path, config, steps)

    [record] = ctx.metadata["deployed_docker_containers"]
    assert (record["container_name"], record["status"]) == ("late", "running")
    failures = {f["step_id"]: f["error"] for f in ctx.metadata["failed_steps"]}
    assert failures == {"crash": "container crash exited (code 4) before it was ready; last output: cannot bind the port\n"}
    assert containers_of(ctx.metadata["run_group_id"]) == []


@pytest.mark.slow
def test_a_fatal_failure_later_in_the_run_still_ends_the_container(docker_engine, tmp_path):
    config = project(tmp_path)
    steps = [
        BOX,
        {"id": "svc", "type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX,
         "keep_alive_with_base_command": True, "ready_command": "true"},
        {"id": "check", "type": "run_container_unit_tests_verifier", "sandbox_name": "box",
         "container_name": "task-container", "command": "exit 2"},
        {"id": "after", "type": "deploy_sandbox", "sandbox_name": "later", "sandbox_mode": "vm"},
    ]
    ctx = TaskStepContext()
    with pytest.raises(StepFailed, match="Verifier 'check' exited 2"):
        run(tmp_path, config, steps, ctx)
    assert entry(ctx, "check")["score"] == 0.0  # recorded before failing
    assert [s.sandbox_name for s in ctx.deployed_sandboxes] == ["box"]  # the step after never ran
    assert containers_of(ctx.metadata["run_group_id"]) == []


@pytest.mark.slow
def test_tearing_down_a_sandbox_mid_run_ends_its_containers(docker_engine, tmp_path):
    config = project(tmp_path)
    steps = [
        BOX,
        {"id": "svc", "type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX,
         "keep_alive_with_base_command": True, "ready_command": "true"},
        {"id": "down", "type": "teardown_sandboxes", "sandbox_names": ["box"]},
        {"id": "probe", "type": "deploy_sandbox", "sandbox_name": "later", "sandbox_mode": "vm"},
    ]
    ctx = run(tmp_path, config, steps)
    [container] = ctx.metadata["deployed_docker_containers"]
    assert container["instance_id"] in ctx.metadata["torn_down_sandbox_ids"]
    assert ctx.deployed_sandboxes[0].instance_id in ctx.metadata["torn_down_sandbox_ids"]
    assert containers_of(ctx.metadata["run_group_id"]) == []


@pytest.mark.slow
def test_cancelling_the_run_ends_the_container(docker_engine, tmp_path):
    config = project(tmp_path)
    path = tmp_path / "task.json"
    path.write_text(json.dumps([
        BOX,
        {"id": "svc", "type": "run_docker_container", "sandbox_name": "box", "image": BUSYBOX,
         "command_override": "sleep 1000"},
        {"id": "gate", "type": "review", "timeout_seconds": 600, "poll_interval_seconds": 0.1},
    ]))
    run_id = uuid.uuid4().hex

    async def cancel_while_waiting() -> list:
        task = asyncio.create_task(run_plan(load_plan(path, config), config, run_id=run_id))
        awaiting = config.state_dir / "runs" / run_id / "reviews" / "awaiting"
        for _ in range(600):
            if awaiting.is_dir() and any(awaiting.iterdir()):
                break
            await asyncio.sleep(0.05)
        running = await asyncio.to_thread(containers_of, run_id)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return running

    running = asyncio.run(cancel_while_waiting())
    assert len(running) == 1 and running[0].status == "running"
    assert containers_of(run_id) == []


@pytest.mark.slow
def test_through_dagster_the_verification_is_an_asset_with_its_score(docker_engine, tmp_path):
    import dagster as dg

    from agentenv_dagster.orchestration.execute import execute_plan

    config = project(tmp_path)
    path = tmp_path / "containers.json"
    path.write_text(json.dumps([
        {**BOX, "container": {"image": BUSYBOX}},
        {"id": "tests", "type": "run_container_unit_tests_verifier", "sandbox_name": "box", "verifier_id": "unit",
         "score_aggregator": "weighted_average", "command": f"printf '%s' '{PYTEST_OUTPUT}'; exit 1"},
    ]))
    with dg.instance_for_test() as instance:
        result = execute_plan(load_plan(path, config), config, instance=instance, output_dir=tmp_path / "out")
        assert result.success, result.summary()
        event = instance.get_latest_materialization_event(dg.AssetKey(["verifications", "containers", "unit"]))
    metadata = event.asset_materialization.metadata
    assert metadata["score"].value == 0.75
    assert result.context.metadata["verifications"]["unit"]["tests"]["failed"] == 1
    assert containers_of(result.run_id) == []
