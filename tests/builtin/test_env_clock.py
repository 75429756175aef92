"""The embedded envs' virtual clock and triggers, served for real (reference agentenv.md §3
"Clock / trigger steps", §4 gateway control surface): set/read/clear the clock, tools and data
on virtual time, and triggers on tool calls, state (incl. ``data/add``) and the clock."""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import httpx2
import mcp
import pytest
from mcp.client.streamable_http import streamable_http_client

from agentenv_dagster.builtin.envs.clock import VirtualClock
from agentenv_dagster.builtin.envs.triggers import TriggerEngine
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate

ENV_MODULE = "agentenv_dagster.builtin.envs"
REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}

MONDAY = "2026-11-30T09:00:00Z"
NOT_ARMED = {"ok": False, "error": {"code": "not_armed", "message": "clock is not armed"}}


@pytest.fixture
def env(tmp_path):
    """A fresh email env per test (clock and triggers are per-instance state); ended after."""
    server = spawn_server(ENV_MODULE, ["email"], workdir=tmp_path, ttl_seconds=60, env=SERVER_ENV)
    with httpx.Client(base_url=server.authed_url, timeout=10) as http:  # the run's token in the URL
        yield http
    terminate(server.pid)
    assert not is_running(server.pid)


def base(http: httpx.Client) -> str:
    return str(http.base_url).rstrip("/")


def where(http: httpx.Client) -> str:
    """The env's URL as it names itself (without the token the client's URL carries)."""
    return str(http.base_url.copy_with(username=None, password=None)).rstrip("/")


def rpc(http: httpx.Client, method: str, params: dict | None = None) -> dict:
    body = http.post("/agentenv", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}).json()
    assert "error" not in body, body
    return body["result"]


def add_emails(http: httpx.Client, *emails: dict) -> None:
    rpc(http, "data/add", {"parts": [{"kind": "data", "data": {"emails": list(emails)}}]})


def state(http: httpx.Client) -> dict:
    return rpc(http, "data/get")["parts"][0]["data"]


async def call(http: httpx.Client, tool: str, args: dict | None = None, role: str | None = None):
    headers = {"AgentEnv-Role": role} if role else None
    async with httpx2.AsyncClient(headers=headers) as client:
        async with mcp.Client(streamable_http_client(f"{base(http)}/mcp", http_client=client)) as session:
            return await session.call_tool(tool, args or {})


async def tool_names(http: httpx.Client) -> list[str]:
    async with mcp.Client(f"{base(http)}/mcp") as session:
        return [t.name for t in (await session.list_tools()).tools]


def set_time(http: httpx.Client, virtual_time: str = MONDAY, rate: float = 0) -> httpx.Response:
    return http.put("/clock/set-time", json={"virtual_time": virtual_time, "virtual_seconds_per_real_second": rate})


