"""The conformance validators against the real embedded envs and agents, and against small
deliberately broken servers that must fail the right check with a clear message."""

from __future__ import annotations

import uuid

import httpx
import pytest
from fakes.messages_api import ThreadedServer
from mcp.server.mcpserver import MCPServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from agentenv_dagster.builtin.agents.replay import ReplayBrain
from agentenv_dagster.builtin.agents.server import EmbeddedAgent, build_app, build_card
from agentenv_dagster.context import DeployedAgent, DeployedEnv, TaskStepContext
from agentenv_dagster.runtime.a2a_client import TRAJECTORY_URI, A2AReply, trajectory_metadata
from agentenv_dagster.runtime.sandbox import LocalSandbox
from agentenv_dagster.steps.conformance_agent import trajectory_on_reply_rows
from projects import leaked_servers, make_project, run_direct, run_steps

EMAIL = {"id": "email", "type": "deploy_env", "env_id": "email", "depends_on": []}
INBOX = {"id": "inbox", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox", "depends_on": ["email"]}
AGENT = {"id": "agent", "type": "deploy_agent", "env_ids": ["email"], "a2a_agent_id": "claude-code",
         "agent_name": "assistant", "depends_on": ["email"]}
SEED = [{"kind": "data", "data": {"emails": [{"id": "s1", "from": "probe@example.com", "subject": "Seed"}]}}]


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", tasks={})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def rows_of(context: TaskStepContext, verifier_id: str) -> dict[str, dict]:
    return {row["id"]: row for row in context.metadata["verifications"][verifier_id]["results"]}


def failed(context: TaskStepContext, verifier_id: str) -> dict[str, str]:
    """Counted checks that did not pass: {check id: justification}."""
    return {i: r["justification"] for i, r in rows_of(context, verifier_id).items()
            if not r.get("skipped") and r["result"] is not True}


# -- envs --------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["email", "item-store"])
def test_the_embedded_envs_pass_every_env_check(project, env_id):
    deploy = {**EMAIL, "id": "env", "env_id": env_id}
    context = run_steps(project, [
        deploy,
        {"id": "card", "type": "verify_env_card", "env_id": env_id, "verifier_id": "card", "depends_on": ["env"]},
        {"id": "tools", "type": "verify_mcp_tool_schema", "env_id": env_id, "verifier_id": "tools", "depends_on": ["env"]},
        {"id": "protocol", "type": "verify_env_core_protocol", "env_id": env_id, "verifier_id": "protocol",
         "depends_on": ["card", "tools"]},
    ])
    verifications = context.metadata["verifications"]
    assert {k: v["score"] for k, v in verifications.items()} == {"card": 1.0, "tools": 1.0, "protocol": 1.0}
    assert verifications["card"]["environment_card"]["protocolVersion"] == "1.0"
    assert rows_of(context, "card")["tools_match_mcp"]["result"] is True
    # without seed_parts nothing is mutated: reset is judged from the card, not called
    assert "not called" in rows_of(context, "protocol")["data/reset"]["justification"]


def test_the_data_plane_round_trip_loads_and_clears_the_seed(project):
    context = run_steps(project, [
        EMAIL,
        {"id": "protocol", "type": "verify_env_core_protocol", "env_id": "email", "verifier_id": "protocol",
         "seed_parts": SEED, "depends_on": ["email"]},
    ])
    rows = rows_of(context, "protocol")
    assert context.metadata["verifications"]["protocol"]["score"] == 1.0
    assert rows["data/add"]["justification"] == "1 seed Part(s) loaded; data/get shows the change"
    assert rows["reset_clears"]["justification"] == "data/reset cleared what data/add loaded"


def test_parameter_quality_is_advisory_unless_strict(project):
    """The email env's parameters have no descriptions: reported, counted only when strict."""
    context = run_steps(project, [
        EMAIL,
        {"id": "lenient", "type": "verify_mcp_tool_schema", "env_id": "email", "verifier_id": "lenient",
         "expected_tools": ["send", "archive"], "depends_on": ["email"]},
        {"id": "strict", "type": "verify_mcp_tool_schema", "env_id": "email", "verifier_id": "strict",
         "strict": True, "depends_on": ["email"]},
    ])
    lenient = rows_of(context, "lenient")["parameters:send"]
    assert lenient["skipped"] and lenient["advisory"] and "parameter 'to' has no description" in lenient["justification"]
    assert failed(context, "lenient") == {"expected_tools": "missing: ['archive']"}
    assert failed(context, "strict")["parameters:send"].startswith("parameter 'to' has no description")
    assert context.metadata["verifications"]["strict"]["score"] == 0.0


def broken_env_app() -> Starlette:
    """A card with a wrong version, no reset/add, an extension without uri and an MCP path
    that serves nothing; a data plane whose get has no parts and whose errors are HTTP 404."""
    card = {"name": "broken", "protocolVersion": "0.9", "url": "/agentenv",
            "capabilities": {"tools": ["ghost_tool"], "operations": ["data/get"], "extensions": [{"description": "x"}]},
            "additionalInterfaces": [{"transport": "mcp", "url": "/elsewhere"}]}

    async def rpc(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return PlainTextResponse("bad body", status_code=400)
        if body.get("method") == "data/get":
            return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": {"state": {}}})
        if body.get("method") == "data/add":
            return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "error": {"code": -32601, "message": "nope"}})
        return PlainTextResponse("no such method", status_code=404)

    return Starlette(routes=[
        Route("/.well-known/agent-env.json", lambda r: JSONResponse(card)),
        Route("/agentenv", rpc, methods=["POST"]),
    ])


