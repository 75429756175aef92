"""A run's agent hosts, started as its first op begins, beside that op's own step.

An agent host is a Python process that imports a2a-sdk and uvicorn: most of a second before
the deploy_agent op can deploy into it, and that op waits until the ops before it (sandboxes,
envs) are done. So a root op also starts, in a thread, the hosts the job's deploy_agent steps
will use, when their settings are known ahead (``DeployAgentStep.host_ahead``), and waits for
that thread as it ends; the deploy_agent op then finds its host in the run's ledger. What
cannot start ahead (or fails to) is left to the step, which starts it or says why.
"""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import dagster as dg

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
