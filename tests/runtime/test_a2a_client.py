"""The A2A client against a real replay agent subprocess (and a stub for odd agents)."""

from __future__ import annotations

import json
import os
import re
import secrets
from pathlib import Path

import httpx
import pytest
from fakes.messages_api import ThreadedServer
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.runtime.a2a_client import (
    AGENT_CONFIG_URI,
    MCP_CONFIG_URI,
    SKILL_CONFIG_URI,
    TRAJECTORY_URI,
    A2AClient,
    A2AError,
    reply_trajectory,
)
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
TOKEN = secrets.token_urlsafe(32)  # the agent's run token; the test's client sends it
SCRIPT = {"episodes": [
    {"match": "^slow", "reply": "too late", "actions": [{"sleep": 30}]},
    {"match": "^echo", "reply": "echoed"},
]}


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory):
    """One replay agent for the module; it must be gone afterwards."""
    workdir = tmp_path_factory.mktemp("agent")
    (workdir / "replay.json").write_text(json.dumps(SCRIPT))
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = spawn_server(
        "agentenv_dagster.builtin.agents",
        ["replay", "--sandbox", str(workdir / "sandbox"),
         "--config-file", str(workdir / "replay.json")],
        workdir=workdir, ttl_seconds=120, env={"PYTHONPATH": pythonpath}, token=TOKEN,
    )
    try:
        yield proc.url
    finally:
        terminate(proc.pid)
    assert not is_running(proc.pid)


@pytest.fixture
def legacy_stub():
    """An agent that serves only ``agent.json`` and answers every JSON-RPC call with an error."""
    card = {"name": "stub", "capabilities": {"extensions": [{"uri": MCP_CONFIG_URI, "config": {}}]}}

    async def rpc(request):
        body = await request.json()
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"],
                             "error": {"code": -32601, "message": "Method not found"}})

    app = Starlette(routes=[
        Route("/.well-known/agent.json", lambda _: JSONResponse(card)),
        Route("/", rpc, methods=["POST"]),
    ])
    with ThreadedServer(app) as server:
        yield server.url


@pytest.fixture
async def a2a():
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield A2AClient(http)


async def test_card_and_extension_endpoints(a2a, agent_url, legacy_stub):
    card = await a2a.get_card(agent_url)
    assert a2a.extension_endpoint(card, MCP_CONFIG_URI) == "/ext/mcp-config"
    assert a2a.extension_endpoint(card, "urn:other/v1") is None
    legacy = await a2a.get_card(legacy_stub)
    assert legacy["name"] == "stub"
    assert a2a.extension_endpoint(legacy, MCP_CONFIG_URI) == "/ext/mcp-config"  # the default
    assert a2a.extension_endpoint(legacy, AGENT_CONFIG_URI) is None
    assert await a2a.get_trajectory(legacy_stub, legacy, "t1") is None


async def test_extension_errors_carry_status_and_body(a2a, agent_url, legacy_stub):
    card = await a2a.get_card(agent_url)
    with pytest.raises(A2AError, match=r"HTTP 400: .*unsupported agent-config fields: \['bogus'\]"):
        await a2a.post_extension(agent_url, card, AGENT_CONFIG_URI, {"bogus": 1})
    legacy = await a2a.get_card(legacy_stub)
    with pytest.raises(A2AError, match="does not advertise the extension urn:agentenv:skill"):
        await a2a.post_extension(legacy_stub, legacy, SKILL_CONFIG_URI, {})


async def test_send_and_wait_reads_the_reply(a2a, agent_url):
    card = await a2a.get_card(agent_url)
    reply = await a2a.send_and_wait(agent_url, "echo me", timeout_seconds=20, context_id="conv-1")
    assert (reply.state, reply.text, reply.context_id) == ("completed", "echoed", "conv-1")
    assert reply.data["tool_call_count"] == 0 and isinstance(reply.data["tool_call_count"], int)
    trajectory = await a2a.get_trajectory(agent_url, card, reply.task_id)
    assert trajectory == [{"type": "message", "role": "user", "text": "echo me"},
                          {"type": "message", "role": "assistant", "text": "echoed"}]

    failed = await a2a.send_and_wait(agent_url, "unscripted", timeout_seconds=20)
    assert failed.state == "failed" and failed.text.startswith("NoScriptedReply: ")
    assert failed.data["error_type"] == "NoScriptedReply"


async def test_deadline_cancels_the_task_and_raises(a2a, agent_url):
    with pytest.raises(TimeoutError, match=r"A2A task \S+ did not complete within 0.5s") as raised:
        await a2a.send_and_wait(agent_url, "slow please", timeout_seconds=0.5, poll_interval=0.05)
    task_id = re.search(r"A2A task (\S+)", str(raised.value)).group(1)
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        got = await http.post(agent_url, headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": "1", "method": "GetTask", "params": {"id": task_id}})
    assert got.json()["result"]["status"]["state"] == "TASK_STATE_CANCELED"


async def test_json_rpc_errors_are_raised(a2a, legacy_stub):
    with pytest.raises(RuntimeError, match="A2A message/send failed: .*Method not found"):
        await a2a.send_and_wait(legacy_stub, "hi", timeout_seconds=5)


async def test_a_prompt_carries_extensions_both_ways(a2a, agent_url):
    """An agent-config set rides on the message (numbers keep their type through the
    message's Struct) and the trajectory asked for comes back on the reply, as fetched."""
    card = await a2a.get_card(agent_url)
    reply = await a2a.send_and_wait(
        agent_url, "echo carried", timeout_seconds=20,
        extensions={AGENT_CONFIG_URI: {"model": "carried-model", "max_turns": 3, "timeout_seconds": 12.5}},
        requested_extensions=(TRAJECTORY_URI,))
    assert (reply.state, reply.text) == ("completed", "echoed")
    config = (await a2a.get_extension(agent_url, card, AGENT_CONFIG_URI))["config"]
    assert (config["model"], config["max_turns"], config["timeout_seconds"]) == ("carried-model", 3, 12.5)
    assert isinstance(config["max_turns"], int)
    assert reply_trajectory(reply) == await a2a.get_trajectory(agent_url, card, reply.task_id) == [
        {"type": "message", "role": "user", "text": "echo carried"},
        {"type": "message", "role": "assistant", "text": "echoed"}]

    unasked = await a2a.send_and_wait(agent_url, "echo again", timeout_seconds=20)
    assert unasked.state == "completed" and reply_trajectory(unasked) is None

    refused = await a2a.send_and_wait(agent_url, "echo me", timeout_seconds=20,
                                      extensions={AGENT_CONFIG_URI: {"bogus": 1}})
    assert refused.state == "failed"
    assert refused.text == "AgentConfigError: unsupported agent-config fields: ['bogus']"
    assert refused.data["error_type"] == "AgentConfigError"
    assert "bogus" not in (await a2a.get_extension(agent_url, card, AGENT_CONFIG_URI))["config"]
    not_an_object = await a2a.send_and_wait(agent_url, "echo me", timeout_seconds=20,
                                            extensions={AGENT_CONFIG_URI: "model=x"})
    assert not_an_object.text == "AgentConfigError: an agent-config set is a JSON object, got str"
