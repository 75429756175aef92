"""Container sandboxes: one Docker container per sandbox, its workspace (if any) bind-mounted as working dir.

Backs Coder Eval's ``sandbox.driver: docker`` and agent-env's container-mode ``deploy_sandbox`` (the image's own
command, its ports published on 127.0.0.1). The engine is the one ``DOCKER_HOST`` names; images are never pulled.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

NETWORKS = ("bridge", "none")

# PID 1 must outlive every exec; trapping TERM lets `docker stop` end it at once. Arguments
# after it, if any, are the image's own command, started in the background (what serves a port).
_KEEP_ALIVE = "trap 'exit 0' TERM; [ $# -gt 0 ] && \"$@\" & while :; do sleep 3600 & wait $!; done"

# Every process an exec starts inherits this variable, so a timed-out command's whole tree is
# found through /proc/*/environ. The killer uses shell builtins only, so it needs no process
# beyond its own even at the pids limit; stopping each before killing any keeps a forking tree
# from growing while it is collected.
_MARKER_VAR = "AGENTENV_EXEC_ID"
_KILL_MARKED = r"""
m="$1"; round=0
while [ "$round" -lt 5 ]; do
  round=$((round + 1)); found=
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = "$$" ] && continue
    while IFS= read -r v || [ -n "$v" ]; do
      case "$v" in *"$m"*) kill -STOP "$p"; found="$found $p"; break ;; esac
    done 2>/dev/null <"$e"
  done
  [ -z "$found" ] && exit 0
  kill -KILL $found 2>/dev/null
done
"""


class ContainerSandboxError(RuntimeError):
    """The engine, the image or the container could not do what a sandbox needs."""


class NoEngineError(ContainerSandboxError):
    """No Docker engine answers at ``DOCKER_HOST``."""


class MissingImageError(ContainerSandboxError):
    """The image is not in the local engine, and pulling is impossible here."""


@dataclass(frozen=True)
class ExecResult:
    """What a command in a container (an exec, or its main process) exited with and printed."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool


def _client(timeout: float = 60.0) -> docker.DockerClient:
    """A client for the engine ``DOCKER_HOST`` names, or why there is none."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        raise NoEngineError(f"no Docker engine at {os.environ.get('DOCKER_HOST', 'unix:///var/run/docker.sock')}: "
                            f"{exc}") from exc
    return client


def container_name(instance_id: str | None) -> str:
    """A new container's unique name; the engine finds a container by it as by its id."""
    return "-".join(_name_part(part) for part in ("agentenv", instance_id, secrets.token_hex(4)) if part)


def _name_part(value: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)


def image_config(client: docker.DockerClient, image: str) -> dict:
    """The local image's ``Config`` (its ENTRYPOINT, CMD, WORKDIR …), or :class:`MissingImageError`."""
    try:
        return client.api.inspect_image(image)["Config"] or {}
    except docker.errors.ImageNotFound:
        raise MissingImageError(f"image '{image}' is not present locally and no registry is reachable: "
                                "build it (scripts/docker_engine.sh image)") from None


