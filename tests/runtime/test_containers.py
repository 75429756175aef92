"""Container sandboxes against a real, private Docker engine started for this module.

The engine and its busybox image are made by ``scripts/docker_engine.sh``; where Docker cannot
be installed or started the module is skipped with the script's reason.
"""

from __future__ import annotations

import time

import docker
import docker.errors
import pytest

from agentenv_dagster.runtime.containers import ContainerSandbox, MissingImageError

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

IMAGE = "agentenv-sandbox:busybox"


@pytest.fixture
def sandbox(docker_engine, tmp_path):
    with ContainerSandbox.start(IMAGE, tmp_path, run_id="run-1", instance_id="task-a") as box:
        yield box


def _inspect(container_id: str) -> dict:
    client = docker.from_env()
    try:
        return client.api.inspect_container(container_id)
    finally:
        client.close()


def _interfaces(proc_net_dev: str) -> list[str]:
    return [line.split(":")[0].strip() for line in proc_net_dev.splitlines()[2:]]


async def test_workspace_is_the_working_dir_both_ways(sandbox, tmp_path):
    (tmp_path / "from_host.txt").write_text("hello from the host\n")
    result = await sandbox.exec("pwd; cat from_host.txt; echo written > from_container.txt", timeout=10)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "/work\nhello from the host\n"
    assert (tmp_path / "from_container.txt").read_text() == "written\n"


async def test_exit_code_streams_and_env(docker_engine, tmp_path):
    with ContainerSandbox.start(IMAGE, tmp_path, env={"FROM_START": "s"}) as box:
        result = await box.exec(
            'echo "out $FROM_START $FROM_EXEC"; echo err >&2; exit 3', timeout=10, env={"FROM_EXEC": "e"}
        )
    assert result.exit_code == 3
    assert result.stdout == "out s e\n"
    assert result.stderr == "err\n"
    assert result.timed_out is False


async def test_timeout_kills_the_command_and_its_children(sandbox):
    began = time.monotonic()
    result = await sandbox.exec("echo started; sleep 31 & sleep 32; echo never", timeout=1)
    assert time.monotonic() - began < 10
    assert result.timed_out is True
    assert result.exit_code != 0
    assert result.stdout == "started\n"
    processes = await sandbox.exec("ps", timeout=10)
    assert "sleep 31" not in processes.stdout and "sleep 32" not in processes.stdout


async def test_network_none_leaves_only_loopback(sandbox, docker_engine, tmp_path):
    bridged = await sandbox.exec("cat /proc/net/dev", timeout=10)
    assert "eth0" in _interfaces(bridged.stdout)
    with ContainerSandbox.start(IMAGE, tmp_path, network="none") as box:
        isolated = await box.exec("cat /proc/net/dev", timeout=10)
    assert _interfaces(isolated.stdout) == ["lo"]


async def test_limits_and_labels_reach_the_container(docker_engine, tmp_path):
    with ContainerSandbox.start(
        IMAGE, tmp_path, memory_mb=64, cpus=0.5, pids=32, run_id="run-1", instance_id="task-a"
    ) as box:
        info = _inspect(box.container_id)
        # Touching 100 MB under a 64 MB limit gets the process OOM-killed (SIGKILL: 137).
        oom = await box.exec("dd if=/dev/zero of=/dev/null bs=100M count=1", timeout=30)
    host = info["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (64 * 2**20, 500_000_000, 32)
    assert info["Config"]["Labels"] == {"agentenv.run_id": "run-1", "agentenv.instance_id": "task-a"}
    assert info["Name"].startswith("/agentenv-task-a-")
    assert info["Mounts"][0]["Destination"] == "/work" and info["Mounts"][0]["RW"] is True
    assert oom.exit_code == 137


async def test_pids_limit_stops_a_fork_loop(docker_engine, tmp_path):
    loop = (
        "i=0; while [ $i -lt 200 ]; do sleep 20 </dev/null >/dev/null 2>&1 & i=$((i+1)); done;"
        " echo spawned $i"
    )
    with ContainerSandbox.start(IMAGE, tmp_path, pids=16) as box:
        result = await box.exec(loop, timeout=30)
    assert result.timed_out is False
    assert result.exit_code != 0
    assert "spawned" not in result.stdout
    assert "can't fork" in result.stderr


def test_stop_removes_the_container(docker_engine, tmp_path):
    box = ContainerSandbox.start(IMAGE, tmp_path)
    assert _inspect(box.container_id)["State"]["Running"] is True
    box.stop()
    with pytest.raises(docker.errors.NotFound):
        _inspect(box.container_id)
    box.stop()


def test_missing_image_says_how_to_build_it(docker_engine, tmp_path):
    with pytest.raises(MissingImageError) as caught:
        ContainerSandbox.start("agentenv-sandbox:absent", tmp_path)
    assert str(caught.value) == (
        "image 'agentenv-sandbox:absent' is not present locally and no registry is reachable: "
        "build it (scripts/docker_engine.sh image)"
    )


def test_unknown_network_is_refused(tmp_path):
    with pytest.raises(ValueError, match="bridge, none"):
        ContainerSandbox.start(IMAGE, tmp_path, network="host")
