"""prompt_agent's agent-config and trajectory: on the prompt itself for an agent that takes them
there (one request a prompt), by their own POSTs for one that does not; the same outcome."""

from __future__ import annotations

import json

import pytest
from fakes.messages_api import ThreadedServer

from agentenv_dagster.builtin.agents.replay import ReplayBrain
from agentenv_dagster.builtin.agents.server import EmbeddedAgent, build_app, build_card
from agentenv_dagster.context import DeployedAgent, TaskStepContext
from agentenv_dagster.runtime.a2a_client import AGENT_CONFIG_URI
from agentenv_dagster.runtime.artifacts import ObjectStore
from agentenv_dagster.runtime.sandbox import LocalSandbox
from projects import make_project, run_direct

PROMPT = {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": "p", "prompt": "take a note",
          "model": "note-model", "system_prompt": "Be brief.", "max_turns": 4}


def recorded(app, seen: list[tuple[str, str, str]], *, heeds_extensions: bool):
    """``app``, noting each request's method, path and ``A2A-Extensions`` header; without
    ``heeds_extensions`` the header stops here, as at an agent that knows none."""
    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            seen.append((scope["method"], scope["path"], headers.get(b"a2a-extensions", b"").decode()))
            if not heeds_extensions:
                scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"a2a-extensions"]}
        await app(scope, receive, send)

    return asgi


@pytest.mark.parametrize("in_message", [True, False], ids=["carried", "posted"])
def test_a_prompt_configures_the_agent_and_keeps_its_trajectory(tmp_path, in_message):
    root = make_project(tmp_path / "p", tasks={})
    card = build_card("note-agent", "A replay agent served by the test")
    if not in_message:  # an agent that takes agent-config only at its endpoint, and knows no A2A extensions
        (config_extension,) = [e for e in card.capabilities.extensions if e.uri == AGENT_CONFIG_URI]
        del config_extension.params["methods"]["set"]["in_message"]
    agent = EmbeddedAgent(ReplayBrain({"episodes": [{"match": "note", "reply": "noted"}]}),
                          LocalSandbox(tmp_path / "sandbox"))
    seen: list[tuple[str, str, str]] = []
    with ThreadedServer(recorded(build_app(agent, card), seen, heeds_extensions=in_message)) as server:
        for interface in card.supported_interfaces:
            interface.url = server.url + "/"
        record = DeployedAgent(agent_name="a", api_url=server.url, a2a_url=server.url)
        context = run_direct(root, PROMPT, TaskStepContext(deployed_agents=[record]))

    requests = [(method, path) for method, path, _ in seen if not path.startswith("/.well-known/")]
    if in_message:
        assert requests == [("POST", "/")]
    else:
        assert requests == [("POST", "/ext/agent-config"), ("POST", "/"), ("POST", "/ext/trajectory")]
    assert [asked for method, path, asked in seen if path == "/"] == ["urn:agentenv:trajectory/v1"]
    assert {k: agent.config[k] for k in ("model", "system_prompt", "max_turns", "timeout_seconds")} == {
        "model": "note-model", "system_prompt": "Be brief.", "max_turns": 4, "timeout_seconds": 600}
    assert isinstance(agent.config["max_turns"], int)
    response = context.find_prompt_response("p")
    assert response.response == "noted"
    assert json.loads(ObjectStore.read(response.agent_trajectory_object_url)) == [
        {"type": "message", "role": "user", "text": "take a note"},
        {"type": "message", "role": "assistant", "text": "noted"}]
