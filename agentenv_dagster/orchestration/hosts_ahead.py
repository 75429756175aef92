"""A run's agent hosts, started as its first op begins, beside that op's own step.

An agent host is a Python process that imports a2a-sdk and uvicorn: most of a second before
the deploy_agent op can deploy into it, and that op waits until the ops before it (sandboxes,
envs) are done. So a root op also starts, in a thread, the hosts the job's deploy_agent steps
will use, when their settings are known ahead (``DeployAgentStep.host_ahead``), and waits for
that thread as it ends; the deploy_agent op then finds its host in the run's ledger. What
cannot start ahead (or fails to) is left to the step, which starts it or says why.

The shard runs of a dataset go further: their hosts are forked from one import as the runs
start (``forked_shard_hosts``), and each run's deploy_agent op adopts its own instead of
starting it (the ops before do not wait for it: it is coming up already).
"""

from __future__ import annotations

import logging
import secrets
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import dagster as dg

from ..config import AgentEnvConfig
from ..plan import TaskPlan
from ..runtime.local import DeploymentError, LocalProvider, agent_host_id, end_forked_hosts, fork_agent_hosts
from ..steps.deploy import DeployAgentStep
from .resources import AgentEnvResource
from .rows import step_fields
from .translator import TAG_STEP_TYPE

log = logging.getLogger(__name__)


@contextmanager
def agent_hosts_ahead(context: dg.OpExecutionContext, resource: AgentEnvResource) -> Iterator[None]:
    """While the block runs, the run's agent hosts start in a thread; it ends with the block."""
    hosts = _hosts_ahead(context, resource)
    if not hosts:
        yield
        return
    thread = threading.Thread(target=resource.start_agent_hosts, args=(context.run_id, hosts, log),
                              name="agent-hosts-ahead")
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _hosts_ahead(context: dg.OpExecutionContext, resource: AgentEnvResource) -> list[dict[str, Any]]:
    """The hosts of the job's other deploy_agent steps, each once (none when a step's fields
    cannot be read: its own op reports that)."""
    nodes = [node.name for node in context.job_def.graph.nodes
             if node.definition.tags.get(TAG_STEP_TYPE) == DeployAgentStep.type_name
             and node.name != context.op_handle.name]
    hosts: list[dict[str, Any]] = []
    if not nodes:  # most root ops: no config to read
        return hosts
    try:
        config = resource.load_config()
        for node in nodes:
            host = DeployAgentStep.model_validate(step_fields(context, node)).host_ahead(config)
            if host is not None and host not in hosts:
                hosts.append(host)
    except Exception as exc:
        log.debug("agent hosts not started ahead: %s", exc)
        return []
    return hosts


@contextmanager
def forked_shard_hosts(plan: TaskPlan, config: AgentEnvConfig, runs: int,
                       first: int | None = None) -> Iterator[list[dict[str, Any]]]:
    """What each of ``runs`` shard runs of ``plan`` adopts: the agent hosts its deploy_agent
    steps will use (those known ahead), forked from one import while the runs start rather
    than started by each run (an agent host's import is ~0.35 s of CPU, ~0.2 s forked), the
    ``first`` runs' first (the others once those are prompted); [] when none is. Those no run adopted end with the block."""
    forked = _fork_shard_hosts(plan, config, runs, first)
    try:
        yield forked
    finally:
        end_forked_hosts(forked)


def _fork_shard_hosts(plan: TaskPlan, config: AgentEnvConfig, runs: int, first: int | None) -> list[dict[str, Any]]:
    folder = config.state_dir / "forked-hosts" / secrets.token_hex(4)
    provider = LocalProvider(config, folder)
    hosts: dict[str, tuple[dict[str, str], int]] = {}
    for step in plan.steps:
        settings = step.host_ahead(config) if isinstance(step, DeployAgentStep) else None
        if settings is None:
            continue
        try:
            env = provider.agent_host_env(settings["agent_id"], settings["env_vars"], settings["overrides"])
        except DeploymentError as exc:  # the step says why
            log.debug("agent host for %s not forked ahead: %s", settings["agent_id"], exc)
            continue
        if env is not None:
            hosts.setdefault(agent_host_id(env), (env, settings["ttl_seconds"]))
    return fork_agent_hosts(hosts, runs, folder, first) if hosts else []
