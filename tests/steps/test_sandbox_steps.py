"""deploy_sandbox, load_artifact into a sandbox and verify_sandbox, run for real by the asyncio
walker: the upstream ``hello`` example, its failing twin, and each probe kind; container-mode
sandboxes against a real, private Docker engine (the session ``docker_engine`` fixture, which
skips where Docker cannot run)."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
from pathlib import Path

import docker
import httpx
import psutil
import pytest
from test_container_steps import containers_of

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runner import run_plan
from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.steps.execution import StepFailed
from projects import FIXTURES

HELLO = FIXTURES / "agentenv" / "sandbox_greeting.json"
SLEEP_MARK = "29.125"  # a sleep duration no other process uses, to find leftovers by
# The container test's own: its sleeps show in this machine's process table while its container
# lives, and tests run in parallel.
CONTAINER_SLEEP_MARK = "29.375"
BUSYBOX = "agentenv-sandbox:busybox"
# An image whose files exist only inside it and whose own command serves port 8000.
SERVED = "agentenv-sandbox:probe-served"
SERVED_DOCKERFILE = f"""FROM {BUSYBOX}
RUN mkdir -p /app /srv/www && echo 'hello from the image' > /app/hello.txt && echo served > /srv/www/index.html
WORKDIR /app
CMD ["httpd", "-f", "-p", "8000", "-h", "/srv/www"]
"""


def project(tmp_path: Path, check_exit: int = 0):
    """A project whose bundle artifact ``greeting`` holds hello.txt and check.sh."""
    (tmp_path / ".agentenv").mkdir()
    (tmp_path / ".agentenv" / "config.toml").write_text(
        '[stores]\nstate_dir = "state"\nartifact_dirs = ["bundles"]\n'
    )
    greeting = tmp_path / "bundles" / "greeting"
    greeting.mkdir(parents=True)
    (greeting / "hello.txt").write_text("hello, world\n")
    (greeting / "check.sh").write_text(f"grep -q world hello.txt\nexit {check_exit}\n")
    return load_config(tmp_path)


def plan_of(tmp_path: Path, config, steps: list[dict]):
    path = tmp_path / "task.json"
    path.write_text(json.dumps(steps))
    return load_plan(path, config)


def run(plan, config, ctx: TaskStepContext | None = None, run_id: str | None = None):
    return asyncio.run(run_plan(plan, config, context=ctx, run_id=run_id))


@pytest.fixture(scope="module")
def served_image(docker_engine):
    """The image of container-mode tests, built locally on the busybox image."""
    client = docker.from_env()
    try:
        client.images.build(fileobj=io.BytesIO(SERVED_DOCKERFILE.encode()), tag=SERVED, rm=True, pull=False)
        yield SERVED
    finally:
        client.images.remove(SERVED, force=True)
        client.close()


def test_hello_example_passes(tmp_path):
    config = project(tmp_path)
    ctx = run(load_plan(HELLO, config), config)

    assert "failed_steps" not in ctx.metadata
    [sandbox] = ctx.deployed_sandboxes
    assert (sandbox.sandbox_name, sandbox.sandbox_mode, sandbox.sandbox_type) == ("box", "vm", "local")
    root = Path(sandbox.sandbox_root)
    assert root.parent == config.state_dir / "runs" / ctx.metadata["run_group_id"] / "sandboxes"
    assert (root / "app" / "greeting" / "hello.txt").read_text() == "hello, world\n"
    assert ctx.metadata["loaded_file_artifact_universes"] == [{
        "id": "greeting", "version": 1, "artifact_type": "file_artifact_universe", "env_id": None,
        "agent_name": None, "sandbox_name": "box", "destination_path": "/app/greeting",
        "files": ["check.sh", "hello.txt"],
    }]
    entry = ctx.metadata["verifications"]["hello"]
    assert (entry["score"], entry["score_aggregator"], entry["graded"]) == (1.0, "all_pass", True)
    greets, check = entry["results"]
    assert greets == {
        "type": "probe_file_contains", "criterion": "greets", "paths": ["hello.txt"], "expected": "hello",
        "criterion_index": 0, "score": 1.0, "result": True, "justification": "contains 'hello'",
        "skipped": False,
    }
    assert (check["criterion_index"], check["result"], check["justification"]) == (1, True, "exit=0; output=")


def test_hello_example_scores_zero_when_its_check_fails(tmp_path):
    config = project(tmp_path, check_exit=1)
    ctx = run(load_plan(HELLO, config), config)

    entry = ctx.metadata["verifications"]["hello"]
    assert entry["score"] == 0.0
    assert [r["result"] for r in entry["results"]] == [True, False]
    assert entry["results"][1]["justification"].startswith("exit=1")


def test_each_probe_kind_and_skipped_criteria(tmp_path):
    config = project(tmp_path)
    steps = [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"},
        {"id": "load", "type": "load_artifact", "sandbox_name": "box", "artifact_id": "greeting"},
        {"id": "check", "type": "verify_sandbox", "sandbox_name": "box", "base_dir": "/loaded",
         "shell_timeout_seconds": 1, "score_aggregator": "weighted_average", "criteria": [
             {"type": "probe_file_exists", "paths": ["hello.txt", "/loaded/check.sh"]},
             {"type": "probe_dir_exists", "paths": ["/loaded"]},
             {"type": "probe_file_exists", "paths": ["hello.txt", "gone.txt"]},
             {"type": "probe_file_contains", "paths": ["hello.txt"], "value": "^hello, w"},
             {"type": "response_contains", "needles": ["hi"]},
             {"type": "bash_cmd_succeeds", "bash_cmd": f"sleep {SLEEP_MARK} & sleep {SLEEP_MARK}"},
             {"type": "probe_file_exists", "paths": ["../../escape"]},
         ]},
    ]
    started = time.monotonic()
    ctx = run(plan_of(tmp_path, config, steps), config)

    # A sleep left holding the output pipe would keep the run waiting for it.
    assert time.monotonic() - started < 10
    rows = ctx.metadata["verifications"]["check"]["results"]
    assert [r.get("result") for r in rows] == [True, True, False, True, None, False, False]
    assert rows[2]["justification"] == "Missing: ['gone.txt']"
    assert rows[4]["skipped"] is True and "score" not in rows[4]
    assert rows[5]["justification"] == "timed out after 1.0s"
    assert rows[6]["justification"].startswith("evaluator error: path")
    # The skipped row is left out: 3 of 6 scored rows pass.
    assert ctx.metadata["verifications"]["check"]["score"] == 0.5
    assert ctx.metadata["loaded_file_artifact_universes"][0]["destination_path"] == "/loaded"
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", SLEEP_MARK]]
    assert leftovers == []


def test_a_second_sandbox_of_one_name_fails_the_run(tmp_path):
    config = project(tmp_path)
    box = {"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm"}
    plan = plan_of(tmp_path, config, [{"id": "a", **box}, {"id": "b", **box}])

    with pytest.raises(StepFailed, match="Sandbox 'box' is already deployed"):
        run(plan, config)


@pytest.mark.parametrize(("step", "message"), [
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container", "image": "x"},
     "container-mode sandbox requires `image` and `port`"),
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "pod"}, "'vm' or 'container'"),
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container", "image": "x", "port": 80,
      "container": {"image": "x"}}, "`container` settings are for a vm-mode sandbox; container mode takes `image`"),
    ({"type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container", "image": "x", "port": 80,
      "env_vars": {"A-B": "1"}}, "env_vars key 'A-B' is not a POSIX name"),
    ({"type": "verify_sandbox", "sandbox_name": "box", "agent_name": "a"},
     "set either `agent_name` or `sandbox_name`, not both"),
    ({"type": "verify_sandbox", "sandbox_name": "box"}, "no step it depends on deploys sandbox 'box'"),
])
def test_documents_refused_at_load(tmp_path, step, message):
    config = project(tmp_path)
    with pytest.raises(TaskLoadError, match=message):
        plan_of(tmp_path, config, [{"id": "s", **step}])


# -- container-mode sandboxes against the engine --------------------------------------------------

def test_without_an_engine_a_container_sandbox_fails_naming_step_and_field(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    config = project(tmp_path)
    plan = plan_of(tmp_path, config, [{"id": "box", "type": "deploy_sandbox", "sandbox_name": "box",
                                       "sandbox_mode": "container", "image": BUSYBOX, "port": 8000}])
    with pytest.raises(StepFailed, match=(
        "deploy_sandbox 'box': field 'sandbox_mode': sandbox 'box' is a container and needs a Docker "
        "engine: no Docker engine at unix:///nonexistent/docker.sock"
    )):
        run(plan, config)


def test_a_container_is_written_in_the_run_s_ledger_before_the_engine_is_asked_for_it(tmp_path, monkeypatch):
    """A kill between the engine's start and the ledger's write could orphan a container: its
    name is written first (the engine finds a container by its name as by its id)."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    config = project(tmp_path)
    plan = plan_of(tmp_path, config, [{"id": "box", "type": "deploy_sandbox", "sandbox_name": "box",
                                       "sandbox_mode": "container", "image": BUSYBOX, "port": 8000}])
    run_id = uuid.uuid4().hex
    with pytest.raises(StepFailed, match="needs a Docker engine"):
        run(plan, config, TaskStepContext(), run_id)
    (entry,) = Ledger.of_run(config.state_dir / "runs" / run_id).entries().values()
    assert entry["kind"] == "container" and entry["container_id"].startswith("agentenv-")


