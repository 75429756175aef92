"""The agent host: one process serving many agents, each a whole A2A agent under its URL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from agentenv_dagster.runtime.a2a_client import AGENT_CONFIG_URI, A2AClient
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate
from projects import REPO

pytestmark = pytest.mark.anyio


def replay(reply: str, **extra) -> dict:
    return {"kind": "replay", "episodes": [{"match": ".", "reply": reply}], **extra}


@pytest.fixture
def host(tmp_path):
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    server = spawn_server("agentenv_dagster.builtin.agents", ["host"], workdir=tmp_path / "host",
                          ttl_seconds=120, env={"PYTHONPATH": pythonpath})
    try:
        yield server  # its URL, and the token every request to it carries
    finally:
        terminate(server.pid)
    assert not is_running(server.pid)


async def test_agents_in_one_host_are_separate(host, tmp_path):
    async with httpx.AsyncClient(timeout=30, headers=host.auth_headers) as http:
        a2a = A2AClient(http)
        urls, cards = {}, {}
        for name in ("a", "b"):
            created = await http.post(f"{host.url}/agents", json={
                "id": name, "sandbox": str(tmp_path / name), "config": replay(f"I am {name}", name=f"agent {name}")})
            assert created.status_code == 201
            urls[name] = created.json()["url"]
            cards[name] = created.json()["card"]  # the card comes with the answer
        assert urls["a"] == f"{host.url}/agents/a"
        assert (await http.get(f"{host.url}/agents")).json() == {"agents": ["a", "b"]}

        card = await a2a.get_card(urls["b"])
        assert card["name"] == "agent b" and card["supportedInterfaces"][0]["url"] == urls["b"] + "/"
        assert cards["b"] == card
        twin = (await http.post(f"{host.url}/agents", json={  # same name: a card of its own, at its own URL
            "id": "b2", "sandbox": str(tmp_path / "b2"), "config": replay("twin", name="agent b")})).json()
        assert twin["card"] == await a2a.get_card(twin["url"]) != card
        assert twin["card"]["supportedInterfaces"][1]["url"] == twin["url"] + "/" == twin["card"]["url"]
        assert await a2a.get_card(urls["b"]) == card  # the twin's card is a copy: b's still names b's URL
        await http.delete(f"{host.url}/agents/b2")
        await a2a.post_extension(urls["a"], card, AGENT_CONFIG_URI, {"model": "for-a"})
        assert (await a2a.get_extension(urls["b"], card, AGENT_CONFIG_URI))["config"] == {"name": "agent b"}  # b's own
        replies = {name: (await a2a.send_and_wait(url, "who?", timeout_seconds=20)).text for name, url in urls.items()}
        assert replies == {"a": "I am a", "b": "I am b"}
        assert (tmp_path / "a").is_dir() and (tmp_path / "b").is_dir()

        deleted = await http.delete(f"{host.url}/agents/a")
        assert deleted.status_code == 200
        assert (await http.get(urls["a"] + "/.well-known/agent-card.json")).status_code == 404
        assert (await a2a.send_and_wait(urls["b"], "still there?", timeout_seconds=20)).text == "I am b"


async def test_the_host_starts_without_the_stores_and_routes_agents_never_use(tmp_path):
    """a2a-sdk loads SQLAlchemy stores and FastAPI routes when installed (Dagster brings them):
    an agent's process keeps them out (half its start-up) and serves all the same. Before
    Python 3.13 it also queues its events in culsans' thread-safe queues: an agent's process
    gives it asyncio's instead (``queues.py``)."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    server = spawn_server("agentenv_dagster.builtin.agents", ["host"], workdir=tmp_path / "host", ttl_seconds=120,
                          env={"PYTHONPATH": pythonpath, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        async with httpx.AsyncClient(timeout=30, headers=server.auth_headers) as http:
            created = (await http.post(f"{server.url}/agents", json={
                "id": "a", "sandbox": str(tmp_path / "a"), "config": replay("here")})).json()
            reply = await A2AClient(http).send_and_wait(created["url"], "anyone?", timeout_seconds=20)
    finally:
        terminate(server.pid)
    assert reply.text == "here"
    imported = [line.rsplit("|", 1)[-1].strip() for line in
                (tmp_path / "host" / "server.log").read_text().splitlines() if line.startswith("import time:")]
    assert "a2a.server.tasks" in imported and "uvicorn" in imported
    assert "sqlalchemy.engine" not in imported and "fastapi.applications" not in imported  # asked for, not loaded
    if sys.version_info < (3, 13):  # a2a's queues are asyncio's, with 3.13's shutdown: not culsans over aiologic
        assert "agentenv_dagster.builtin.agents.queues" in imported
        assert "culsans" not in imported and "aiologic" not in imported


async def test_deleting_an_agent_cancels_its_running_task(host, tmp_path):
    slow = {"kind": "replay", "episodes": [{"match": ".", "reply": "late", "actions": [{"sleep": 30}]}]}
    async with httpx.AsyncClient(timeout=30, headers=host.auth_headers) as http:
        url = (await http.post(f"{host.url}/agents", json={"id": "s", "sandbox": str(tmp_path / "s"), "config": slow})).json()["url"]
        sent = await http.post(url, headers={"A2A-Version": "1.0"}, json={
            "jsonrpc": "2.0", "id": "1", "method": "SendMessage",
            "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "go"}]},
                       "configuration": {"returnImmediately": True}}})
        assert sent.json()["result"]["task"]["id"]
        deleted = await http.delete(f"{host.url}/agents/s")
    assert deleted.json() == {"deleted": "s", "cancelled_tasks": 1}


