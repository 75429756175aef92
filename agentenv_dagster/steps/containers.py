"""run_docker_container and run_container_unit_tests_verifier: a task's own container, and
a unit-test command run in it whose result becomes a verification.

Upstream builds the task's Dockerfile on a VM-mode sandbox and runs the container there;
locally the VM is the sandbox's folder, the engine is the one ``DOCKER_HOST`` names
(``scripts/docker_engine.sh start``), and ``volumes`` name folders of the sandbox. Every
container is recorded in the run's ledger, so the run's teardown (on success, failure or
cancel) removes it. Commands run through ``/bin/sh -c`` (upstream: ``bash -c``), so they
work in minimal images too.
"""

from __future__ import annotations

import asyncio
import io
import re
import secrets
import shlex
import time
import zipfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from pydantic import field_validator, model_validator

from ..context import DeployedSandbox, TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.sandbox import LocalSandbox
from .base import ARTIFACT, SANDBOX, VERIFICATION, TaskStep
from .execution import step_param
from .registry import step
from .scoring import aggregate
from .verifiers import _Verifier

CONTAINER = "container"  # context name kind: "<sandbox_name>/<container_name>"
CONTAINERS_KEY = "deployed_docker_containers"
OUTPUT_PREVIEW_CHARS = 500  # of stdout/stderr inlined on a record; the whole output is an object
READY_INTERVAL_SECONDS = 2.0

# Env var keys reach the container as names: POSIX names only (`\Z`: no trailing newline).
_SAFE_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
# A seed column that upper-cases onto one of these is almost surely an accident.
_RESERVED_ENV_KEYS = frozenset({
    "LITELLM_API_KEY", "ANTHROPIC_API_KEY", "LITELLM_BASE_URL", "ANTHROPIC_BASE_URL", "PATH", "HOME",
})


def check_env_keys(env: dict[str, str] | None, what: str = "env_vars") -> None:
    for key in env or {}:
        if not _SAFE_ENV_KEY.match(key):
            raise ValueError(f"{what} key {key!r} is not a POSIX name ([A-Za-z_][A-Za-z0-9_]*)")


def _sandbox(ctx: TaskStepContext, name: str) -> DeployedSandbox:
    record = ctx.find_sandbox(name)
    if record is None:
        raise RuntimeError(
            f"Sandbox '{name}' not found in context.deployed_sandboxes; "
            "deploy it with DeploySandboxTaskStep before this step"
        )
    return record


def _extra(record: Any, key: str) -> Any:
    return getattr(record, key, None) or (record.model_extra or {}).get(key)


def _labels(ctx: TaskStepContext, rt: StepRuntime, **more: str | None) -> dict[str, str]:
    labels = {"agentenv.run_id": rt.run.run_dir.name, "agentenv.instance_id": ctx.instance_id, **more}
    return {k: v for k, v in labels.items() if v is not None}


async def _store_output(rt: StepRuntime, key: str, text: str) -> str:
    return await asyncio.to_thread(rt.objects.put, key, text.encode("utf-8"))