def test_an_image_not_built_locally_fails_naming_the_image_field(docker_engine, tmp_path):
    config = project(tmp_path)
    plan = plan_of(tmp_path, config, [{"id": "box", "type": "deploy_sandbox", "sandbox_name": "box",
                                       "sandbox_mode": "container", "image": "python:3.11", "port": 8000}])
    ctx, run_id = TaskStepContext(), uuid.uuid4().hex
    with pytest.raises(StepFailed, match=(
        "deploy_sandbox 'box': field 'image': image 'python:3.11' is not present locally and no registry is reachable"
    )):
        run(plan, config, ctx, run_id)
    assert ctx.deployed_sandboxes == [] and containers_of(run_id) == []


def test_a_container_sandbox_runs_its_image_and_is_probed_inside_it(served_image, tmp_path):
    config = project(tmp_path)
    steps = [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "container",
         "image": served_image, "port": 8000, "exposed_ports": [9000], "cpu": 0.5, "memory_mb": 128,
         "env_vars": {"GREETING": "hi"}},
        {"id": "check", "type": "verify_sandbox", "sandbox_name": "box", "shell_timeout_seconds": 2,
         "score_aggregator": "weighted_average", "criteria": [
             {"type": "probe_file_exists", "paths": ["hello.txt", "/srv/www/index.html", "../srv/www"]},
             {"type": "probe_dir_exists", "paths": ["/srv/www", "hello.txt"]},
             {"type": "probe_file_contains", "paths": ["hello.txt"], "expected": "^hello from the i"},
             {"type": "probe_file_contains", "paths": ["gone.txt"], "expected": "x"},
             {"type": "bash_cmd_succeeds", "bash_cmd": 'test -f /srv/www/index.html && test "$GREETING" = hi && pwd'},
             {"type": "bash_cmd_succeeds", "bash_cmd": f"sleep {CONTAINER_SLEEP_MARK} & sleep {CONTAINER_SLEEP_MARK}"},
             {"type": "bash_cmd_succeeds", "bash_cmd": f"! ps | grep '[s]leep {CONTAINER_SLEEP_MARK}'"},
             {"type": "rubric", "criterion": "left to a judge"},
         ]},
        {"id": "gate", "type": "review", "timeout_seconds": 600, "poll_interval_seconds": 0.1},
    ]
    plan = plan_of(tmp_path, config, steps)
    ctx, run_id = TaskStepContext(), uuid.uuid4().hex

    async def while_deployed() -> tuple[str, dict]:
        """Run up to the review gate; there read the port through its tunnel URL and inspect
        the container, then cancel the run."""
        task = asyncio.create_task(run_plan(plan, config, context=ctx, run_id=run_id))
        awaiting = config.state_dir / "runs" / run_id / "reviews" / "awaiting"
        while not (awaiting.is_dir() and any(awaiting.iterdir())):
            if task.done():  # failed before the gate
                await task
            await asyncio.sleep(0.05)
        [container] = await asyncio.to_thread(containers_of, run_id)
        url = ctx.deployed_sandboxes[0].model_extra["tunnel_urls"]["8000"]
        body = ""
        async with httpx.AsyncClient() as client:
            for _ in range(100):  # httpd may still be binding its port
                try:
                    body = (await client.get(url, timeout=2)).text
                    break
                except httpx.HTTPError:
                    await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return body, container.attrs

    body, attrs = asyncio.run(while_deployed())

    [sandbox] = ctx.deployed_sandboxes
    extra = sandbox.model_extra
    assert (sandbox.sandbox_mode, sandbox.sandbox_type) == ("container", "docker")
    assert "sandbox_root" not in extra  # the files are the image's, not a host folder's
    assert set(extra["tunnel_urls"]) == {"8000", "9000"}
    assert (extra["container"]["image"], extra["container"]["working_dir"]) == (served_image, "/app")
    assert body == "served\n"  # the image's own command serves the port
    host = attrs["HostConfig"]
    assert (host["NanoCpus"], host["Memory"]) == (500_000_000, 128 * 2**20)
    assert "GREETING=hi" in attrs["Config"]["Env"]
    assert all(b[0]["HostIp"] == "127.0.0.1" for b in host["PortBindings"].values())

    rows = ctx.metadata["verifications"]["check"]["results"]
    assert [r.get("result") for r in rows] == [True, False, True, False, True, False, True, None]
    assert rows[1]["justification"] == "Missing: ['hello.txt']"  # a file, not a dir
    assert rows[3]["justification"].startswith("could not read gone.txt:")
    assert rows[4]["justification"] == "exit=0; output=/app\n"  # in the container, in base_dir, with env_vars
    assert rows[5]["justification"] == "timed out after 2.0s"
    assert rows[7]["skipped"] is True
    assert ctx.metadata["verifications"]["check"]["score"] == 4 / 7
    assert containers_of(run_id) == []  # cancelling the run ended it


