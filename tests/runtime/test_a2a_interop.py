"""The A2A client against a2a-sdk's sample agent, of each protocol version (1.0, 0.3) and each
transport (JSON-RPC, HTTP+JSON/REST, gRPC), on 127.0.0.1: the card decides how the prompt
travels, and agent-env's extensions (agent-config, trajectory) work the same everywhere."""

from __future__ import annotations

import httpx
import pytest
from a2a_samples import TRANSPORTS, VERSIONS, sample_agent

from agentenv_dagster.runtime.a2a_client import AGENT_CONFIG_URI, TRAJECTORY_URI, A2AClient, A2AError, reply_trajectory

pytestmark = pytest.mark.anyio
# what each transport asks for a prompt, by protocol version
SEND = {
    ("1.0", "JSONRPC"): "SendMessage", ("0.3", "JSONRPC"): "message/send",
    ("1.0", "HTTP+JSON"): "/a2a/rest/message:send", ("0.3", "HTTP+JSON"): "/a2a/rest/v1/message:send",
    ("1.0", "GRPC"): "/lf.a2a.v1.A2AService/SendMessage", ("0.3", "GRPC"): "/a2a.v1.A2AService/SendMessage",
}


@pytest.fixture
async def a2a():
    async with httpx.AsyncClient(timeout=30) as http:
        client = A2AClient(http)
        try:
            yield client
        finally:
            await client.aclose()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("version", VERSIONS)
async def test_a_prompt_reaches_the_sample_agent_of_every_version_and_transport(a2a, version, transport):
    with sample_agent(version, transport) as (url, state):
        card = await a2a.get_card(url)
        await a2a.post_extension(url, card, AGENT_CONFIG_URI, {"system_prompt": "[configured]"})
        reply = await a2a.send_and_wait(url, "hello there", timeout_seconds=20, context_id=f"ctx-{version}",
                                        requested_extensions=(TRAJECTORY_URI,))
        assert (reply.state, reply.context_id) == ("completed", f"ctx-{version}")
        assert reply.text == "[configured] Hello World! You said: 'hello there'."
        expected = [{"type": "message", "role": "user", "text": "hello there"},
                    {"type": "message", "role": "assistant", "text": reply.text}]
        assert reply_trajectory(reply) == expected
        assert await a2a.get_trajectory(url, card, reply.task_id) == expected
        sent = [call for call in state.calls if call[0] == SEND[version, transport]]
        assert sent == [(SEND[version, transport], version)]


@pytest.mark.parametrize("transport", ["JSONRPC", "HTTP+JSON"])
async def test_a_prompt_past_its_deadline_is_cancelled_on_a_1_0_agent(a2a, transport):
    with sample_agent("1.0", transport) as (url, state):
        with pytest.raises(TimeoutError, match=r"A2A task [0-9a-f-]{36} did not complete within 0.5s"):
            await a2a.send_and_wait(url, "slow please", timeout_seconds=0.5)
        cancelled = [call[0] for call in state.calls if call[0] == "CancelTask" or call[0].endswith(":cancel")]
        assert len(cancelled) == 1


async def test_a_prompt_past_its_deadline_on_a_0_3_agent_is_reported_without_a_task_id(a2a):
    """An 0.3 agent cannot list a context's tasks: the prompt is abandoned, not cancelled."""
    with sample_agent("0.3", "JSONRPC") as (url, _):
        with pytest.raises(TimeoutError, match=r"A2A task \(unknown\) did not complete within 0.5s"):
            await a2a.send_and_wait(url, "slow please", timeout_seconds=0.5)


async def test_an_agent_whose_card_offers_no_transport_we_speak_is_refused(a2a):
    with sample_agent("1.0", "JSONRPC") as (url, _):
        card = await a2a.get_card(url)
        card["supportedInterfaces"] = [{"url": "ws://127.0.0.1:1", "protocolBinding": "WEBSOCKET", "protocolVersion": "1.0"}]
        with pytest.raises(A2AError, match=r"offers only the transports \['WEBSOCKET'\]; this client speaks "
                                           r"\['JSONRPC', 'HTTP\+JSON', 'GRPC'\]"):
            await a2a.send_and_wait(url, "hi", timeout_seconds=5, card=card)


async def test_the_sdk_client_rides_on_the_runtime_http_client():
    """Headers the runtime's client adds (a run's bearer token, for one) reach the agent."""
    seen: list[str | None] = []

    async def remember(request: httpx.Request) -> None:
        seen.append(request.headers.get("authorization"))

    async with httpx.AsyncClient(timeout=30, headers={"Authorization": "Bearer run-token"},
                                 event_hooks={"request": [remember]}) as http:
        client = A2AClient(http)
        with sample_agent("0.3", "HTTP+JSON") as (url, _):
            reply = await client.send_and_wait(url, "hi", timeout_seconds=20)
    assert reply.state == "completed"
    assert seen and set(seen) == {"Bearer run-token"}  # the card and the prompt


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_task_that_comes_back_unfinished_is_polled_to_its_end(a2a, version):
    with sample_agent(version, "JSONRPC") as (url, state):
        reply = await a2a.send_and_wait(url, "early bird", timeout_seconds=20, poll_interval=0.05)
        assert (reply.state, reply.text) == ("completed", "Hello World! You said: 'early bird'.")
        polls = [call for call in state.calls if call[0] in ("GetTask", "tasks/get")]
        assert polls and set(polls) == {({"1.0": "GetTask", "0.3": "tasks/get"}[version], version)}