@step("run_docker_container")
class RunDockerContainerStep(TaskStep):
    """Builds the task's Docker context (or takes a local ``image``) and runs the container
    in the background on a VM-mode sandbox; later steps exec in it by ``container_name``.
    With ``wait_for_exit`` (ours) it runs to completion instead, and fails on a non-zero exit."""

    reads = {"sandbox_name": SANDBOX, "docker_context_artifact_id": ARTIFACT}
    writes = {"container_ref": CONTAINER}

    sandbox_name: str
    docker_context_artifact_id: str | None = None
    docker_context_artifact_version: int | None = None
    docker_context_url: str | None = None
    dockerfile_path: str = "Dockerfile"
    container_name: str = "task-container"
    image_tag: str | None = None
    ports: list[int] | None = None
    env_vars: dict[str, str] | None = None
    build_args: dict[str, str] | None = None
    command_override: str | None = None
    keep_alive_with_base_command: bool = False
    network: str | None = None
    extra_networks: list[str] = []
    ready_command: str | None = None
    devices: list[str] = []
    cap_add: list[str] = []
    privileged: bool = False
    volumes: list[str] = []
    shm_size: str | None = None
    # ours: a local image to run as is (no build); how long readiness may take; run to completion
    image: str | None = None
    ready_timeout_seconds: float = 120
    wait_for_exit: bool = False
    timeout_seconds: float = 300

    @model_validator(mode="after")
    def _check(self) -> "RunDockerContainerStep":
        contexts = sum(x is not None for x in (self.docker_context_artifact_id, self.docker_context_url))
        if self.image is not None and contexts:
            raise ValueError("Pass `image` or a docker context (`docker_context_artifact_id` / "
                             "`docker_context_url`), not both")
        if self.image is None and contexts != 1:
            raise ValueError("Must pass exactly one of `docker_context_artifact_id` or `docker_context_url`")
        if self.command_override and self.keep_alive_with_base_command:
            raise ValueError("Pass either `command_override` or `keep_alive_with_base_command`, not both")
        netns = [n for n in self.extra_networks if n in ("host", "none") or n.startswith("container:")]
        if netns:
            raise ValueError(f"extra_networks cannot contain netns-replacing modes {netns}; use user-defined bridges")
        if self.wait_for_exit and (self.keep_alive_with_base_command or self.ready_command):
            raise ValueError("`wait_for_exit` runs the container to completion: it takes neither "
                             "`keep_alive_with_base_command` nor `ready_command`")
        check_env_keys(self.env_vars)
        for volume in self.volumes:
            _split_volume(volume)
        return self

    @property
    def container_ref(self) -> str:
        return f"{self.sandbox_name}/{self.container_name}"

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        from ..runtime import docker_run

        ds = _sandbox(ctx, self.sandbox_name)
        if ds.sandbox_mode != "vm":
            raise RuntimeError(
                f"Cannot run docker container on sandbox '{self.sandbox_name}' "
                f"(mode={ds.sandbox_mode!r}); only VM-mode sandboxes support docker build/run"
            )
        if self.network not in (None, *docker_run.LOCAL_NETWORKS) or self.extra_networks:
            raise RuntimeError(
                "run_docker_container: the local runtime runs containers on the bridge, none or host "
                "network only (a user-defined network would outlive the run)"
            )
        running = [c for c in ctx.metadata.get(CONTAINERS_KEY) or []
                   if c.get("container_name") == self.container_name and c.get("sandbox_name") == self.sandbox_name]
        if running:
            raise RuntimeError(f"Container '{self.container_name}' is already running on sandbox '{self.sandbox_name}'")
        root = _extra(ds, "sandbox_root")
        if not root:
            raise RuntimeError(f"Sandbox '{self.sandbox_name}' ({ds.sandbox_type or 'unknown'} provider) has no local folder")
        folder = LocalSandbox(Path(root))
        labels = _labels(ctx, rt, **{"agentenv.sandbox_id": ds.sandbox_id, "agentenv.container_name": self.container_name})

        image = self.image
        if image is None:
            image = self.image_tag or f"{self.container_name}:latest"
            build_dir = await self._stage_context(rt)
            rt.log.info("Building docker image '%s' for sandbox %s (dockerfile=%s)", image, ds.sandbox_id, self.dockerfile_path)
            await asyncio.to_thread(
                docker_run.build_image, build_dir, self.dockerfile_path, image,
                build_args=self.build_args, labels=labels,
            )

        command: list[str] | None = None
        entrypoint: list[str] | None = None
        if self.command_override:
            command = shlex.split(self.command_override)
        elif self.keep_alive_with_base_command:
            # Keep the image's own startup (a server the task needs) and hold PID 1 open.
            base = await asyncio.to_thread(docker_run.image_command, image)
            script = f"{shlex.join(base)} & {docker_run.KEEP_ALIVE}" if base else docker_run.KEEP_ALIVE
            entrypoint, command = ["/bin/sh", "-c", script], []

        instance_id = f"container-{secrets.token_hex(4)}"
        rt.log.info("Starting container '%s' from image '%s' on sandbox %s", self.container_name, image, ds.sandbox_id)
        started = await asyncio.to_thread(
            docker_run.run_container, image,
            name=f"agentenv-{ctx.instance_id or 'run'}-{self.container_name}-{secrets.token_hex(3)}",
            command=command, entrypoint=entrypoint, environment=self.env_vars,
            binds=self._binds(folder), ports=self.ports, network=self.network, labels=labels,
            privileged=self.privileged, cap_add=self.cap_add, devices=self.devices, shm_size=self.shm_size,
        )
        ledger = rt.provider.ledger
        ledger.record(instance_id, "container", container_id=started.container_id)
        if ledger.closed:
            ledger.terminate(instance_id)
            raise RuntimeError(f"run is tearing down; container '{self.container_name}' was not kept")

        entry: dict[str, Any] = {
            "container_name": self.container_name, "sandbox_name": self.sandbox_name,
            "sandbox_id": ds.sandbox_id, "image_tag": image, "ports": self.ports, "network": self.network,
            "container_id": started.container_id, "instance_id": instance_id,
            "working_dir": started.working_dir, "port_urls": started.port_urls, "step_id": self.id,
        }
        entries = ctx.metadata_list(CONTAINERS_KEY)
        if self.wait_for_exit:
            await self._run_to_completion(ctx, rt, entry, entries)
            return
        if self.ready_command:
            await self._await_ready(started.container_id)
        entries.append({**entry, "status": "running"})

    async def _run_to_completion(self, ctx: TaskStepContext, rt: StepRuntime, entry: dict[str, Any],
                                 entries: list[Any]) -> None:
        """Wait for the main process, record its exit and output, then fail on a bad exit."""
        from ..runtime import docker_run

        began = time.monotonic()
        done = await asyncio.to_thread(docker_run.wait_container, entry["container_id"], self.timeout_seconds)
        prefix = f"container-outputs/{self.id}/{ctx.instance_id or 'run'}-{int(time.time())}-{secrets.token_hex(4)}"
        entries.append({
            **entry, "status": "timed_out" if done.timed_out else "exited", "exit_code": done.exit_code,
            "timed_out": done.timed_out, "duration_seconds": round(time.monotonic() - began, 3),
            "stdout_head": done.stdout[:OUTPUT_PREVIEW_CHARS], "stderr_head": done.stderr[:OUTPUT_PREVIEW_CHARS],
            "stdout_url": await _store_output(rt, f"{prefix}/stdout.txt", done.stdout),
            "stderr_url": await _store_output(rt, f"{prefix}/stderr.txt", done.stderr),
        })
        if done.timed_out:
            raise RuntimeError(f"Container '{self.container_name}' did not exit within {self.timeout_seconds}s")
        if done.exit_code != 0:
            raise RuntimeError(
                f"Container '{self.container_name}' exited {done.exit_code}; "
                f"stderr (last 1500 chars):\n{done.stderr[-1500:]}"
            )

    async def _await_ready(self, container_id: str) -> None:
        """Probe ``ready_command`` until it passes; a container that stops first fails with its exit code and output."""
        import docker

        from ..runtime.containers import ContainerSandbox

        box = await asyncio.to_thread(ContainerSandbox.attach, container_id)
        deadline = time.monotonic() + self.ready_timeout_seconds
        try:
            while True:
                if (ended := await asyncio.to_thread(box.exited)) is not None:
                    raise RuntimeError(f"container {self.container_name} exited (code {ended[0]}) before it "
                                       f"was ready; last output: {ended[1][-1500:]}")
                left = deadline - time.monotonic()
                try:
                    probe = await box.exec(self.ready_command, timeout=max(1.0, min(left, 30.0)))
                    if probe.exit_code == 0 and not probe.timed_out:
                        return
                except docker.errors.APIError:  # it stopped since the check above, which says how next round
                    pass
                if time.monotonic() + READY_INTERVAL_SECONDS > deadline:
                    raise RuntimeError(
                        f"container {self.container_name} failed readiness check within {self.ready_timeout_seconds:g}s"
                    )
                await asyncio.sleep(READY_INTERVAL_SECONDS)
        finally:
            box.close()

    def _binds(self, folder: LocalSandbox) -> dict[str, dict[str, str]]:
        """``SRC:DST[:ro|rw]`` with SRC a path of the sandbox (locally, under its folder)."""
        binds = {}
        for volume in self.volumes:
            source, target, mode = _split_volume(volume)
            host = folder.resolve(source)
            host.mkdir(parents=True, exist_ok=True)
            binds[str(host.resolve())] = {"bind": target, "mode": mode}
        return binds

    async def _stage_context(self, rt: StepRuntime) -> Path:
        """The Docker build context as a folder of the run: the artifact's files, or the
        zip the URL serves unpacked."""
        target = rt.run.run_dir / "docker-contexts" / f"{self.id}-{secrets.token_hex(4)}"
        target.mkdir(parents=True)
        if self.docker_context_artifact_id is not None:
            artifact = rt.artifacts.get(self.docker_context_artifact_id, self.docker_context_artifact_version)
            files = artifact.files
            if not files:
                raise RuntimeError(
                    f"FileArtifactUniverse '{artifact.id}' v{artifact.version} has no files; "
                    "nothing to use as docker build context"
                )
            for relpath, path in files.items():
                destination = LocalSandbox(target).resolve(relpath)
                destination.parent.mkdir(parents=True, exist_ok=True)
                destination.write_bytes(path.read_bytes())
        else:
            url = self.docker_context_url
            if url.startswith("file://"):
                data = rt.objects.read(url)
            else:
                response = await rt.http.get(url, follow_redirects=True)
                response.raise_for_status()
                data = response.content
            try:
                with zipfile.ZipFile(io.BytesIO(data)) as archive:
                    archive.extractall(target)  # drops absolute and ".." parts of member names
            except zipfile.BadZipFile:
                raise RuntimeError(f"docker_context_url {url} did not serve a zip archive") from None
        if not LocalSandbox(target).resolve(self.dockerfile_path).is_file():
            raise RuntimeError(f"Dockerfile not found at {self.dockerfile_path} inside the build context")
        return target