def wait_for(predicate, what: str, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def trigger(http: httpx.Client, trigger_id: str) -> dict:
    return next(t for t in http.get("/triggers/state").json()["triggers"] if t["id"] == trigger_id)


def events(http: httpx.Client, trigger_id: str) -> list[str]:
    return [e["kind"] for e in http.get("/triggers/state").json()["events"] if e.get("trigger_id") == trigger_id]


# -- clock ----------------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_unarmed_env_answers_wall_time(env):
    assert env.get("/clock/time").status_code == 404
    assert env.get("/clock/time").json() == NOT_ARMED
    assert env.get("/clock/state").json() == {"armed": False, "env_get_time_url": f"{where(env)}/clock/time"}
    assert await tool_names(env) == ["email_search", "read_email", "send"]
    await call(env, "send", {"to": "a@x", "subject": "s", "body": "b"})
    sent = datetime.fromisoformat(state(env)["sent"][0]["date"].replace("Z", "+00:00"))
    assert abs(sent - datetime.now(timezone.utc)) < timedelta(minutes=1)


@pytest.mark.anyio
async def test_frozen_clock_dates_tools_and_arriving_data(env):
    armed = set_time(env, MONDAY, rate=0)
    assert armed.status_code == 200
    assert armed.json() == {"armed": True, "t0": MONDAY, "virtual_seconds_per_real_second": 0.0,
                            "virtual_time": MONDAY, "env_get_time_url": f"{where(env)}/clock/time"}
    assert env.get("/clock/time").json() == {"virtual_time": MONDAY}
    # get_time is served only while the clock is armed, and answers the env's time
    assert await tool_names(env) == ["email_search", "read_email", "send", "get_time"]
    assert (await call(env, "get_time")).structured_content == {"current_time": MONDAY}

    add_emails(env, {"id": "new", "from": "dana@example.com", "subject": "Hi"},
               {"id": "old", "from": "bob@example.com", "date": "2025-01-02T09:00:00Z"})
    await call(env, "send", {"to": "dana@example.com", "subject": "Re: Hi", "body": "Hello"})
    inbox, sent = state(env)["inbox"], state(env)["sent"]
    assert [(m["id"], m["date"]) for m in inbox] == [("new", MONDAY), ("old", "2025-01-02T09:00:00Z")]
    assert sent[0]["date"] == MONDAY

    assert env.post("/clock/clear").json() == {"ok": True, "armed": False}
    assert env.get("/clock/time").json() == NOT_ARMED
    assert await tool_names(env) == ["email_search", "read_email", "send"]


def test_a_running_clock_advances_at_its_rate(env):
    set_time(env, MONDAY, rate=3600)  # one virtual hour per real second
    later = wait_for(lambda: (t := env.get("/clock/time").json()["virtual_time"]) >= "2026-11-30T09:10:00Z" and t,
                     "ten virtual minutes")
    assert later < "2026-11-30T12:00:00Z"
    # re-arming re-anchors the timeline
    assert set_time(env, "2026-12-07T08:00:00+00:00", rate=0).json()["virtual_time"] == "2026-12-07T08:00:00Z"


@pytest.mark.parametrize(("body", "message"), [
    ({"virtual_time": "Monday 9am"},
     "invalid RFC3339 virtual_time 'Monday 9am': expected YYYY-MM-DDThh:mm:ss[.fff](Z|+hh:mm)"),
    ({"virtual_time": 1764493200}, "virtual_time must be an RFC3339 string, got int"),
    ({"virtual_time": MONDAY, "virtual_seconds_per_real_second": 86401},
     "virtual_seconds_per_real_second 86401 exceeds max 86400 (1 real s = 1 virtual day)"),
    ({"virtual_time": MONDAY, "virtual_seconds_per_real_second": -1},
     "virtual_seconds_per_real_second must be a finite number >= 0, got -1"),
])
def test_bad_clock_settings_are_refused(env, body, message):
    response = env.put("/clock/set-time", json=body)
    assert response.status_code == 400
    assert response.json() == {"ok": False, "error": {"code": "invalid_params", "message": message}}
    assert env.get("/clock/state").json()["armed"] is False


def test_card_advertises_clock_and_triggers_and_sync_time_reads_the_clock(env):
    extensions = {e["uri"]: e["params"] for e in env.get("/.well-known/agent-env.json").json()["capabilities"]["extensions"]}
    assert sorted(extensions) == ["urn:agentenv:clock/v1", "urn:agentenv:triggers/v1"]
    assert extensions["urn:agentenv:clock/v1"]["methods"]["sync_time"] == {
        "method": "POST", "endpoint": "/agentenv/ext/sync_time", "request": {"required": ["env_get_time_url"]}}
    assert extensions["urn:agentenv:triggers/v1"]["methods"]["register"]["endpoint"] == "/triggers/register"

    set_time(env)
    url = f"{base(env)}/clock/time"
    assert env.post("/agentenv/ext/sync_time", json={"env_get_time_url": url}).json() == {
        "env_get_time_url": url, "virtual_time": MONDAY}
    refused = env.post("/agentenv/ext/sync_time", json={})
    assert (refused.status_code, refused.json()) == (400, {"ok": False, "error": {
        "code": "invalid_params", "message": "env_get_time_url must be an http(s) URL"}})


# -- triggers -------------------------------------------------------------------------------------
DANA_ARRIVES = {
    "id": "dana-email",
    "when": {"type": "state", "check": {"tool": "email_search", "args": {"sender": "dana"}, "extract": "emails",
                                        "predicate": {"exists": True}}},
    "actions": [{"type": "tool", "tool": "send",
                 "args": {"to": "dana@example.com", "subject": "Auto-reply", "body": "Got it"}}],
}


def test_a_state_trigger_fires_once_when_data_arrives(env):
    set_time(env)
    assert env.post("/triggers/register", json={"triggers": [DANA_ARRIVES]}).json() == {
        "ok": True, "added": ["dana-email"], "all": ["dana-email"]}
    add_emails(env, {"id": "b1", "from": "bob@example.com"})
    assert trigger(env, "dana-email")["status"] == "armed"  # bob's email does not meet it

    add_emails(env, {"id": "d1", "from": "dana@example.com", "subject": "Q3?"})
    fired = wait_for(lambda: (t := trigger(env, "dana-email"))["status"] == "fired" and t, "the trigger to fire")
    assert (fired["fire_count"], fired["failure_count"], fired["when"]) == (1, 0, {"type": "state"})
    assert events(env, "dana-email") == ["added", "detected", "action_ok", "fired"]
    detected = next(e for e in env.get("/triggers/state").json()["events"] if e["kind"] == "detected")
    assert (detected["provoking"], detected["virtual_time"]) == ({"source": "data/add"}, MONDAY)
    assert [(m["to"], m["subject"], m["date"]) for m in state(env)["sent"]] == [
        ("dana@example.com", "Auto-reply", MONDAY)]

    add_emails(env, {"id": "d2", "from": "dana@example.com"})  # one-shot: fired stays fired
    time.sleep(0.3)
    assert len(state(env)["sent"]) == 1


@pytest.mark.anyio
async def test_data_that_arrives_while_a_state_check_runs_is_checked_again():
    """The lost wake-up: a check that read the inbox before dana's email came must not be the
    last word on it (under load, the HTTP test above saw the trigger stay armed)."""
    inbox: list[dict] = []
    first_check_read, release = asyncio.Event(), asyncio.Event()
    searches = 0

    async def call(tool: str, args: dict):
        nonlocal searches
        if tool != "email_search":
            return False, {"id": "sent"}, "sent"
        searches += 1
        found = [e for e in inbox if args["sender"] in e["from"]]  # read now: stale after the wait
        if searches == 1:
            first_check_read.set()
            await release.wait()
        return False, {"emails": found}, json.dumps(found)

    engine = TriggerEngine(VirtualClock(), call, lambda: {"email_search", "send"})
    engine.register({"triggers": [DANA_ARRIVES]})
    inbox.append({"id": "b1", "from": "bob@example.com"})
    engine.on_state_change({"source": "data/add"})
    await first_check_read.wait()
    inbox.append({"id": "d1", "from": "dana@example.com"})
    engine.on_state_change({"source": "data/add"})  # during the first check
    release.set()
    for _ in range(100):
        (status,) = [t["status"] for t in engine.state()["triggers"]]
        if status == "fired":
            break
        await asyncio.sleep(0.01)
    assert (status, searches) == ("fired", 2)


@pytest.mark.anyio
async def test_action_triggers_watch_roles_and_template_the_provoking_call(env):
    mirror = {"id": "mirror", "when": {"type": "action", "tool": "send", "where": {"args.to": {"regex": "@example"}},
                                       "repeat": True},
              "actions": [{"type": "tool", "tool": "send",
                           "args": {"to": "audit@log.test", "subject": "${args.subject}", "body": "${result.id}"}}]}
    assert env.post("/triggers/register", json={"triggers": [mirror], "watch_roles": ["default"]}).status_code == 200

    await call(env, "send", {"to": "bob@elsewhere.test", "subject": "skip", "body": "-"})  # where fails
    await call(env, "send", {"to": "carol@example.com", "subject": "by an unwatched role", "body": "-"},
               role="executor")
    await call(env, "send", {"to": "dana@example.com", "subject": "Q3", "body": "-"})
    wait_for(lambda: trigger(env, "mirror")["fire_count"] == 1, "the mirror to fire")
    await call(env, "send", {"to": "erin@example.com", "subject": "Q4", "body": "-"}, role="default")
    wait_for(lambda: trigger(env, "mirror")["fire_count"] == 2, "the mirror to fire again")

    audit = [(m["subject"], m["body"]) for m in state(env)["sent"] if m["to"] == "audit@log.test"]
    assert audit == [("Q3", "sent-3"), ("Q4", "sent-5")]
    assert trigger(env, "mirror")["status"] == "armed"  # repeat: re-armed after each fire


def test_a_time_trigger_fires_when_the_virtual_clock_reaches_it(env):
    at_ten = {"id": "ten", "when": {"type": "time", "at": "PT1H"},
              "actions": [{"type": "tool", "tool": "send", "args": {"to": "me@x", "subject": "10:00", "body": "-"}}]}
    env.post("/triggers/register", json={"triggers": [at_ten]})
    set_time(env, MONDAY, rate=0)
    time.sleep(0.5)
    assert trigger(env, "ten")["status"] == "armed"
    assert trigger(env, "ten")["next_mark"] == "2026-11-30T10:00:00Z"

    set_time(env, MONDAY, rate=7200)  # 2 virtual hours per real second: due within a second
    wait_for(lambda: trigger(env, "ten")["status"] == "fired", "the time trigger")
    [sent] = state(env)["sent"]
    assert sent["subject"] == "10:00" and "2026-11-30T10:00:00Z" <= sent["date"] < "2026-11-30T11:00:00Z"


@pytest.mark.parametrize(("body", "message"), [
    ({"triggers": [{"id": "x", "when": {"type": "action", "tool": "fly"}, "actions": [{"type": "tool", "tool": "send"}]}]},
     "trigger 'x': when.tool names unknown tool 'fly'"),
    ({"triggers": [{"id": "x", "when": {"type": "action", "tool": "send"},
                    "actions": [{"type": "nl", "instruction": "Answer Dana."}]}]},
     "trigger 'x': actions[0]: nl actions require an executor"),
    ({"triggers": [{"id": "x", "when": {"type": "sometimes"}, "actions": []}]},
     "trigger 'x': when.type must be 'action', 'state', or 'time'"),
    ({"triggers": [DANA_ARRIVES], "executor": {"a2a_url": "http://127.0.0.1:9/", "role": "default"}},
     "executor.role 'default' must not be in watch_roles ['default'] — the executor's own tool calls would "
     "fire triggers (cascade)"),
    ({"triggers": "all"}, "triggers must be a list"),
])
def test_bad_registrations_are_refused_whole(env, body, message):
    response = env.post("/triggers/register", json=body)
    assert (response.status_code, response.json()) == (400, {"ok": False, "error": {
        "code": "invalid_params", "message": message}})
    assert env.get("/triggers/state").json()["triggers"] == []


def test_registration_is_idempotent_by_id_and_remove_and_clear_undo_it(env):
    assert env.post("/triggers/register", json={"triggers": [DANA_ARRIVES]}).status_code == 200
    assert env.post("/triggers/register", json={"triggers": [DANA_ARRIVES]}).json()["all"] == ["dana-email"]
    changed = json.loads(json.dumps(DANA_ARRIVES))
    changed["actions"][0]["args"]["body"] = "Other"
    refused = env.post("/triggers/register", json={"triggers": [changed]})
    assert refused.json()["error"]["message"] == (
        "trigger 'dana-email': already registered with a different spec — remove it first or use a new id")

    assert env.post("/triggers/remove", json={"ids": ["dana-email", "ghost"]}).json() == {
        "ok": True, "removed": ["dana-email"]}
    env.post("/triggers/register", json={"triggers": [changed]})
    assert env.post("/triggers/clear").json() == {"ok": True}
    assert env.get("/triggers/state").json() == {
        "config": {"watch_roles": ["default"], "executor_configured": False},
        "triggers": [], "events": [], "events_dropped": 0}
