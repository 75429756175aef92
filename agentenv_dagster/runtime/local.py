"""The embedded local providers: envs as server processes on 127.0.0.1, agents in one agent host process per run.

Each run's ledger (a file per deployment, written before a server starts, beside the run's token and owner) lets
any process of the run, or a later one, tear it all down; once closed, a late deployment ends itself and fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import secrets
import shutil
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import httpx
from filelock import FileLock

from ..config import BUILTIN_AGENTS, BUILTIN_PROVIDERS, CODING_CLI_KINDS, AgentEntry, AgentEnvConfig, model_key_env
from ..context import DeployedAgent, DeployedEnv, DeployedSandbox
from ..ids import UnsafeIdError, path_under
from ..redaction import remember_secret
from .processes import READY_FILE, ProcessIdentity, run_owner, spawn_server, still_running, terminate
from .sandbox import LocalSandbox
from .server_auth import RunServerAuth


class DeploymentError(RuntimeError):
    """An env, agent or sandbox could not be deployed (or kept: the run is tearing down)."""


SEVERAL = ".several"  # a ledger file of several deployments recorded together: {instance_id: entry}
TOKEN_FILE = ".token"  # the run's bearer token (0600, in the run's 0700 ledger folder)
OWNER_FILE = ".owner"  # the run's owner process (``ProcessIdentity``)


def _ledger_entry(kind: str, pid: int | None = None, container_id: str | None = None, url: str | None = None,
                  host: str | None = None, **more: Any) -> dict[str, Any]:
    """One deployment; ``more`` (a server's ``started`` and ``workdir``) only when known."""
    entry = {"kind": kind, "pid": pid, "container_id": container_id, "url": url, "host": host}
    return {**entry, **{k: v for k, v in more.items() if v is not None}}


@functools.lru_cache(maxsize=4096)
def _written_once(path: str) -> dict[str, Any]:
    """A ledger file of several deployments, parsed once per process (it is never rewritten)."""
    return json.loads(Path(path).read_text())


# The agents this process wrote into each open ledger (folder -> instance id -> entry), which never
# change, so ending a row's agent need not read them back. Dropped when the ledger closes.
_HOSTED_HERE: dict[Path, dict[str, dict[str, Any]]] = {}
_TOKENS: dict[Path, str] = {}  # each ledger's token, once read (it never changes)


@dataclass(frozen=True)
class Ledger:
    folder: Path

    @classmethod
    def of_run(cls, run_dir: Path) -> "Ledger":
        return cls(run_dir / "deployments")

    @property
    def closed(self) -> bool:
        return (self.folder / ".closed").exists()

    def record(self, instance_id: str, kind: str, *, pid: int | None = None, container_id: str | None = None,
               url: str | None = None, started: int | None = None, workdir: str | None = None) -> None:
        """What the run must end: a server process (``pid`` started at ``started``, at ``url``; before
        it exists, its ``workdir``) or a container (agents in the run's host: :meth:`record_hosted`)."""
        self._write(instance_id, _ledger_entry(kind, pid, container_id, url, started=started, workdir=workdir))

    def token(self, *, create: bool = True) -> str | None:
        """The run's bearer token, made on first use (None without ``create`` until then)."""
        if (token := _TOKENS.get(self.folder)) is None:
            token = self._once(TOKEN_FILE, lambda: secrets.token_urlsafe(32)) if create else self._read(TOKEN_FILE)
            if token is not None:
                remember_secret(token)  # never to be recorded anywhere
                _TOKENS[self.folder] = token
        return token

    def owner(self) -> ProcessIdentity | None:
        """The process the run's servers end with, once a process of the run has claimed it."""
        recorded = self._read(OWNER_FILE)
        return ProcessIdentity(**json.loads(recorded)) if recorded else None

    def claim_owner(self, identity: ProcessIdentity) -> ProcessIdentity:
        """Record ``identity`` as the run's owner unless one is recorded; the recorded one."""
        return ProcessIdentity(**json.loads(self._once(OWNER_FILE, lambda: json.dumps(asdict(identity)))))

    def _once(self, name: str, make: Callable[[], str]) -> str:
        """The content of ``name``, written whole and owner-only by whichever process of the run comes first."""
        if found := self._read(name):
            return found
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o700)
        staged = self.folder / f"{name}.{secrets.token_hex(4)}.tmp"
        with os.fdopen(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(make())
        try:
            with contextlib.suppress(FileExistsError):  # another process of the run was first
                os.link(staged, self.folder / name)
        finally:
            staged.unlink()
        return self._read(name) or ""

    def _read(self, name: str) -> str | None:
        try:
            return (self.folder / name).read_text() or None
        except OSError:
            return None

    def record_hosted(self, host: str, urls: dict[str, str]) -> None:
        """Agents deployed into the run's agent ``host`` (instance id -> URL), in one file for all."""
        entries = {instance_id: _ledger_entry("agent", url=url, host=host) for instance_id, url in urls.items()}
        if len(entries) == 1:
            self._write(*next(iter(entries.items())))
        elif entries:
            self._write(f"{secrets.token_hex(6)}{SEVERAL}", entries)
        _HOSTED_HERE.setdefault(self.folder, {}).update(entries)

    def _write(self, name: str, data: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f"{name}.json.tmp"  # whole or not at all: others read concurrently
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.folder / f"{name}.json")

    def entries(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for path in self.folder.glob("*.json"):
            if path.stem.endswith(SEVERAL):
                found.update(_written_once(str(path)))
            else:
                found[path.stem] = json.loads(path.read_text())
        return found

    def entry(self, instance_id: str) -> dict[str, Any] | None:
        """One deployment: an agent this process wrote, else its own file, else among those recorded together."""
        if (hosted := _HOSTED_HERE.get(self.folder, {}).get(instance_id)) is not None:
            return hosted
        with contextlib.suppress(FileNotFoundError):
            return json.loads((self.folder / f"{instance_id}.json").read_text())
        batches = (_written_once(str(path)) for path in self.folder.glob(f"*{SEVERAL}.json"))
        return next((batch[instance_id] for batch in batches if instance_id in batch), None)

    def terminate(self, instance_id: str) -> bool:
        entry = self.entry(instance_id)
        return bool(entry) and _end(entry, self.token(create=False))

    def close(self) -> list[str]:
        """Refuse further deployments, then end every one recorded (an agent with its host); what was running."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / ".closed").touch()
        entries = self.entries()
        token = self.token(create=False)
        _HOSTED_HERE.pop(self.folder, None)
        _TOKENS.pop(self.folder, None)
        ended = {iid: _end(entry, token) for iid, entry in entries.items() if entry.get("host") not in entries}
        return sorted(iid for iid, entry in entries.items() if ended.get(iid) or ended.get(entry.get("host")))


class LocalProvider:
    """Deploys registered envs and agents of one run as local server processes."""

    def __init__(self, config: AgentEnvConfig, run_dir: Path):
        self.config = config
        self.run_dir = run_dir
        self.ledger = Ledger.of_run(run_dir)
        self.server_auth = RunServerAuth(self.ledger)  # the token on requests to the run's own servers
        # claimed by the run's first step: a run killed before it deployed anything is still reaped
        self.owner = self.ledger.claim_owner(run_owner())
        os.chmod(run_dir, 0o700)  # its sandboxes, contexts and logs are the run's user's alone
        self._hosts: dict[str, str] = {}  # agent host id -> its URL, once known
        self._batches: dict[str, HostBatch] = {}  # agent host URL -> the deployments on their way
        self._host_starting = asyncio.Lock()

    def deploy_env(self, env_id: str, *, step_id: str, ttl_seconds: int) -> DeployedEnv:
        if (entry := self.config.env_entry(env_id)) is None:
            known = sorted({*self.config.envs.registry, "email", "item-store"})
            raise DeploymentError(f"Env '{env_id}' is not registered (known envs: {known})")
        record = dict(env_id=env_id, env_version=entry.version, metadata={"deploy_step_id": step_id},
                      **_lifetime(ttl_seconds))
        if entry.mcp_url:  # a live endpoint: nothing to start, nothing to tear down
            return DeployedEnv(**record, env_provider_type="live", mcp_url=entry.mcp_url)
        instance_id = f"{env_id}-{secrets.token_hex(4)}"
        roots = [self.config.state_dir / "artifacts", self.config.state_dir / "cache",  # its data plane's file:// roots
                 *(self.config.path(d) for d in self.config.stores.artifact_dirs)]
        args = [entry.kind or env_id, *(a for root in roots for a in ("--file-root", str(root)))]
        server = self._spawn("agentenv_dagster.builtin.envs", args, instance_id, "env", ttl_seconds)
        return DeployedEnv(**record, env_provider_type="local", instance_id=instance_id, mcp_url=f"{server.url}/mcp")

    def deploy_agent(
        self, agent_id: str, *, agent_name: str, ttl_seconds: int, env_vars: dict[str, str] | None = None,
        workspace: Path | None = None, container: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None, tools_env: dict[str, str] | None = None,
    ) -> DeployedAgent:
        """Deploy agent ``agent_id`` (its registry entry, ``overrides`` on top) into the run's agent host. With
        a ``workspace`` it works there with Bash/Write/Read/Skill tools (Bash in the sandbox's ``container``),
        whose environment is an allowlist plus ``tools_env``: never the run's keys."""
        request = self._hosted_request(agent_id, agent_name, ttl_seconds, env_vars, workspace, container, overrides,
                                       tools_env)
        try:
            created = _http().post(f"{request.host_url}/agents", json=request.body, headers=self._auth())
        except httpx.HTTPError as exc:
            raise request.host_failed(exc) from None
        answer = created.json() if created.status_code == 201 else {"error": created.text}
        self._record_hosted(request.host_id, [(request.body, answer)])
        return self._hosted_agent(request, answer)

    async def deploy_agent_async(
        self, agent_id: str, *, agent_name: str, ttl_seconds: int, env_vars: dict[str, str] | None = None,
        workspace: Path | None = None, container: dict[str, Any] | None = None,
        overrides: dict[str, Any] | None = None, tools_env: dict[str, str] | None = None,
    ) -> DeployedAgent:
        """:meth:`deploy_agent` from an event loop: the agents asked for in one turn of the loop go in one request."""
        args = (agent_id, agent_name, ttl_seconds, env_vars, workspace, container, overrides, tools_env)
        request = self._hosted_request(*args, start_host=False)
        if request is None:
            # finding or starting the host blocks: off the loop, and once (the rows behind find it known)
            async with self._host_starting:
                request = (self._hosted_request(*args, start_host=False)
                           or await asyncio.to_thread(self._hosted_request, *args))
        if (batch := self._batches.get(request.host_url)) is None:
            batch = self._batches[request.host_url] = HostBatch(
                request.host_url, functools.partial(self._record_hosted, request.host_id), headers=self._auth())
        try:
            answer = await batch.add(request.body)
        except httpx.HTTPError as exc:
            raise request.host_failed(exc) from None
        return self._hosted_agent(request, answer)

    def _hosted_request(
        self, agent_id: str, agent_name: str, ttl_seconds: int, env_vars: dict[str, str] | None,
        workspace: Path | None, container: dict[str, Any] | None, overrides: dict[str, Any] | None,
        tools_env: dict[str, str] | None = None, *, start_host: bool = True,
    ) -> "HostedRequest | None":
        """What to ask the run's agent host for, finding or starting it (None without ``start_host`` if unknown)."""
        entry = self._agent_entry(agent_id, overrides)
        process_env = dict(env_vars or {})
        model_api = self._model_api(agent_id, entry, container)
        instance_id = f"{agent_id}-{secrets.token_hex(4)}"
        sandbox = workspace or self.run_dir / "sandboxes" / instance_id
        settings = {**self._agent_config(entry), "name": agent_name}
        if workspace is not None:
            settings["workspace"] = {"container": container, "path_prepend": entry.path_prepend, "env": tools_env or {}}
        host_id = agent_host_id(process_env, model_api)
        if not start_host and host_id not in self._hosts:
            return None
        host_url = self._agent_host(host_id, process_env, model_api, ttl_seconds)
        return HostedRequest(agent_id, agent_name, host_id, host_url,
                             {"id": instance_id, "sandbox": str(sandbox), "config": settings})

    async def warm_agent_host(
        self, agent_id: str, *, ttl_seconds: int, env_vars: dict[str, str] | None = None,
        overrides: dict[str, Any] | None = None,
    ) -> None:
        """Find or start the host deploying ``agent_id`` will use (not a coding CLI's); raises what the deploy would."""
        entry = self._agent_entry(agent_id, overrides)
        if entry.kind in CODING_CLI_KINDS:
            return
        env, model_api = dict(env_vars or {}), self._model_api(agent_id, entry, None)
        async with self._host_starting:
            if (host_id := agent_host_id(env, model_api)) not in self._hosts:
                await asyncio.to_thread(self._agent_host, host_id, env, model_api, ttl_seconds)

    def _agent_entry(self, agent_id: str, overrides: dict[str, Any] | None) -> AgentEntry:
        """The registry entry of ``agent_id``, with a step's inline settings on top."""
        if (entry := self.config.agent_entry(agent_id)) is None:
            known = sorted({*self.config.agents.registry, *BUILTIN_AGENTS})
            raise DeploymentError(f"A2A agent '{agent_id}' is not registered (known agents: {known})")
        if overrides:
            entry = AgentEntry.model_validate({**entry.model_dump(exclude_unset=True), **overrides})
        return entry

    def _model_api(self, agent_id: str, entry: AgentEntry, container: dict[str, Any] | None) -> dict[str, Any]:
        """The model API the agent's kind needs, for its host's bootstrap (not its environment: its tools see that)."""
        if entry.kind in CODING_CLI_KINDS:
            return self._coding_cli_ready(agent_id, entry, container)
        if entry.kind != "anthropic":
            return {}
        # the tool-use agent: its model's provider, with that provider's URL and key (if it needs one)
        ref = entry.model or self.config.model.for_role("agent")
        try:
            model = self.config.model.resolve(ref)
        except ValueError as exc:
            raise DeploymentError(f"A2A agent '{agent_id}': {exc}") from None
        if missing := model.missing_setting():
            raise DeploymentError(f"A2A agent '{agent_id}' is the tool-use agent of model '{ref}' and needs "
                                  f"{'an API key' if 'api_key' in missing else 'a base URL'}: {missing}")
        return {model.provider: {"base_url": model.base_url(), "api_key": model.api_key(), "protocol": model.protocol}}

    def _record_hosted(self, host_id: str, answered: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        """Write down the agents a host deployed (its answers with a URL), all in one go."""
        self.ledger.record_hosted(host_id, {body["id"]: answer["url"] for body, answer in answered if "url" in answer})

    def _hosted_agent(self, request: "HostedRequest", answer: dict[str, Any]) -> DeployedAgent:
        """The deployed agent (the ledger has it: ``_record_hosted``), or why it is not."""
        if "url" not in answer:
            raise DeploymentError(f"A2A agent '{request.agent_id}' was not deployed: {str(answer.get('error'))[:2000]}")
        url, instance_id = answer["url"], request.body["id"]
        if self.ledger.closed:
            _end({"url": url, "host": request.host_id}, self.ledger.token(create=False))
            raise DeploymentError(f"run is tearing down; agent '{instance_id}' was not kept")
        return DeployedAgent(
            agent_name=request.agent_name, api_url=url, a2a_url=url, sandbox_id=instance_id,
            sandbox_type="local", instance_id=instance_id, sandbox_root=request.body["sandbox"],
            a2a_agent_id=request.agent_id, a2a_card=answer.get("card"),
        )

    def _agent_host(self, host_id: str, env: dict[str, str], model_api: dict[str, Any], ttl_seconds: int) -> str:
        """The URL of the run's agent host ``host_id`` for this process environment and model API (a key is per
        process), started on first use; a file lock keeps other processes of the run from starting a second."""
        if host_id in self._hosts:  # this process found or started it already (a dead host fails the POST)
            return self._hosts[host_id]
        self.ledger.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(self.ledger.folder / f"{host_id}.lock"):
            entry = self.ledger.entry(host_id)
            server = _server_identity(entry) if entry and entry.get("url") else None
            if server is not None and still_running(server.pid, server.started):
                url = entry["url"]
            else:
                url = self._spawn("agentenv_dagster.builtin.agents", ["host"], host_id, "agent", ttl_seconds,
                                  env=env, secrets_for_server={"model_api": model_api}).url
        self._hosts[host_id] = url
        return url

    def deploy_sandbox(
        self, sandbox_name: str, *, step_id: str, sandbox_mode: str, ttl_seconds: int,
        network_policy: dict[str, Any] | None = None, container: dict[str, Any] | None = None,
        image: str | None = None, ports: list[int] | None = None, cpu: float | None = None,
        memory_mb: int | None = None, env_vars: dict[str, str] | None = None,
    ) -> DeployedSandbox:
        """``container`` mode: a container running ``image``'s own command, its ``ports`` published on 127.0.0.1
        (``tunnel_urls``), no host folder. ``vm`` mode: a fresh folder of the run, with ``container`` settings
        also a container with the folder mounted. Containers end with the run."""
        if self.ledger.closed:
            raise DeploymentError(f"run is tearing down; sandbox '{sandbox_name}' was not created")
        instance_id = f"sandbox-{secrets.token_hex(4)}"
        extra: dict[str, Any] = {}
        started = None
        if sandbox_mode == "container":
            started = self._start_container(
                step_id, sandbox_name, instance_id, "sandbox_mode", "image", image, None, None,
                memory_mb=memory_mb, cpus=cpu, env=env_vars, ports=ports, run_image_command=True,
            )
            extra["tunnel_urls"] = started.port_urls
        else:
            root = self.run_dir / "sandboxes" / instance_id
            root.mkdir(parents=True)
            extra["sandbox_root"] = str(root)
            if container:
                image = container["image"]
                started = self._start_container(
                    step_id, sandbox_name, instance_id, "container", "container.image", image, root,
                    container.get("working_dir") or "/work", memory_mb=container.get("memory_mb"),
                    cpus=container.get("cpus"), pids=container.get("pids"), network=container.get("network") or "bridge",
                )
        if started:
            extra["container"] = {"container_id": started.container_id, "working_dir": started.working_dir,
                                  "image": image}
        return DeployedSandbox(
            sandbox_name=sandbox_name, sandbox_mode=sandbox_mode, sandbox_id=instance_id,
            sandbox_type="docker" if started else "local", instance_id=instance_id, network_policy=network_policy,
            **_lifetime(ttl_seconds), **extra,
        )

    def _start_container(self, step_id: str, sandbox_name: str, instance_id: str, asked_by: str, image_field: str,
                         image: str, workspace: Path | None, working_dir: str | None, **settings: Any):
        """Start a sandbox's container and record it, or say which step and field (asked_by, image_field) fails."""
        from .containers import ContainerSandbox, ContainerSandboxError, MissingImageError, NoEngineError, container_name

        name = container_name(instance_id)
        self.ledger.record(instance_id, "container", container_id=name)  # before it exists: a kill can't orphan it
        try:
            started = ContainerSandbox.start(image, workspace, working_dir, run_id=self.run_dir.name,
                                             instance_id=instance_id, name=name, **settings)
        except NoEngineError as exc:
            raise DeploymentError(f"deploy_sandbox '{step_id}': field '{asked_by}': sandbox '{sandbox_name}' is a "
                                  f"container and needs a Docker engine: {exc}") from None
        except MissingImageError as exc:
            raise DeploymentError(f"deploy_sandbox '{step_id}': field '{image_field}': {exc}") from None
        except ContainerSandboxError as exc:
            raise DeploymentError(f"deploy_sandbox '{step_id}': sandbox '{sandbox_name}': {exc}") from None
        started.close()
        self.ledger.record(instance_id, "container", container_id=started.container_id)
        if self.ledger.closed:
            _end({"container_id": started.container_id})
            raise DeploymentError(f"run is tearing down; sandbox '{sandbox_name}' was not kept")
        return started

    def sandbox_of(self, agent: DeployedAgent) -> LocalSandbox:
        """The sandbox folder a record names: one of this project's runs (a saved context may be older) only."""
        if not (root := getattr(agent, "sandbox_root", None)):  # an extra field of the record
            raise DeploymentError(f"agent '{agent.agent_name}' has no local sandbox")
        try:
            path_under(self.run_dir.parent, os.path.relpath(root, self.run_dir.parent))
        except (UnsafeIdError, ValueError):
            raise DeploymentError(f"agent '{agent.agent_name}': sandbox_root {str(root)[:200]!r} is not a sandbox "
                                  f"of this project's runs ({self.run_dir.parent})") from None
        return LocalSandbox(Path(root))

    def terminate(self, instance_id: str) -> bool:
        return self.ledger.terminate(instance_id)

    async def aclose(self) -> None:
        """Close the clients of the deployments sent from this event loop (not the deployments)."""
        for batch in self._batches.values():
            await batch.aclose()

    def teardown(self) -> list[str]:
        return self.ledger.close()

    def _coding_cli_ready(self, agent_id: str, entry: AgentEntry, container: dict[str, Any] | None) -> dict[str, Any]:
        """The model API a claude-code or codex agent's host proxies for it (none for a logged-in codex); fails
        the deploy, saying how to fix it, when its CLI, package or key is missing or the sandbox is a container."""
        where = f"A2A agent '{agent_id}' (kind {entry.kind})"
        if container:
            raise DeploymentError(f"{where} runs its CLI on this machine in the sandbox folder, not inside the "
                                  "sandbox's container: use sandbox driver tempdir, or the anthropic agent")
        if entry.kind == "codex":
            if not shutil.which(entry.cli_path or "codex"):
                raise DeploymentError(f"{where} needs the Codex CLI ('{entry.cli_path or 'codex'}' is not on PATH): "
                                      "npm install -g @openai/codex")
            codex_home = Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex")
            api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("CODEX_API_KEY")
            if not (api_key or (codex_home / "auth.json").is_file()):
                raise DeploymentError(f"{where} needs an API key: set OPENAI_API_KEY (or CODEX_API_KEY), or run 'codex login'")
            return {"openai": {"base_url": os.environ.get("CODEX_BASE_URL"), "api_key": api_key}} if api_key else {}
        if (spec := importlib.util.find_spec("claude_agent_sdk")) is None:
            raise DeploymentError(f"{where} needs the claude-agent-sdk package: pip install 'agentenv-dagster[agents]'")
        bundled = [Path(folder) / "_bundled" / "claude" for folder in spec.submodule_search_locations or []]
        if not (shutil.which(entry.cli_path or "claude") or any(p.is_file() for p in bundled)):
            raise DeploymentError(f"{where} needs the Claude Code CLI ('{entry.cli_path or 'claude'}' is not on PATH "
                                  "and claude-agent-sdk bundles none): npm install -g @anthropic-ai/claude-code")
        if not (api_key := self.config.model.resolved_api_key()):
            raise DeploymentError(f"{where} needs an API key: set [model] api_key in .agentenv/config.toml or ANTHROPIC_API_KEY")
        return {"anthropic": {"base_url": self.config.model.resolved_base_url(), "api_key": api_key}}

    def _agent_config(self, entry) -> dict[str, Any]:
        episodes = (json.loads(self.config.path(entry.script).read_text())["episodes"] if entry.script
                    else entry.episodes)
        settings = {
            "kind": entry.kind, "episodes": episodes or [], "delay_seconds": entry.delay_seconds,
            "model": entry.model or self.config.model.for_role("agent"), "max_turns": entry.max_turns,
            "base_url": self.config.model.resolved_base_url(), "description": entry.description,
        }
        if entry.kind == "anthropic":
            settings["providers"] = self._providers()
        if entry.kind in CODING_CLI_KINDS:
            # their own defaults unless set: the CLI's turn cap; codex's model (ours are Anthropic's)
            settings["max_turns"] = entry.max_turns if "max_turns" in entry.model_fields_set else None
            if entry.kind == "codex":
                settings["model"] = entry.model
            settings.update(entry.model_dump(include={
                "permission_mode", "allowed_tools", "disallowed_tools", "sdk_options", "system_prompt_mode",
                "setting_sources", "settings", "plugins", "cli_path"}))
        return settings

    def _providers(self) -> dict[str, dict[str, Any]]:
        """Every provider as the agent host sees it: URLs resolved, keys read from its environment (model_key_env)."""
        named = {name: self.config.model.provider(name) for name in {*BUILTIN_PROVIDERS, *self.config.model.providers}}
        return {name: {**settings.model_dump(), "base_url": url, "api_key": f"env:{model_key_env(name)}"}
                for name, settings in sorted(named.items())  # (a provider of ours without its URL cannot be used)
                if (url := settings.resolved_base_url()) or name in BUILTIN_PROVIDERS}

    def _spawn(self, module, args, instance_id, kind, ttl_seconds, env=None, secrets_for_server=None):
        """Start a server of the run bound to its token and owner, in the ledger before it exists, the
        moment it does and once it serves; refused, or ended at once, once the run tears down."""
        workdir = self.run_dir / f"{kind}s" / instance_id
        record = functools.partial(self.ledger.record, instance_id, kind, workdir=str(workdir))
        record()
        if self.ledger.closed:
            raise DeploymentError(f"run is tearing down; {kind} '{instance_id}' was not started")
        server = spawn_server(
            module, args, workdir=workdir, ttl_seconds=ttl_seconds, env=env, token=self.ledger.token(),
            owner=self.owner, secrets_for_server=secrets_for_server,
            on_started=lambda process: record(pid=process.pid, started=process.started),
        )
        record(pid=server.pid, started=server.started, url=server.url)
        if self.ledger.closed:
            terminate(server.pid, started=server.started)
            raise DeploymentError(f"run is tearing down; {kind} '{instance_id}' was not kept")
        return server

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.ledger.token()}"}


def agent_host_id(env: dict[str, str], model_api: dict[str, Any]) -> str:
    """The agent host of a process environment and model API (a key is per process, so per host)."""
    given = json.dumps([env, model_api], sort_keys=True)
    return "agent-host-" + hashlib.sha256(given.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class HostedRequest:
    """One agent to deploy into a run's agent host, and what it becomes once there."""

    agent_id: str
    agent_name: str
    host_id: str
    host_url: str
    body: dict[str, Any]  # {"id", "sandbox", "config"}

    def host_failed(self, exc: Exception) -> DeploymentError:
        return DeploymentError(f"A2A agent '{self.agent_id}': the run's agent host at {self.host_url} failed: {exc!r}")


class HostBatch:
    """Deployments into one agent host: what is asked for in one turn of the event loop goes in one ``POST /agents``
    over one kept connection; ``record`` gets each batch's ``(body, answer)`` pairs before anyone sees an answer."""

    def __init__(self, host_url: str,
                 record: Callable[[list[tuple[dict[str, Any], dict[str, Any]]]], None] = lambda answered: None,
                 headers: dict[str, str] | None = None) -> None:
        self.host_url = host_url
        self.record = record
        self.headers = headers or {}  # the run's token
        self._waiting: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._http: httpx.AsyncClient | None = None  # made by the first send, in its event loop

    async def add(self, body: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if not self._waiting:
            loop.call_soon(lambda: asyncio.ensure_future(self._send()))
        answer = loop.create_future()
        self._waiting.append((body, answer))
        return await answer

    async def _send(self) -> None:
        batch, self._waiting = self._waiting, []
        try:
            if self._http is None:  # plain HTTP on loopback: no CA bundle to load
                self._http = httpx.AsyncClient(timeout=30, verify=False)
            response = await self._http.post(f"{self.host_url}/agents", json={"agents": [b for b, _ in batch]},
                                             headers=self.headers)
            response.raise_for_status()
            answers = response.json()["agents"]
        except Exception as exc:  # every agent of the batch fails the same way
            for _, answer in batch:
                answer.set_exception(exc if isinstance(exc, httpx.HTTPError) else httpx.HTTPError(repr(exc)))
            return
        try:
            self.record([(body, result) for (body, _), result in zip(batch, answers)])
        except Exception as exc:  # deployed but not written down: they end with their host; the rows fail
            for _, answer in batch:
                answer.set_exception(exc)
            return
        for (_, answer), result in zip(batch, answers):
            answer.set_result(result)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _end(entry: dict[str, Any], token: str | None = None) -> bool:
    """End one recorded deployment (an agent in the run's host by a request with the run's ``token``);
    True when something was still running. A server is ended only while it is still the one recorded."""
    if entry.get("container_id"):
        from .containers import ContainerSandbox, ContainerSandboxError

        try:
            ContainerSandbox.attach(entry["container_id"], "/").stop()
        except ContainerSandboxError:
            return False  # the engine is gone, and its containers with it
        return True
    if entry.get("host"):  # an agent in the run's host
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return _http().delete(entry["url"], headers=headers).status_code == 200
        except httpx.HTTPError:
            return False  # its host has already ended
    server = _server_identity(entry)
    return server is not None and terminate(server.pid, started=server.started)


def _server_identity(entry: dict[str, Any]) -> ProcessIdentity | None:
    """A recorded server's process: as recorded, else as it announced itself in its folder."""
    if entry.get("pid") is not None:
        return ProcessIdentity(entry["pid"], entry.get("started"))
    try:
        ready = json.loads((Path(entry["workdir"]) / READY_FILE).read_text())
        return ProcessIdentity(int(ready["pid"]), ready.get("started"))
    except (KeyError, TypeError, OSError, ValueError):
        return None


@functools.cache
def _http() -> httpx.Client:
    """One client for the agent hosts of this process: plain HTTP on 127.0.0.1, so it loads no CA bundle."""
    return httpx.Client(timeout=30, verify=False)


os.register_at_fork(after_in_child=_http.cache_clear)  # a forked process opens its own connections


def _lifetime(ttl_seconds: int) -> dict[str, str]:
    created = datetime.now(timezone.utc).replace(microsecond=0)
    return {"created_at_utc": created.isoformat(),
            "expires_at_utc": (created + timedelta(seconds=ttl_seconds)).isoformat()}