def _split_volume(volume: str) -> tuple[str, str, str]:
    parts = volume.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise ValueError(f"volumes entry {volume!r} is not SRC:DST[:ro|rw]")
    source, target, mode = parts[0], parts[1], parts[2] if len(parts) == 3 else "rw"
    if not source.startswith("/") or not target.startswith("/"):
        raise ValueError(f"volumes entry {volume!r}: SRC and DST must be absolute paths "
                         "(SRC is a path of the sandbox; named volumes would outlive the run)")
    if mode not in ("ro", "rw"):
        raise ValueError(f"volumes entry {volume!r}: mode must be ro or rw")
    return source, target, mode


@step("run_container_unit_tests_verifier")
class RunContainerUnitTestsVerifierStep(_Verifier):
    """Runs a unit-test command in a task container and records it as a verification.

    Graded by, first match wins: ``reward_path`` (a Harbor-style reward file, one row
    ``reward``); per-test rows read from ``junit_xml_path`` (ours) or from pytest's ``-rA``
    short summary in stdout (ours); else one row ``exit_code``. The entry is written before
    the step fails, as upstream: on a timeout always; on a non-zero exit only when nothing
    graded the tests (with a reward or per-test rows a non-zero exit is a graded failure).
    ``container_name`` may be left out (ours) when the sandbox is itself a container.
    """

    reads = {"sandbox_name": SANDBOX, "container_ref": CONTAINER}
    writes = {"verifier_key": VERIFICATION}

    sandbox_name: str
    container_name: str | None = None
    command: str
    setup_commands: list[str] = []
    user: str = "root"
    timeout_sec: float = 300
    env_vars: dict[str, str] = {}
    result_paths: list[str] = []
    reward_path: str | None = None
    junit_xml_path: str | None = None

    @field_validator("env_vars")
    @classmethod
    def _env(cls, env_vars: dict[str, str]) -> dict[str, str]:
        check_env_keys(env_vars)
        return env_vars

    @model_validator(mode="after")
    def _paths(self) -> "RunContainerUnitTestsVerifierStep":
        if self.reward_path and self.reward_path not in self.result_paths:
            self.result_paths = [*self.result_paths, self.reward_path]
        return self

    @property
    def container_ref(self) -> str | None:
        return f"{self.sandbox_name}/{self.container_name}" if self.container_name else None

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        from ..runtime.containers import ContainerSandbox

        container_id, working_dir = self._target(ctx)
        command, extra_env = self._resolve_command(ctx, rt)
        env = {**self.env_vars, **extra_env}
        box = await asyncio.to_thread(ContainerSandbox.attach, container_id, working_dir)
        try:
            for index, setup in enumerate(self.setup_commands, 1):
                first_line = (setup.splitlines() or [""])[0][:140]
                rt.log.info("[%s] setup [%d/%d]: %s", self.verifier_key, index, len(self.setup_commands), first_line)
                done = await box.exec(setup, timeout=self.timeout_sec, env=env, user=self.user)
                if done.timed_out or done.exit_code != 0:
                    why = f"timed out after {self.timeout_sec:g}s" if done.timed_out else f"exited {done.exit_code}"
                    raise RuntimeError(
                        f"Verifier '{self.verifier_key}' setup command {index} {why}; "
                        f"stderr (last 1500 chars):\n{done.stderr[-1500:]}"
                    )
            rt.log.info("[%s] running verifier (timeout=%ss): %s", self.verifier_key, self.timeout_sec, command[:160])
            result = await box.exec(command, timeout=self.timeout_sec, env=env, user=self.user)
        finally:
            box.close()
        exit_code, timed_out = result.exit_code, result.timed_out
        rt.log.info("[%s] exit_code=%s timed_out=%s", self.verifier_key, exit_code, timed_out)

        extracted = {path: await self._extract(rt, container_id, path) for path in self.result_paths}
        junit = await self._extract(rt, container_id, self.junit_xml_path, parse=False) if self.junit_xml_path else None
        tests, source = _tests_from(junit, result.stdout)
        graded_by_tests = bool(tests) and self.reward_path is None
        if self.reward_path is not None:
            reward = _parse_reward(extracted.get(self.reward_path))
            if reward is None:
                score, passed = 0.0, False
                message = (f"reward file {self.reward_path!r} missing or non-numeric "
                           f"(exit_code={exit_code} timed_out={timed_out})")
            else:
                score, passed = reward, reward >= 1.0
                message = f"reward={reward} (exit_code={exit_code} timed_out={timed_out})"
            rows = [{"id": "reward", "score": score, "result": passed, "message": message}]
        elif graded_by_tests:
            rows = list(tests)
            if exit_code != 0 and all(r["result"] for r in rows if not r.get("skipped")):
                rows.append({"id": "exit_code", "score": 0.0, "result": False,
                             "message": f"exit_code={exit_code} timed_out={timed_out} although no test failed"})
            score = aggregate([r for r in rows if not r.get("skipped")], self.score_aggregator)
        else:
            passed = exit_code == 0 and not timed_out
            score = 1.0 if passed else 0.0
            rows = [{"id": "exit_code", "score": score, "result": passed,
                     "message": f"exit_code={exit_code} timed_out={timed_out}"}]

        prefix = f"verifier-outputs/{self.id}/{ctx.instance_id or 'run'}-{int(time.time())}-{secrets.token_hex(4)}"
        extra: dict[str, Any] = {
            "command": command, "exit_code": exit_code, "timed_out": timed_out,
            "stdout_artifact": {"object_url": await _store_output(rt, f"{prefix}/stdout.txt", result.stdout)},
            "stderr_artifact": {"object_url": await _store_output(rt, f"{prefix}/stderr.txt", result.stderr)},
            "stdout_head": result.stdout[:OUTPUT_PREVIEW_CHARS], "stderr_head": result.stderr[:OUTPUT_PREVIEW_CHARS],
            "extracted_files": extracted,
        }
        if tests:
            extra["tests"] = _summary(tests, source)
        self.record(ctx, rows, **extra)
        ctx.metadata["verifications"][self.verifier_key]["score"] = score  # a reward is the score itself

        if timed_out:
            raise RuntimeError(f"Verifier '{self.verifier_key}' timed out after {self.timeout_sec:g}s")
        if exit_code != 0 and self.reward_path is None and not graded_by_tests:
            raise RuntimeError(
                f"Verifier '{self.verifier_key}' exited {exit_code}; stderr (last 1500 chars):\n{result.stderr[-1500:]}"
            )

    async def _extract(self, rt: StepRuntime, container_id: str, path: str, parse: bool = True) -> Any:
        """A result file's text (JSON-parsed when it is JSON and ``parse``), None when unreadable."""
        from ..runtime import docker_run

        try:
            raw = await asyncio.to_thread(docker_run.read_container_file, container_id, path)
        except Exception as exc:
            rt.log.warning("[%s] failed to extract %s: %s", self.verifier_key, path, exc)
            return None
        return _parse_text(raw.decode("utf-8", "replace"), as_json=parse)

    def _target(self, ctx: TaskStepContext) -> tuple[str, str | None]:
        """(container id, working dir or None for the image's) of the container to test in."""
        if self.container_name:
            entry = next((
                c for c in ctx.metadata.get(CONTAINERS_KEY) or []
                if c.get("container_name") == self.container_name and c.get("sandbox_name") == self.sandbox_name
            ), None)
            if entry is None:
                raise RuntimeError(
                    f"Container '{self.container_name}' not found on sandbox '{self.sandbox_name}' in "
                    f"context.metadata['{CONTAINERS_KEY}']"
                )
            _sandbox(ctx, self.sandbox_name)
            return entry["container_id"], None
        container = _extra(_sandbox(ctx, self.sandbox_name), "container")
        if not container:
            raise RuntimeError(
                f"Sandbox '{self.sandbox_name}' is not a container: set `container_name` "
                "(a run_docker_container container on it)"
            )
        return container["container_id"], container.get("working_dir")

    def _resolve_command(self, ctx: TaskStepContext, rt: StepRuntime) -> tuple[str, dict[str, str]]:
        """The command and extra env of this run: ``step_params`` override the stored ones;
        seed values are exported as UPPER-CASE env vars (and quoted into ``<key>`` tokens of
        an overriding command)."""
        seed = ctx.metadata.get("seed") or {}
        command = step_param(ctx, self.id, "command") or self.command
        if seed and isinstance(seed, dict):
            tokens = re.compile("|".join(re.escape(f"<{k}>") for k in seed))
            command = tokens.sub(lambda m: shlex.quote(str(seed[m.group(0)[1:-1]])), command)
        extra: dict[str, str] = {}
        overrides = step_param(ctx, self.id, "env_vars") or {}
        check_env_keys(overrides, "step_params env_vars")
        extra.update({k: str(v) for k, v in overrides.items()})
        for key, value in (seed.items() if isinstance(seed, dict) else ()):
            name = str(key).upper()
            if not _SAFE_ENV_KEY.match(name) or name in _RESERVED_ENV_KEYS:
                rt.log.warning("[%s] seed key %r not exported as an env var", self.verifier_key, key)
                continue
            extra.setdefault(name, str(value))
        return command, extra