def test_a_non_conformant_env_fails_the_right_checks(tmp_path):
    with ThreadedServer(broken_env_app()) as server:
        root = make_project(tmp_path / "p", tasks={},
                            extra_config=f'[envs.registry.broken]\nmcp_url = "{server.url}/mcp"\n')
        context = run_steps(root, [
            {**EMAIL, "env_id": "broken", "id": "env"},
            {"id": "card", "type": "verify_env_card", "env_id": "broken", "verifier_id": "card", "depends_on": ["env"]},
            {"id": "protocol", "type": "verify_env_core_protocol", "env_id": "broken", "verifier_id": "protocol",
             "depends_on": ["env"]},
            {"id": "tools", "type": "verify_mcp_tool_schema", "env_id": "broken", "verifier_id": "tools", "depends_on": ["env"]},
        ])
    card = failed(context, "card")
    assert set(card) == {"field:protocolVersion", "capabilities.operations", "capabilities.extensions",
                         "mcp_interface", "tools_match_mcp"}
    assert card["field:protocolVersion"] == "protocolVersion = '0.9', expected '1.0'"
    assert card["capabilities.operations"] == "operations ['data/get'] lack the core data plane ['data/reset', 'data/add']"
    assert card["capabilities.extensions"] == "extensions[0] needs a string 'uri'"
    assert card["mcp_interface"] == (f"the card's mcp interface gives {server.url}/elsewhere, "
                                     f"but the env serves MCP at {server.url}/mcp")
    assert card["tools_match_mcp"].startswith(f"MCP at {server.url}/mcp could not be listed")
    protocol = failed(context, "protocol")
    assert protocol["data/get"] == "data/get must answer {'parts': [...]}, got {'state': {}}"
    assert protocol["data/add"] == "data/add is not served (-32601 method not found)"
    assert protocol["data/reset"] == "the card's operations ['data/get'] lack data/reset"
    assert protocol["error:method_not_found"] == (f"POST {server.url}/agentenv -> HTTP 404 (JSON-RPC answers use "
                                                  "HTTP 200): no such method")
    assert protocol["error:parse"].startswith(f"POST {server.url}/agentenv -> HTTP 400")
    assert list(failed(context, "tools")) == ["mcp_reachable"]
    assert {v["score"] for v in context.metadata["verifications"].values()} == {0.0}
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_a_tool_without_description_or_with_a_bad_name_fails_its_tool_row(tmp_path):
    server_mcp = MCPServer("tools", log_level="WARNING")

    @server_mcp.tool(name="look up!")
    def look_up(key: str) -> str:
        return key

    @server_mcp.tool()
    def fine(key: str) -> str:
        """Return the key."""
        return key

    app = server_mcp.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    with ThreadedServer(app) as server:
        root = make_project(tmp_path / "p", tasks={},
                            extra_config=f'[envs.registry.tools]\nmcp_url = "{server.url}/mcp"\n')
        context = run_steps(root, [
            {**EMAIL, "env_id": "tools", "id": "env"},
            {"id": "tools", "type": "verify_mcp_tool_schema", "env_id": "tools", "verifier_id": "tools", "depends_on": ["env"]},
        ])
    assert failed(context, "tools") == {
        "tool:look up!": "name 'look up!' must match ^[A-Za-z0-9_-]{1,64}$; no description",
    }
    assert rows_of(context, "tools")["tool:fine"]["result"] is True


