"""Task containers for ``run_docker_container``: images built from a task's Docker context, containers run from them.

Upstream drives the ``docker`` CLI on a VM sandbox; here the VM is a folder of the run and the engine the one
``DOCKER_HOST`` names. Nothing is pulled (``FROM`` and ``image`` must be local). Every call blocks.
"""

from __future__ import annotations

import io
import tarfile
from contextlib import closing, suppress
from pathlib import Path

import docker
import docker.errors
import requests.exceptions

from .containers import (
    ContainerSandbox, ContainerSandboxError, ExecResult, _client, _name_part, create_started, image_config,
)

KEEP_ALIVE = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done"  # PID 1 for execs; TERM ends it
LOCAL_NETWORKS = ("bridge", "none", "host")
MAX_FILE_BYTES = 10 * 2**20  # the largest file read_container_file takes out of a container


def build_image(context_dir: Path, dockerfile: str, tag: str, *, build_args: dict[str, str] | None,
                labels: dict[str, str]) -> str:
    """Build ``tag`` from ``context_dir`` (never pulling); the image id."""
    with closing(_client(timeout=600)) as client:
        try:
            image, _ = client.images.build(
                path=str(context_dir), dockerfile=dockerfile, tag=tag, buildargs=build_args or {},
                labels=labels, rm=True, forcerm=True, pull=False,
            )
            return image.id
        except docker.errors.BuildError as exc:
            lines = [str(chunk.get("stream") or chunk.get("error") or "").strip() for chunk in exc.build_log]
            tail = " | ".join(line for line in lines if line)[-1500:]
            raise ContainerSandboxError(f"docker build of '{tag}' failed: {exc.msg}; build log: {tail}") from None
        except docker.errors.APIError as exc:
            raise ContainerSandboxError(f"docker build of '{tag}' failed: {exc}") from None


def image_command(image: str) -> list[str]:
    """The image's ENTRYPOINT + CMD as one argv list (what ``docker run IMAGE`` would start)."""
    with closing(_client()) as client:
        config = image_config(client, image)
    return list(config.get("Entrypoint") or []) + list(config.get("Cmd") or [])


def run_container(
    image: str, *, name: str, command: list[str] | None, entrypoint: list[str] | None,
    environment: dict[str, str] | None, binds: dict[str, dict[str, str]], ports: list[int] | None,
    network: str | None, labels: dict[str, str], privileged: bool, cap_add: list[str], devices: list[str],
    shm_size: str | None,
) -> ContainerSandbox:
    """``docker run -d``, its ports on 127.0.0.1 at ports the engine picks (no two runs clash); a closed handle."""
    with closing(_client()) as client:
        image_config(client, image)
        container, port_urls = create_started(
            client, image, (ports or []) if network != "host" else [], command=command, entrypoint=entrypoint,
            name=_name_part(name), detach=True, environment=environment or {}, volumes=binds,
            network_mode=network or "bridge", labels=labels, privileged=privileged,
            cap_add=cap_add or None, devices=devices or None, shm_size=shm_size,
        )
        return ContainerSandbox(client, container.id, container.attrs["Config"].get("WorkingDir") or "/", port_urls)


def wait_container(container_id: str, timeout: float) -> ExecResult:
    """Wait up to ``timeout`` for the container's main process; past it, kill the container.
    Either way its output so far is returned (the container itself stays, for teardown)."""
    with closing(_client(timeout=max(timeout, 1) + 30)) as client:
        try:
            exit_code = client.api.wait(container_id, timeout=timeout)["StatusCode"]
        except docker.errors.NotFound:
            raise ContainerSandboxError(f"container {container_id[:12]} is gone") from None
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            exit_code = None  # timed out (the SDK surfaces its read timeout as a transport error)
            with suppress(docker.errors.APIError):  # it exited meanwhile
                client.api.kill(container_id)
        stdout = client.api.logs(container_id, stdout=True, stderr=False).decode("utf-8", "replace")
        stderr = client.api.logs(container_id, stdout=False, stderr=True).decode("utf-8", "replace")
        return ExecResult(exit_code, stdout, stderr, exit_code is None)


def read_container_file(container_id: str, path: str) -> bytes:
    """One regular file out of a container, running or stopped (``docker cp``)."""
    with closing(_client()) as client:
        try:
            stream, stat = client.api.get_archive(container_id, path)
        except docker.errors.NotFound:
            raise FileNotFoundError(f"{path} not found in the container") from None
        if stat.get("size", 0) > MAX_FILE_BYTES:
            raise ValueError(f"{path} is {stat['size']} bytes, over the {MAX_FILE_BYTES}-byte limit")
        data = b"".join(stream)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        if (member := next((m for m in archive.getmembers() if m.isfile()), None)) is None:
            raise IsADirectoryError(f"{path} is not a regular file")
        return archive.extractfile(member).read()
