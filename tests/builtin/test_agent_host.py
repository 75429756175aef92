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


@pytest.mark.parametrize(("environment", "enabled"), [(None, False), ("false", False), ("true", True)])
def test_an_agent_process_turns_a2a_tracing_off_unless_the_environment_turns_it_on(environment, enabled):
    """An agent's process (``python -m agentenv_dagster.builtin.agents``, here asked for
    ``--help`` once its imports are done) sets a2a-sdk's own tracing switch: off, as no tracer
    is set up in it, unless its environment says otherwise."""
    code = ("import runpy, sys\n"
            "sys.argv = ['agents', '--help']\n"
            "try: runpy.run_module('agentenv_dagster.builtin.agents', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "from a2a.utils import telemetry\n"
            "print(telemetry.otel_enabled)")
    env = {k: v for k, v in os.environ.items() if k != "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"}
    if environment is not None:
        env["OTEL_INSTRUMENTATION_A2A_SDK_ENABLED"] = environment
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert shown.splitlines()[-1] == str(enabled)


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