# -- agents ------------------------------------------------------------------------------------
def test_the_replay_agent_passes_and_system_prompt_obedience_is_not_graded(project):
    context = run_steps(project, [
        EMAIL, INBOX, AGENT,
        {"id": "card", "type": "verify_a2a_agent_card", "agent_name": "assistant", "verifier_id": "card", "depends_on": ["agent"]},
        {"id": "protocol", "type": "verify_a2a_core_protocol", "agent_name": "assistant", "verifier_id": "protocol",
         "depends_on": ["agent"]},
        {"id": "mcp", "type": "verify_a2a_agent_mcp", "agent_name": "assistant", "env_id": "email", "verifier_id": "mcp",
         "prompt": "Reply to Dana.", "depends_on": ["inbox", "agent"]},
        {"id": "sp", "type": "verify_a2a_system_prompt", "agent_name": "assistant", "verifier_id": "sp",
         "depends_on": ["protocol", "mcp"]},
    ])
    verifications = context.metadata["verifications"]
    assert {k: verifications[k]["score"] for k in ("card", "protocol", "mcp")} == {"card": 1.0, "protocol": 1.0, "mcp": 1.0}
    assert "urn:agentenv:mcp-config/v1" in verifications["card"]["extensions"]
    # the replay agent has no episode for the probe prompt: a failed task is still a conformant exchange
    assert rows_of(context, "protocol")["task_terminal"]["justification"] == "task ended in state 'failed'"
    assert rows_of(context, "mcp")["tool_invoked"]["justification"] == "called ['mcp__email__email_search', 'mcp__email__send']"
    assert rows_of(context, "mcp")["trajectory_on_reply"]["justification"] == (
        "the reply carries the trajectory its endpoint serves")
    sp = verifications["sp"]
    assert sp["score"] is None and sp["graded"] is False
    assert sp["reason"] == ("system_prompt_obeyed: obeying a system prompt needs a model; agent 'assistant' is the "
                            "replay agent 'claude-code', which has no model")
    assert {i for i, r in rows_of(context, "sp").items() if r["result"] is True} == {
        "agent_config_advertised", "system_prompt_supported", "system_prompt_accepted", "system_prompt_readback"}


def test_a_trajectory_on_the_reply_must_be_the_one_the_endpoint_serves():
    served = [{"type": "message", "role": "user", "text": "hi"}]

    def rows(metadata: dict) -> list[tuple[str, bool, str]]:
        reply = A2AReply(task_id="t1", context_id="c1", state="completed", text="ok", data={}, metadata=metadata)
        return [(r["id"], r["result"], r["justification"]) for r in trajectory_on_reply_rows(reply, served)]

    assert rows({}) == []  # attaching none is fine: prompt_agent asks the endpoint
    assert rows(trajectory_metadata(served)) == [
        ("trajectory_on_reply", True, "the reply carries the trajectory its endpoint serves")]
    assert rows(trajectory_metadata([])) == [
        ("trajectory_on_reply", False, "the reply carries 0 event(s), the endpoint serves 1")]
    assert rows({TRAJECTORY_URI: {"trajectory": served}}) == [
        ("trajectory_on_reply", False, "metadata['urn:agentenv:trajectory/v1'] must be {'trajectory_json': "
                                       "<JSON text>}, got {'trajectory': [{'type': 'message', 'role': 'user', 'text': 'hi'}]}")]
    (row,) = rows({TRAJECTORY_URI: {"trajectory_json": "[{"}})
    assert row[:2] == ("trajectory_on_reply", False) and row[2].startswith(
        "metadata['urn:agentenv:trajectory/v1'] is not JSON text: ")


def test_tool_use_is_not_graded_when_the_replay_agent_has_no_episode_for_the_prompt(project):
    context = run_steps(project, [
        EMAIL, AGENT,
        {"id": "mcp", "type": "verify_a2a_agent_mcp", "agent_name": "assistant", "env_id": "email", "verifier_id": "mcp",
         "depends_on": ["agent"]},
    ])
    entry = context.metadata["verifications"]["mcp"]
    assert entry["score"] is None and entry["graded"] is False
    assert entry["reason"].startswith("tool_invoked: agent 'assistant' is the replay agent 'claude-code', which has no "
                                      "model and no episode for the prompt")
    assert failed(context, "mcp") == {}


def test_the_system_prompt_check_restores_the_previous_system_prompt(project):
    card = build_card("replay-agent", "An embedded replay agent served by the test")
    agent = EmbeddedAgent(ReplayBrain({}), LocalSandbox(project / "sandbox"))
    with ThreadedServer(build_app(agent, card)) as server:
        for interface in card.supported_interfaces:
            interface.url = server.url + "/"
        httpx.post(f"{server.url}/ext/agent-config", json={"system_prompt": "Be terse."}).raise_for_status()
        record = DeployedAgent(agent_name="a", api_url=server.url, a2a_url=server.url, a2a_agent_id="replay")
        context = run_direct(project, {"id": "sp", "type": "verify_a2a_system_prompt", "agent_name": "a"},
                             TaskStepContext(deployed_agents=[record]))
        after = httpx.get(f"{server.url}/ext/agent-config").json()["config"]
    assert after["system_prompt"] == "Be terse."
    assert context.metadata["verifications"]["sp"]["graded"] is False