def _parse_text(text: str, as_json: bool) -> Any:
    if as_json:
        import json

        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _parse_reward(raw: Any) -> float | None:
    """An extracted reward file as a float in [0, 1]; None when missing or not a number."""
    if raw is None or isinstance(raw, bool):
        return None
    try:
        value = float(str(raw).strip())
    except (TypeError, ValueError):
        return None
    return max(0.0, min(1.0, value))


# -- per-test rows ----------------------------------------------------------------------------

_PYTEST_SUMMARY = re.compile(r"^=+ short test summary info =+$")
_PYTEST_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S+)(?: - (.*))?$")
_PYTEST_SKIP = re.compile(r"^SKIPPED \[\d+\] (\S+?): (.*)$")
_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "XFAIL": "xfailed", "XPASS": "xpassed"}


def _row(test_id: str, outcome: str, message: str | None = None, **more: Any) -> dict[str, Any]:
    skipped = outcome == "skipped"
    passed = outcome in ("passed", "xfailed", "xpassed")
    row: dict[str, Any] = {"id": test_id, "outcome": outcome, "skipped": skipped, **more}
    if not skipped:
        row.update(result=passed, score=1.0 if passed else 0.0)
    if message:
        row["message"] = message[:500]
    return row


def parse_pytest_summary(stdout: str) -> list[dict[str, Any]]:
    """Rows from every ``short test summary info`` section (``pytest -rA``)."""
    rows: list[dict[str, Any]] = []
    inside = False
    for line in stdout.splitlines():
        line = line.rstrip()
        if _PYTEST_SUMMARY.match(line):
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("="):
            inside = False
            continue
        if match := _PYTEST_LINE.match(line):
            rows.append(_row(match.group(2), _OUTCOMES[match.group(1)], match.group(3)))
        elif match := _PYTEST_SKIP.match(line):
            rows.append(_row(match.group(1), "skipped", match.group(2)))
    return rows