def test_a_vm_sandbox_with_container_settings_is_probed_in_its_container(docker_engine, tmp_path):
    config = project(tmp_path)
    steps = [
        {"id": "box", "type": "deploy_sandbox", "sandbox_name": "box", "sandbox_mode": "vm",
         "container": {"image": BUSYBOX}},
        {"id": "load", "type": "load_artifact", "sandbox_name": "box", "artifact_id": "greeting",
         "destination_path": "/app/greeting"},
        {"id": "check", "type": "verify_sandbox", "sandbox_name": "box", "base_dir": "/app/greeting",
         "criteria": [
             {"type": "probe_file_contains", "paths": ["hello.txt"], "expected": "world"},
             # busybox has no bash (nor python): sh runs it, in the container, where the folder is mounted
             {"type": "bash_cmd_succeeds", "bash_cmd": "! command -v python3 && pwd && sh check.sh"},
             {"type": "probe_file_exists", "paths": ["../../../etc/passwd"]},
         ]},
    ]
    run_id = uuid.uuid4().hex
    ctx = run(plan_of(tmp_path, config, steps), config, TaskStepContext(), run_id)

    rows = ctx.metadata["verifications"]["check"]["results"]
    assert [r["result"] for r in rows] == [True, True, False]
    assert rows[1]["justification"] == "exit=0; output=/work/app/greeting\n"
    assert rows[2]["justification"].startswith("evaluator error: path")  # may not leave the mount
    assert containers_of(run_id) == []