async def test_bad_requests_say_what_is_wrong(host, tmp_path):
    async with httpx.AsyncClient(timeout=30, headers=host.auth_headers) as http:
        bad_kind = await http.post(f"{host.url}/agents", json={"id": "x", "sandbox": str(tmp_path), "config": {"kind": "nope"}})
        assert bad_kind.status_code == 400 and "unknown agent kind 'nope'" in bad_kind.json()["error"]
        bad_script = await http.post(f"{host.url}/agents", json={
            "id": "y", "sandbox": str(tmp_path), "config": {"kind": "replay", "episodes": [{"match": "("}]}})
        assert bad_script.status_code == 400 and "replay episode 0: 'match' must be a regular expression" in bad_script.json()["error"]
        no_id = await http.post(f"{host.url}/agents", json={"sandbox": str(tmp_path), "config": replay("hi")})
        assert no_id.status_code == 400
        ok = await http.post(f"{host.url}/agents", json={"id": "z", "sandbox": str(tmp_path), "config": replay("hi")})
        again = await http.post(f"{host.url}/agents", json={"id": "z", "sandbox": str(tmp_path), "config": replay("hi")})
        assert ok.status_code == 201 and again.status_code == 409
        assert (await http.delete(f"{host.url}/agents/missing")).status_code == 404


async def test_each_hosted_agent_keeps_its_own_triggers(host, tmp_path):
    trigger = {"id": "hello", "when": {"type": "step", "turn": 1}, "actions": [{"type": "say", "text": "hi"}]}
    async with httpx.AsyncClient(timeout=30, headers=host.auth_headers) as http:
        urls = [(await http.post(f"{host.url}/agents", json={"id": n, "sandbox": str(tmp_path / n), "config": replay("ok")}))
                .json()["url"] for n in ("a", "b")]
        assert (await http.post(urls[0] + "/ext/triggers", json={"triggers": [trigger]})).json()["added"] == ["hello"]
        decided = [(await http.post(url + "/ext/triggers/decide", json={"turn": 1})).json() for url in urls]
        assert decided == [{"parts": [{"kind": "text", "text": "hi"}], "done": False, "fired": ["hello"]},
                           {"parts": [], "done": False, "fired": []}]
        assert (await http.get(urls[1] + "/ext/triggers")).json() == {"triggers": [], "firing_log": []}


@pytest.mark.parametrize(("tracing", "traced"), [("false", False), ("true", True)])
def test_an_agent_process_wraps_a2a_methods_in_spans_only_when_tracing_is_on(tracing, traced):
    """An agent's process (``python -m agentenv_dagster.builtin.agents``, here asked for
    ``--help`` once its imports are done): each method's decorators, outermost first, for a
    message's way through the request handler and the event queue."""
    code = ("import runpy, sys\n"
            "sys.argv = ['agents', '--help']\n"
            "try: runpy.run_module('agentenv_dagster.builtin.agents', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "from a2a.server.request_handlers import DefaultRequestHandler\n"
            "from a2a.server.events.event_queue_v2 import EventQueueSource\n"
            "for f in (DefaultRequestHandler.on_message_send, EventQueueSource.enqueue_event):\n"
            "    chain = [f]\n"
            "    while hasattr(chain[-1], '__wrapped__'): chain.append(chain[-1].__wrapped__)\n"
            "    print(','.join(g.__code__.co_qualname for g in chain))")
    env = {**os.environ, "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED": tracing}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    handler, queue = (line.split(",") for line in shown.splitlines()[-2:])
    assert handler[-1] == "DefaultRequestHandlerV2.on_message_send" and queue[-1] == "EventQueueSource.enqueue_event"
    spans = "trace_function.<locals>.async_wrapper"
    assert (spans in handler, spans in queue) == (traced, traced)


async def test_the_host_ends_at_sigterm_without_waiting_for_what_it_still_runs(tmp_path):
    """SIGTERM is a run's teardown: the host ends then, its request still running cut off, not
    after uvicorn's graceful shutdown has let that request finish (its agent sleeps 30 s)."""
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    server = spawn_server("agentenv_dagster.builtin.agents", ["host"], workdir=tmp_path / "host", ttl_seconds=120,
                          env={"PYTHONPATH": pythonpath})
    slow = {"kind": "replay", "episodes": [{"match": ".", "reply": "late", "actions": [
        {"write_file": "started.txt", "content": "yes"}, {"sleep": 30}]}]}
    try:
        async with httpx.AsyncClient(timeout=60, headers=server.auth_headers) as http:
            url = (await http.post(f"{server.url}/agents", json={
                "id": "s", "sandbox": str(tmp_path / "s"), "config": slow})).json()["url"]
            sending = asyncio.ensure_future(A2AClient(http).send_and_wait(url, "go", timeout_seconds=60))
            while not (tmp_path / "s" / "started.txt").exists():
                assert not sending.done()
                await asyncio.sleep(0.02)
            os.kill(server.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10  # (against the agent's 30 s)
            while is_running(server.pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert not is_running(server.pid)
            with pytest.raises(httpx.TransportError):
                await sending
    finally:
        terminate(server.pid)