def parse_junit_xml(text: str) -> list[dict[str, Any]]:
    """Rows from a JUnit XML report (pytest ``--junitxml``, most test runners)."""
    root = ElementTree.fromstring(text)
    rows = []
    for case in root.iter("testcase"):
        name, classname = case.get("name") or "?", case.get("classname")
        test_id = f"{classname}::{name}" if classname else name
        outcome, message = "passed", None
        for child, kind in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            found = case.find(child)
            if found is not None:
                outcome, message = kind, found.get("message") or (found.text or "").strip() or None
                break
        rows.append(_row(test_id, outcome, message, **_duration(case.get("time"))))
    return rows


def _duration(text: str | None) -> dict[str, float]:
    """A JUnit ``time`` attribute as ``duration_seconds``; absent or unreadable, nothing."""
    try:
        return {"duration_seconds": float(text)} if text else {}
    except ValueError:
        return {}


def _tests_from(junit: Any, stdout: str) -> tuple[list[dict[str, Any]], str | None]:
    if isinstance(junit, str) and junit.strip():
        try:
            rows = parse_junit_xml(junit)
        except ElementTree.ParseError:
            rows = []
        if rows:
            return rows, "junit"
    rows = parse_pytest_summary(stdout)
    return (rows, "pytest") if rows else ([], None)


def _summary(rows: list[dict[str, Any]], source: str | None) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    return {"source": source, "total": len(rows), **dict(sorted(counts.items()))}

