"""sync_env_clock, register_env_triggers and register_agent_triggers against real env servers and
agents (reference agentenv.md §3 "Clock / trigger steps", §2 metadata keys): the Monday task end
to end, the context each step writes, and upstream's refusals word for word."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest
from fakes.messages_api import ThreadedServer
from projects import REPO, leaked_servers, make_project, run_steps
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.config import load_config
from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runtime.artifacts import ObjectStore
from agentenv_dagster.runtime.base import RunInfo, StepRuntime
from agentenv_dagster.steps import BUILTIN_STEPS
from agentenv_dagster.steps.execution import StepFailed
from agentenv_dagster.steps.triggers import read_env_triggers

MONDAY = json.loads((REPO / "tasks" / "monday_dana.json").read_text())
STEPS = {s["id"]: s for s in MONDAY}
EMAIL, CLOCK, ASSISTANT, ON_DANA = STEPS["email"], STEPS["monday"], STEPS["assistant"], STEPS["on_dana"]
DANA, DANA_REACTS, DANA_CHAT = STEPS["dana"], STEPS["dana_reacts"], STEPS["dana_chat"]
TIME_URL = re.compile(r"^http://127\.0\.0\.1:\d+/clock/time$")

# A verifier script that reports the env's trigger state and mail once the Dana trigger settled.
PROBE = '''
import asyncio, httpx

async def verify(mcp_url):
    base = mcp_url.rstrip("/").removesuffix("/mcp")
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(300):
            triggers = (await http.get(f"{base}/triggers/state")).json()
            dana = next((t for t in triggers["triggers"] if t["id"] == "dana-email"), {"status": "fired"})
            if dana["status"] == "fired" or dana["failure_count"]:
                break
            await asyncio.sleep(0.2)
        body = {"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}}
        data = (await http.post(f"{base}/agentenv", json=body)).json()["result"]["parts"][0]["data"]
        clock = (await http.get(f"{base}/clock/state")).json()
    return [{"id": "state", "result": True, "score": 1.0, "triggers": triggers, "mail": data, "clock": clock}]
'''


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p")
    probe = root / "artifacts" / "probe"
    probe.mkdir()
    (probe / "artifact.json").write_text(json.dumps({"type": "file", "description": "test probe"}))
    (probe / "verify.py").write_text(PROBE)
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def probe(depends_on: list[str]) -> dict:
    return {"id": "probe", "type": "env_outcome_verifier", "env_id": "email", "verifier_id": "probe",
            "file_artifact_id": "probe", "depends_on": depends_on}


def probed(context: TaskStepContext) -> dict:
    return context.metadata["verifications"]["probe"]["results"][0]


def in_runtime(root: Path, use):
    """``await use(rt)`` under a plain runtime, for records no deploy step makes."""
    async def go():
        run = RunInfo(run_id="direct", task_id="direct", run_dir=root / ".agentenv" / "direct")
        async with StepRuntime(load_config(root), run) as rt:
            return await use(rt)

    return asyncio.run(go())


def run_direct(root: Path, step: dict, context: TaskStepContext) -> TaskStepContext:
    """One step's ``execute`` on a context of the test's making."""
    async def use(rt):
        await BUILTIN_STEPS.get(step["type"]).model_validate(step).execute(context, rt)
        return context

    return in_runtime(root, use)


# -- the Monday task ---------------------------------------------------------------------------------
def test_monday_trigger_prompts_the_executor_who_answers_dana_in_virtual_time(project):
    # a second trigger watches every default-role send to Dana: the executor's own sends must not set it off
    audit = {"id": "audit", "type": "register_env_triggers", "env_id": "email", "depends_on": ["on_dana"],
             "triggers": [{"id": "audit", "when": {"type": "action", "tool": "send", "where": {"args.to": {"regex": "dana"}}},
                           "actions": [{"type": "tool", "tool": "send",
                                        "args": {"to": "audit@log.test", "subject": "${args.subject}", "body": "-"}}]}]}
    steps = [*MONDAY[:4], audit, {**STEPS["dana_arrives"], "depends_on": ["audit"]},
             STEPS["answered"], probe(["answered"])]
    context = run_steps(project, steps)

    assert context.metadata["clock_configurations"] == [{
        "step_id": "monday", "env_id": "email", "virtual_time": "2026-11-30T09:00:00Z",
        "virtual_seconds_per_real_second": 1.0, "env_get_time_url": context.metadata["clock_configurations"][0]["env_get_time_url"],
        "synced": [{"service": "email", "environment": "email", "synced": True, "result": {
            "env_get_time_url": context.metadata["clock_configurations"][0]["env_get_time_url"],
            "virtual_time": "2026-11-30T09:00:00Z"}}],
        "skipped": [],
    }]
    assert TIME_URL.match(context.metadata["clock_configurations"][0]["env_get_time_url"])
    assert context.metadata["env_trigger_registrations"] == [
        {"step_id": "on_dana", "env_id": "email", "added": ["dana-email"], "executor_agent_name": "assistant"},
        {"step_id": "audit", "env_id": "email", "added": ["audit"], "executor_agent_name": None},
    ]
    answered = context.metadata["verifications"]["answered"]
    assert answered["score"] == 1.0
    assert {r["id"]: r["result"] for r in answered["results"]} == {
        "trigger_fired": True, "replied_to_dana": True, "answered_monday_morning": True}

    state = probed(context)
    dana = next(t for t in state["triggers"]["triggers"] if t["id"] == "dana-email")
    assert (dana["status"], dana["fire_count"], dana["failure_count"]) == ("fired", 1, 0)
    assert state["triggers"]["config"] == {"watch_roles": ["default"], "executor_configured": True}
    fired = [e for e in state["triggers"]["events"] if e.get("trigger_id") == "dana-email"]
    assert [e["kind"] for e in fired] == ["added", "detected", "action_ok", "fired"]
    assert fired[1]["provoking"] == {"source": "data/add"}
    assert fired[2]["detail"]["nl"] == ON_DANA["triggers"][0]["actions"][0]["instruction"]
    assert fired[2]["detail"]["reply"].startswith("Dana asked whether the Q3 numbers are final")

    # Dana's email was stamped when it arrived, the reply when it was sent: both Monday ~9:00
    [arrived] = state["mail"]["inbox"]
    [reply] = state["mail"]["sent"]  # and no audit copy: the executor's send ran under its own role
    assert "2026-11-30T09:00:00Z" <= arrived["date"] <= reply["date"] < "2026-11-30T09:10:00Z"
    assert (reply["to"], reply["subject"]) == ("dana@example.com", "Re: Board deck today")
    audit_trigger = next(t for t in state["triggers"]["triggers"] if t["id"] == "audit")
    assert (audit_trigger["status"], audit_trigger["fire_count"]) == ("armed", 0)
    assert state["clock"]["armed"] is True and state["clock"]["virtual_seconds_per_real_second"] == 1.0


# -- sync_env_clock ------------------------------------------------------------------------------------
def test_a_frozen_clock_and_the_steps_fields(project):
    frozen = {**CLOCK, "virtual_seconds_per_real_second": 0}
    context = run_steps(project, [EMAIL, frozen, probe(["monday"])])
    assert probed(context)["clock"] == {
        "armed": True, "t0": "2026-11-30T09:00:00Z", "virtual_seconds_per_real_second": 0.0,
        "virtual_time": "2026-11-30T09:00:00Z", "env_get_time_url": context.metadata["clock_configurations"][0]["env_get_time_url"]}

    step = BUILTIN_STEPS.get("sync_env_clock").model_validate({"id": "c", "type": "sync_env_clock", "env_id": "email",
                                                               "virtual_time": "2026-11-30T09:00:00Z"})
    assert (step.virtual_seconds_per_real_second, step.tolerate_missing_sync_time, step.timeout_seconds) == (1.0, True, 30)


def test_sync_env_clock_refusals(project):
    with pytest.raises(TaskLoadError, match=re.escape("virtual_time must be an RFC3339 string")):
        run_steps(project, [EMAIL, {**CLOCK, "virtual_time": 1764493200}])
    with pytest.raises(TaskLoadError, match="virtual_seconds_per_real_second"):
        run_steps(project, [EMAIL, {**CLOCK, "virtual_seconds_per_real_second": 86401}])
    with pytest.raises(TaskLoadError, match=re.escape("field 'env_id': no step it depends on deploys env 'email'")):
        run_steps(project, [{**CLOCK, "depends_on": []}])
    with pytest.raises(StepFailed, match=re.escape(
            "step 'monday' (sync_env_clock) failed: clock arm failed (HTTP 400): "
            '{"ok":false,"error":{"code":"invalid_params","message":"invalid RFC3339 virtual_time \'Monday 9am\': '
            'expected YYYY-MM-DDThh:mm:ss[.fff](Z|+hh:mm)"}}')):
        run_steps(project, [EMAIL, {**CLOCK, "virtual_time": "Monday 9am"}])


def _gateway_without_clock_sync(puts: list[dict]) -> Starlette:
    """A live env whose gateway arms a clock but whose card offers no clock/v1; ``/bare`` has no card."""

    async def card(request: Request) -> JSONResponse:
        return JSONResponse({"name": "legacy", "protocolVersion": "1.0", "url": "/agentenv",
                             "capabilities": {"tools": [], "operations": [], "extensions": []}})

    async def set_time(request: Request) -> JSONResponse:
        puts.append(await request.json())
        return JSONResponse({"armed": True})

    async def clock_state(request: Request) -> JSONResponse:
        return JSONResponse({"armed": True, "env_get_time_url": "http://gw/clock/time"})

    routes = []
    for prefix in ("", "/bare"):
        routes += [Route(f"{prefix}/clock/set-time", set_time, methods=["PUT"]), Route(f"{prefix}/clock/state", clock_state)]
    return Starlette(routes=[*routes, Route("/.well-known/agent-env.json", card)])


def test_servers_that_cannot_sync_are_skipped_unless_intolerant(tmp_path, caplog):
    puts: list[dict] = []
    with ThreadedServer(_gateway_without_clock_sync(puts)) as server:
        root = make_project(tmp_path / "p", extra_config=(
            f'[envs.registry.legacy]\nmcp_url = "{server.url}/mcp"\n'
            f'[envs.registry.bare]\nmcp_url = "{server.url}/bare/mcp"\n'
        ))
        sync = {"type": "sync_env_clock", "virtual_time": "2026-11-30T09:00:00Z"}
        with caplog.at_level(logging.INFO, logger="agentenv_dagster"):
            context = run_steps(root, [
                {"id": "legacy", "type": "deploy_env", "env_id": "legacy"},
                {"id": "bare", "type": "deploy_env", "env_id": "bare"},
                {"id": "c1", "env_id": "legacy", **sync},
                {"id": "c2", "env_id": "bare", "virtual_seconds_per_real_second": 0, **sync},
            ])
        with pytest.raises(StepFailed, match=re.escape(
                "step 'c3' (sync_env_clock) failed: legacy does not advertise urn:agentenv:clock/v1")):
            run_steps(root, [{"id": "legacy", "type": "deploy_env", "env_id": "legacy"},
                             {"id": "c3", "env_id": "legacy", "tolerate_missing_sync_time": False, **sync}])
    assert puts == [{"virtual_time": "2026-11-30T09:00:00Z", "virtual_seconds_per_real_second": 1.0},
                    {"virtual_time": "2026-11-30T09:00:00Z", "virtual_seconds_per_real_second": 0.0},
                    {"virtual_time": "2026-11-30T09:00:00Z", "virtual_seconds_per_real_second": 1.0}]
    [legacy, bare] = context.metadata["clock_configurations"]
    assert (legacy["synced"], legacy["skipped"]) == (
        [], [{"service": "legacy", "environment": "legacy", "synced": False, "reason": "not_advertised"}])
    assert bare["skipped"] == [{"service": "bare", "environment": "bare", "synced": False, "reason": "no_env_card"}]
    assert legacy["env_get_time_url"] == "http://gw/clock/time"
    assert ("sync_env_clock env=legacy: clock armed but NO server synced ([('legacy', 'not_advertised')]) — "
            "every tool still answers wall time") in caplog.messages


# -- register_env_triggers -------------------------------------------------------------------------------
@pytest.mark.slow
def test_register_env_triggers_refusals(project):
    with pytest.raises(TaskLoadError, match=re.escape("triggers must be a list of objects")):
        run_steps(project, [EMAIL, {**ON_DANA, "triggers": ["dana"], "depends_on": ["email"]}])

    no_role = {k: v for k, v in ASSISTANT.items() if k != "role"}
    with pytest.raises(StepFailed, match=re.escape(
            "step 'on_dana' (register_env_triggers) failed: Executor agent 'assistant' was deployed without an "
            "explicit role; it would run under the default role and its own tool calls would fire triggers. Deploy "
            "it with a role outside watch_roles.")):
        run_steps(project, [EMAIL, no_role, {**ON_DANA, "depends_on": ["assistant"]}])

    with pytest.raises(StepFailed, match=re.escape(
            "step 'on_dana' (register_env_triggers) failed: Executor agent role 'executor' is in watch_roles "
            "['default', 'executor'] — the executor's own tool calls would fire triggers (cascade).")):
        run_steps(project, [EMAIL, ASSISTANT, {**ON_DANA, "watch_roles": ["default", "executor"],
                                               "depends_on": ["assistant"]}])

    unknown = {**ON_DANA, "executor_agent_name": None, "depends_on": ["email"], "triggers": [
        {"id": "x", "when": {"type": "action", "tool": "teleport"}, "actions": [{"type": "tool", "tool": "send"}]}]}
    with pytest.raises(StepFailed, match=re.escape(
            "step 'on_dana' (register_env_triggers) failed: trigger registration failed (HTTP 400): "
            '{"ok":false,"error":{"code":"invalid_params","message":"trigger \'x\': when.tool names unknown tool '
            '\'teleport\'"}}')):
        run_steps(project, [EMAIL, unknown])


# -- register_agent_triggers ------------------------------------------------------------------------------
def test_an_agent_without_the_triggers_extension_is_refused(tmp_path):
    root = make_project(tmp_path / "p", tasks={})
    context = TaskStepContext.from_dict({"deployed_agents": [
        {"agent_name": "plain", "api_url": "http://127.0.0.1:9", "a2a_card": {"capabilities": {"extensions": []}}}]})
    with pytest.raises(RuntimeError, match=re.escape("Agent 'plain' does not advertise urn:agentenv:triggers/v1")):
        run_direct(root, {**DANA_REACTS, "agent_name": "plain"}, context)


def _reacts(**when) -> dict:
    """Dana's triggers with the first one's env_trigger condition changed."""
    [first, rest] = DANA_REACTS["triggers"]
    condition = {**first["when"]["of"][0], **when}
    return {**DANA_REACTS, "depends_on": ["dana"],
            "triggers": [{**first, "when": {**first["when"], "of": [condition, *first["when"]["of"][1:]]}}, rest]}


@pytest.mark.slow
def test_agent_triggers_register_on_the_embedded_agent_and_must_name_registered_env_triggers(project):
    context = run_steps(project, [EMAIL, CLOCK, ASSISTANT, ON_DANA, DANA, DANA_REACTS])
    assert context.metadata["agent_trigger_registrations"] == [
        {"step_id": "dana_reacts", "agent_name": "dana", "added": ["ask-about-noon", "wrap-up"]}]

    with pytest.raises(StepFailed, match=re.escape(
            "step 'dana_reacts' (register_agent_triggers) failed: trigger 'ask-about-noon' references env_trigger "
            "'dana-email' not registered on env 'email' by a register_env_triggers step (registered there: [])")):
        run_steps(project, [EMAIL, DANA, _reacts()])
    with pytest.raises(StepFailed, match=re.escape(
            "step 'dana_reacts' (register_agent_triggers) failed: trigger 'ask-about-noon' references env_trigger "
            "env_id 'crm' not in context.deployed_envs ['email']")):
        run_steps(project, [EMAIL, DANA, _reacts(env_id="crm")])
    bogus = {"id": "x", "when": {"type": "bogus"}, "actions": [{"type": "end"}]}
    with pytest.raises(StepFailed, match=re.escape(  # the agent's own refusal, word for word
            "step 'dana_reacts' (register_agent_triggers) failed: agent trigger registration failed (HTTP 400): "
            '{"error":"trigger \'x\': unknown when.type \'bogus\' (known: step, env_trigger, conversational, all, any)"}')):
        run_steps(project, [{**DANA, "depends_on": []}, {**DANA_REACTS, "triggers": [bogus], "depends_on": ["dana"]}])
    with pytest.raises(TaskLoadError, match=re.escape("field 'agent_name': no step it depends on deploys agent 'nobody'")):
        run_steps(project, [EMAIL, DANA, {**DANA_REACTS, "agent_name": "nobody", "depends_on": ["dana"]}])


def test_dana_chats_and_her_agent_triggers_answer_once_the_env_trigger_fired(project):
    # a second chat in which no trigger holds: Dana's own (scripted) brain answers instead
    again = {**DANA_CHAT, "id": "dana_again", "prompt_id": "dana_again", "depends_on": ["dana_chat"],
             "prompt": "Will the board deck go out at noon as planned?"}
    context = run_steps(project, [*MONDAY, again])
    assert {v: context.metadata["verifications"][v]["score"] for v in ("answered", "chat_checked")} == {
        "answered": 1.0, "chat_checked": 1.0}

    chat = context.find_prompt_response("dana_chat")
    assert [(t["user_message"], t["response"]) for t in chat.turns] == [
        ("Hi, it's Dana. Did you see my email about the board deck?",
         "Yes, I answered it first thing this morning: the Q3 numbers are final and reconciled against the ledger."),
        ("Great, thanks! And will the board deck go out at noon as planned?",
         "Yes: nothing blocks it, so the board deck goes out at noon as planned."),
    ]
    assert chat.turns[1]["user"] == {"agent_triggers_fired": ["ask-about-noon"]}  # not Dana's brain
    assert (chat.stop_reason, chat.closing_user_message) == (
        "done", {"agent_triggers_fired": ["wrap-up"], "message": "Perfect, that's all I needed. Thanks!"})
    metadata = context.metadata
    assert metadata["env_trigger_snapshots"]["dana_chat"] == [
        {"turn": 1, "envs": {"email": {"dana-email": "fired"}}}, {"turn": 2, "envs": {"email": {"dana-email": "fired"}}}]
    assert metadata["agent_trigger_firings"] == {
        "dana_chat": [{"turn": 1, "fired": ["ask-about-noon"]}, {"turn": 2, "fired": ["wrap-up"]}],
        "dana_again": [{"turn": 1, "fired": []}]}
    log = metadata["agent_trigger_state"]["dana_chat"]
    assert [(e["kind"], e.get("trigger_id"), e.get("turn")) for e in log] == [
        ("registered", None, None), ("fired", "ask-about-noon", 1), ("fired", "wrap-up", 2)]
    assert {e.get("context_id") for e in log[1:]} == {chat.a2a_context_id}

    fallback = context.find_prompt_response("dana_again")
    assert (len(fallback.turns), fallback.stop_reason, fallback.closing_user_message["message"]) == (
        1, "done", "Sorry, I have to jump into a meeting. Let's talk later.")
    assert fallback.closing_user_message["state"] == "completed"  # an A2A task of Dana's brain

    captured = metadata["env_trigger_state"]["email"]
    assert (captured["capture_step_id"], captured["statuses"], captured["capture_is_final"]) == (
        "dana_again", {"dana-email": "fired"}, True)
    assert captured["triggers"]["dana-email"]["fire_count"] == 1
    stored = json.loads(ObjectStore.read(captured["object_url"]))
    assert stored["capture_source"] == "prompt_agent" and stored["clock"]["armed"] is True
    assert [t["id"] for t in stored["state"]["triggers"]] == ["dana-email"]


def test_env_trigger_states_are_read_fail_closed(tmp_path):
    root = make_project(tmp_path / "p", tasks={})
    context = TaskStepContext.from_dict({"deployed_envs": [
        {"env_id": "email", "mcp_url": "http://127.0.0.1:9/mcp"}, {"env_id": "crm", "mcp_url": "http://127.0.0.1:9/mcp"}]})
    assert in_runtime(root, lambda rt: read_env_triggers(context, rt)) == {"email": {}, "crm": {}}  # nothing registered

    context.metadata["env_trigger_registrations"] = [{"step_id": "on_dana", "env_id": "email", "added": ["dana-email"]}]
    with pytest.raises(RuntimeError, match=re.escape("fail-closed: could not read /triggers/state for env 'email': ")):
        in_runtime(root, lambda rt: read_env_triggers(context, rt))