class ContainerSandbox:
    """A running container; commands run in ``working_dir`` (where a host workspace is mounted, if any)."""

    def __init__(self, client: docker.DockerClient, container_id: str, working_dir: str,
                 port_urls: dict[str, str] | None = None):
        self._client = client
        self.container_id = container_id
        self.working_dir = working_dir
        self.port_urls = port_urls or {}
        self._stopped = False

    @classmethod
    def attach(cls, container_id: str, working_dir: str | None = None) -> ContainerSandbox:
        """A handle on a container another process started, in ``working_dir`` or else the image's WORKDIR."""
        client = _client()
        if working_dir is None:
            try:
                working_dir = client.api.inspect_container(container_id)["Config"].get("WorkingDir") or "/"
            except docker.errors.NotFound:
                client.close()
                raise ContainerSandboxError(f"container {container_id[:12]} is gone") from None
        return cls(client, container_id, working_dir)

    @classmethod
    def start(
        cls, image: str, workspace: Path | None, working_dir: str | None = "/work", *, memory_mb: int | None = None,
        cpus: float | None = None, pids: int | None = None, network: str = "bridge", env: dict[str, str] | None = None,
        ports: list[int] | None = None, run_image_command: bool = False, run_id: str | None = None,
        instance_id: str | None = None, name: str | None = None,
    ) -> ContainerSandbox:
        """Create and start the container, idle until ``exec`` or ``stop``: ``workspace`` mounted at ``working_dir``
        (None without a workspace: the image's WORKDIR), ``ports`` published on 127.0.0.1 at ports the engine picks,
        with ``run_image_command`` the image's ENTRYPOINT+CMD started too, labelled with the run and instance."""
        if network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, not {network!r}")
        if working_dir is not None and not working_dir.startswith("/"):
            raise ValueError(f"working_dir must be an absolute path, not {working_dir!r}")
        volumes = {}
        if workspace is not None:
            workspace = Path(workspace).resolve()
            if not workspace.is_dir():
                raise ContainerSandboxError(f"workspace {workspace} is not a directory")
            volumes[str(workspace)] = {"bind": working_dir, "mode": "rw"}
        labels = {key: value for key, value in {"agentenv.run_id": run_id, "agentenv.instance_id": instance_id}.items()
                  if value is not None}
        memory = None if memory_mb is None else f"{memory_mb}m"  # swap = memory: a task can use that, not twice
        client = _client()
        try:
            config = image_config(client, image)
            own = list(config.get("Entrypoint") or []) + list(config.get("Cmd") or []) if run_image_command else []
            container, port_urls = create_started(
                client, image, ports or [], entrypoint=["/bin/sh", "-c", _KEEP_ALIVE, "sh", *own], command=[],
                name=name or container_name(instance_id), working_dir=working_dir, volumes=volumes,
                network_mode=network, environment=env or {}, labels=labels, mem_limit=memory, memswap_limit=memory,
                nano_cpus=None if cpus is None else int(cpus * 1e9), pids_limit=pids,
            )
        except ContainerSandboxError:
            client.close()
            raise
        return cls(client, container.id, working_dir or config.get("WorkingDir") or "/", port_urls)

    async def exec(
        self, command: str, timeout: float, env: dict[str, str] | None = None, user: str | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """Run ``sh -c command`` in ``workdir`` (else the working dir) as ``user`` (else the image's);
        past ``timeout`` kill it and all it started, and return what it printed with ``timed_out=True``."""
        api = self._client.api
        token = secrets.token_hex(8)
        exec_id = (await asyncio.to_thread(
            api.exec_create, self.container_id, ["/bin/sh", "-c", command],
            environment={**(env or {}), _MARKER_VAR: token}, workdir=workdir or self.working_dir, user=user or "",
        ))["Id"]
        # The SDK blocks until the exec's output closes, so it runs in a thread.
        output = asyncio.ensure_future(asyncio.to_thread(api.exec_start, exec_id, demux=True))
        done, _ = await asyncio.wait({output}, timeout=timeout)
        timed_out = not done
        if timed_out:
            await self._kill_marked(f"{_MARKER_VAR}={token}", exec_id)
            done, _ = await asyncio.wait({output}, timeout=10.0)  # its time to close its output, else given up
        stdout, stderr = output.result() if done else (None, None)
        exit_code = (await asyncio.to_thread(api.exec_inspect, exec_id))["ExitCode"]
        return ExecResult(exit_code, (stdout or b"").decode("utf-8", errors="replace"),
                          (stderr or b"").decode("utf-8", errors="replace"), timed_out)

    async def _kill_marked(self, marker: str, exec_id: str) -> None:
        """Kill every process carrying ``marker`` until the exec is no longer running."""
        api = self._client.api
        for _ in range(10):
            with contextlib.suppress(docker.errors.APIError):  # no pid left for the killer yet (pids limit): again
                killer = await asyncio.to_thread(
                    api.exec_create, self.container_id, ["/bin/sh", "-c", _KILL_MARKED, "sh", marker], user="0")
                await asyncio.to_thread(api.exec_start, killer["Id"])
            if not (await asyncio.to_thread(api.exec_inspect, exec_id))["Running"]:
                return
            await asyncio.sleep(0.2)

    def exited(self) -> tuple[int | None, str] | None:
        """None while the container runs; else its exit code and the last 50 lines it printed (a readiness report)."""
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
            return None if state.get("Running") else (
                state.get("ExitCode"), self._client.api.logs(self.container_id, tail=50).decode("utf-8", "replace"))
        except docker.errors.NotFound:
            return None, ""

    def close(self) -> None:
        """Let go of the engine connection; the container keeps running."""
        self._client.close()

    def stop(self) -> None:
        """Remove the container, running or not (the workspace stays on the host)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            remove(self._client, self.container_id)
        finally:
            self._client.close()

    def __enter__(self) -> ContainerSandbox:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def create_started(client: docker.DockerClient, image: str, ports: list[int], **settings):
    """A container of ``image`` created with ``settings`` and started (one that does not start is removed), and
    ``{container port: http://127.0.0.1:<host port>}`` of its ``ports``, published at ports the engine picks."""
    try:
        container = client.containers.create(image, ports={f"{port}/tcp": ("127.0.0.1", None) for port in ports},
                                             **settings)
    except docker.errors.APIError as exc:
        raise ContainerSandboxError(f"could not create a container from '{image}': {exc}") from exc
    try:
        container.start()
        container.reload()
    except docker.errors.APIError as exc:
        remove(client, container.id)
        raise ContainerSandboxError(f"container from '{image}' did not start: {exc}") from exc
    bound = (container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
    return container, {str(port): f"http://127.0.0.1:{bindings[0]['HostPort']}"
                       for port in ports if (bindings := bound.get(f"{port}/tcp"))}


def remove(client: docker.DockerClient, container_id: str) -> None:
    """Remove the container, running or not; one already gone is fine."""
    with contextlib.suppress(docker.errors.NotFound):
        client.api.remove_container(container_id, force=True)