def broken_agent_app(tasks: dict) -> Starlette:
    """A 0.3-style card (no supportedInterfaces) that takes images only, a skill without a
    name, agent-config without system_prompt and a failing get; a JSON-RPC endpoint that
    loses the contextId, has no status message and never answers an error."""
    card = {"name": "broken-agent", "description": "Deliberately non-conformant", "version": "0.1",
            "url": "http://127.0.0.1/", "capabilities": {"extensions": [{
                "uri": "urn:agentenv:agent-config/v1",
                "params": {"endpoint": "/ext/agent-config", "methods": {
                    "set": {"method": "POST", "request": {"supported": ["model"]}}, "get": {"method": "GET"}}}}]},
            "defaultInputModes": ["image/png"], "defaultOutputModes": ["text/plain"], "skills": [{"id": "x"}]}

    async def rpc(request: Request):
        body = await request.json()
        rid, params = body.get("id"), body.get("params") or {}
        if body.get("method") == "SendMessage":
            task = {"id": uuid.uuid4().hex, "contextId": "someone-else", "status": {"state": "TASK_STATE_COMPLETED"}}
            tasks[task["id"]] = task
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": {"task": task}})
        if body.get("method") in ("GetTask", "CancelTask"):
            task = tasks.get(params.get("id")) or {"id": params.get("id"), "status": {"state": "TASK_STATE_COMPLETED"}}
            return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": task})
        return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": -32600, "message": "invalid"}})

    return Starlette(routes=[
        Route("/.well-known/agent-card.json", lambda r: JSONResponse(card)),
        Route("/ext/agent-config", lambda r: PlainTextResponse("boom", status_code=500), methods=["GET", "POST"]),
        Route("/", rpc, methods=["POST"]),
    ])


def test_a_non_conformant_agent_fails_the_right_checks(project):
    with ThreadedServer(broken_agent_app({})) as server:
        record = DeployedAgent(agent_name="broken", api_url=server.url, a2a_url=server.url)
        env = DeployedEnv(env_id="email", mcp_url="http://127.0.0.1:9/mcp")
        context = TaskStepContext(deployed_agents=[record], deployed_envs=[env])
        for step in ({"id": "card", "type": "verify_a2a_agent_card"}, {"id": "protocol", "type": "verify_a2a_core_protocol"},
                     {"id": "sp", "type": "verify_a2a_system_prompt"},
                     {"id": "mcp", "type": "verify_a2a_agent_mcp", "env_id": "email"}):
            run_direct(project, {**step, "agent_name": "broken"}, context)
    card = failed(context, "card")
    assert set(card) == {"legacy_card_path", "jsonrpc_interface", "text_input", "field:skills", "extension_endpoints"}
    assert card["legacy_card_path"].startswith(f"GET {server.url}/.well-known/agent.json -> HTTP 404")
    assert card["jsonrpc_interface"] == "'supportedInterfaces' must be a non-empty list (A2A 1.0), got None"
    assert card["text_input"] == ("defaultInputModes ['image/png'] do not accept text/plain "
                                  "(agent-env sends text prompts)")
    assert card["field:skills"] == "skills[0] needs non-empty 'id', 'name', 'description' and a 'tags' list"
    assert card["extension_endpoints"].startswith(
        f"urn:agentenv:agent-config/v1 get: GET {server.url}/ext/agent-config -> HTTP 500")
    protocol = failed(context, "protocol")
    assert set(protocol) == {"jsonrpc_interface", "context_id", "status_message", "task_not_found",
                             "method_not_found", "cancel_finished_task"}
    assert protocol["context_id"].startswith("contextId 'someone-else' is not the one sent")
    assert protocol["status_message"].startswith("the final status carries no message with a text part")
    assert protocol["task_not_found"] == "GetTask succeeded; expected error -32001"
    assert protocol["method_not_found"] == "agentenv/NoSuchMethod got error code -32600 ('invalid'), expected -32601"
    assert protocol["cancel_finished_task"] == "CancelTask succeeded; expected error -32002"
    assert failed(context, "sp") == {
        "system_prompt_supported": "'system_prompt' is not among the set operation's supported fields"}
    assert failed(context, "mcp") == {
        "mcp_config_advertised": "the card does not advertise urn:agentenv:mcp-config/v1 with an 'add' operation"}
    assert {v["score"] for v in context.metadata["verifications"].values()} == {0.0}
    assert all(v["graded"] for v in context.metadata["verifications"].values())


def test_a_validator_needs_its_deployment(project):
    with pytest.raises(RuntimeError, match=r"Agent with name 'ghost' not found in context.deployed_agents"):
        run_direct(project, {"id": "card", "type": "verify_a2a_agent_card", "agent_name": "ghost"}, TaskStepContext())
    with pytest.raises(RuntimeError, match=r"Env 'ghost' not found in context.deployed_envs"):
        run_direct(project, {"id": "card", "type": "verify_env_card", "env_id": "ghost"}, TaskStepContext())
