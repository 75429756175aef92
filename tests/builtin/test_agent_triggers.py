"""The agent side of urn:agentenv:triggers/v1 on a real embedded agent process: the card, the
registration, and what ``decide`` fires for crafted turns (no model, no env)."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from agentenv_dagster.runtime.a2a_client import TRIGGERS_URI, A2AClient
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate
from projects import REPO

pytestmark = pytest.mark.anyio

# One trigger per condition type and both actions; decide evaluates them in this order.
SCRIPT = [
    {"id": "open", "when": {"type": "step", "turn": 1}, "actions": [{"type": "say", "text": "[PM]: Look into LeapBlock."}]},
    {"id": "answer-format", "when": {"type": "conversational", "where": {"message": {"regex": "(?i)format"}}},
     "actions": [{"type": "say", "text": "[PM]: Title 'LeapBlock'; sections A/B/C."}]},
    {"id": "re-sweep", "when": {"type": "env_trigger", "env_id": "env-x", "trigger_id": "v6-rate"},
     "actions": [{"type": "say", "text": "[PM]: Vendor news landed, re-sweep."}]},
    {"id": "nudge", "once": False, "when": {"type": "any", "of": [
        {"type": "conversational", "where": {"message": {"regex": "(?i)stuck"}}},
        {"type": "step", "turn": 6, "cmp": "gte"}]},
     "actions": [{"type": "say", "text": "[PM]: Want help?"}]},
    {"id": "accept", "when": {"type": "all", "of": [
        {"type": "env_trigger", "env_id": "env-x", "trigger_id": "v6-accept", "status": "fired"},
        {"type": "step", "turn": 2, "cmp": "gte"}]},
     "actions": [{"type": "say", "text": "[PM]: Looks good."}, {"type": "end"}]},
]


@pytest.fixture
def agent_url(tmp_path):
    """A replay agent served on 127.0.0.1 by its own process, ended afterwards."""
    config = tmp_path / "agent.json"
    config.write_text(json.dumps({"name": "stakeholder", "episodes": []}))
    pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    server = spawn_server("agentenv_dagster.builtin.agents", ["replay", "--sandbox", str(tmp_path / "sb"),
                                                               "--config-file", str(config)],
                          workdir=tmp_path / "agent", ttl_seconds=120, env={"PYTHONPATH": pythonpath})
    try:
        yield server.authed_url  # the token in the URL: every request carries it
    finally:
        terminate(server.pid)
    assert not is_running(server.pid)


async def test_the_card_advertises_register_decide_and_state(agent_url):
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2AClient(http).get_card(agent_url)
    [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == TRIGGERS_URI]
    assert ext["params"]["endpoint"] == "/ext/triggers"
    methods = ext["params"]["methods"]
    assert (methods["register"]["method"], methods["state"]["method"]) == ("POST", "GET")
    assert methods["decide"] == {"method": "POST", "endpoint": "/ext/triggers/decide", "request": {
        "required": ["turn"], "optional": ["solver_message", "context_id", "env_triggers"]}}


async def test_decide_fires_the_triggers_whose_conditions_hold(agent_url):
    async with httpx.AsyncClient(timeout=30, base_url=agent_url) as http:
        registered = await http.post("/ext/triggers", json={"triggers": SCRIPT})
        assert registered.json() == {"ok": True, "added": [t["id"] for t in SCRIPT], "all": [t["id"] for t in SCRIPT]}
        assert (await http.post("/ext/triggers", json={"triggers": SCRIPT[:1]})).json()["added"] == ["open"]  # no-op

        async def decide(turn: int, message: str = "", envs: dict | None = None, context: str = "c1") -> dict:
            response = await http.post("/ext/triggers/decide", json={
                "turn": turn, "solver_message": message, "context_id": context, "env_triggers": envs or {}})
            assert response.status_code == 200, response.text
            return response.json()

        assert await decide(1, "hello") == {"parts": [{"kind": "text", "text": "[PM]: Look into LeapBlock."}],
                                            "done": False, "fired": ["open"]}
        assert (await decide(2, "Which format?"))["fired"] == ["answer-format"]
        assert (await decide(3, "drafted", {"env-x": {"v6-rate": "firing"}}))["fired"] == []  # not fired yet
        assert (await decide(4, "drafted", {"env-x": {"v6-rate": "fired"}}))["fired"] == ["re-sweep"]
        accepted = await decide(5, "done", {"env-x": {"v6-rate": "fired", "v6-accept": "fired"}})
        assert accepted == {"parts": [{"kind": "text", "text": "[PM]: Looks good."}], "done": True, "fired": ["accept"]}
        assert (await decide(1, "hello"))["fired"] == ["open"]  # a turn gone back (a retry) starts afresh
        assert [(await decide(t, context="c2"))["fired"] for t in (6, 7)] == [["nudge"], ["nudge"]]  # once: false
        both = await decide(1, "I am stuck", context="c3")
        assert both["fired"] == ["open", "nudge"] and both["parts"][0]["text"] == "[PM]: Look into LeapBlock.\n[PM]: Want help?"

        state = (await http.get("/ext/triggers")).json()
    assert [(t["id"], t["when_type"], t["once"]) for t in state["triggers"]] == [
        ("open", "step", True), ("answer-format", "conversational", True), ("re-sweep", "env_trigger", True),
        ("nudge", "any", False), ("accept", "all", True)]
    log = state["firing_log"]
    assert [e["kind"] for e in log[:2]] == ["registered", "registered"]
    assert [e["trigger_id"] for e in log if e["kind"] == "fired" and e["context_id"] == "c1"] == [
        "open", "answer-format", "re-sweep", "accept", "open"]
    assert [(e["context_id"], e["turn"]) for e in log if e["kind"] == "reset"] == [("c1", 1)]


REFUSALS = [
    ({"triggers": []}, "'triggers' must be a non-empty list"),
    ({"triggers": [{"id": "x", "when": {"type": "bogus"}, "actions": [{"type": "say", "text": "hi"}]}]},
     "trigger 'x': unknown when.type 'bogus' (known: step, env_trigger, conversational, all, any)"),
    ({"triggers": [{"id": "x", "when": {"type": "step"}, "actions": [{"type": "say"}]}]},
     "trigger 'x': say.text must be a non-empty string"),
    ({"triggers": [{"id": "x", "when": {"type": "conversational", "where": {"message": {"regex": "("}}},
                    "actions": [{"type": "end"}]}]},
     "trigger 'x': where.message: invalid regex: missing ), unterminated subpattern at position 0"),
    ({"triggers": [{"id": "x", "when": {"type": "env_trigger", "env_id": "e"}, "actions": [{"type": "end"}]}]},
     "trigger 'x': env_trigger.trigger_id must be a non-empty string"),
    ({"triggers": [{"id": "new", "when": {"type": "step"}, "actions": [{"type": "end"}]},
                   {"id": "open", "when": {"type": "step", "turn": 2}, "actions": [{"type": "end"}]}]},
     "trigger 'open' already registered with a different spec (use a new id)"),
]


async def test_bad_registrations_are_refused_whole(agent_url):
    async with httpx.AsyncClient(timeout=30, base_url=agent_url) as http:
        await http.post("/ext/triggers", json={"triggers": SCRIPT[:1]})
        for body, message in REFUSALS:
            refused = await http.post("/ext/triggers", json=body)
            assert (refused.status_code, refused.json()) == (400, {"error": message})
        assert [t["id"] for t in (await http.get("/ext/triggers")).json()["triggers"]] == ["open"]  # not even 'new'
        bad_turn = await http.post("/ext/triggers/decide", json={"turn": 0})
        assert (bad_turn.status_code, bad_turn.json()) == (400, {"error": "decide: 'turn' must be a positive integer"})
