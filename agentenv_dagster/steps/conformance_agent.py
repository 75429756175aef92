"""Conformance validators for agent authors: the A2A card, the core A2A protocol, MCP
registration and use, and the ``system_prompt`` agent-config field.

Like the env validators (``conformance_env.py``) each records one row per check. What only a
model can show (obeying a system prompt, choosing a tool) is not graded when the agent has no
model (a replay agent), never guessed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx

from ..context import DeployedAgent, TaskStepContext
from ..runtime.a2a_client import CARD_PATHS, TERMINAL_STATES, A2AReply, reply_trajectory
from ..runtime.base import StepRuntime
from .agent_card import AGENT_CONFIG, MCP_CONFIG, TRAJECTORY, extension_request
from .base import AGENT, DEFAULT_AGENT_NAME, ENV
from .conformance_env import (
    ConformanceVerifier,
    advisory,
    check,
    describe,
    find_deployed_env,
    get_json,
    list_mcp_tools,
    not_graded,
)
from .registry import step

A2A_HEADERS = {"A2A-Version": "1.0"}
HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
TASK_NOT_FOUND, METHOD_NOT_FOUND, TASK_NOT_CANCELABLE = -32001, -32601, -32002


class _AgentValidator(ConformanceVerifier):
    reads = {"agent_name": AGENT}

    agent_name: str = DEFAULT_AGENT_NAME

    def deployed_agent(self, ctx: TaskStepContext) -> DeployedAgent:
        agent = ctx.find_agent(self.agent_name)
        if agent is None:
            raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
        return agent

    @staticmethod
    def url(agent: DeployedAgent) -> str:
        return agent.a2a_url or agent.api_url

    def scripted(self, rt: StepRuntime, agent: DeployedAgent) -> str | None:
        """Why this agent cannot be graded on model behaviour (a replay agent), else None."""
        agent_id = (agent.model_extra or {}).get("a2a_agent_id")
        entry = rt.config.agent_entry(agent_id) if agent_id else None
        if entry is not None and entry.kind == "replay":
            return f"agent '{agent.agent_name}' is the replay agent '{agent_id}', which has no model"
        return None


@step("verify_a2a_agent_card")
class VerifyA2AAgentCardStep(_AgentValidator):
    """The agent card: served at both well-known paths, the A2A 1.0 fields, a JSON-RPC 1.0
    interface, text input, well-formed skills and extensions, and extension endpoints that
    answer their read-only operations."""

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        base = self.url(self.deployed_agent(ctx))
        rows, card = [], None
        for check_id, path, why in (("card_served", CARD_PATHS[0], "A2A 1.0"),
                                    ("legacy_card_path", CARD_PATHS[1], "polled by agent-env's deploy")):
            served, problem = await get_json(rt, _join(base, path), self.timeout_seconds)
            rows.append(check(check_id, not problem, problem or f"GET {path} answered a JSON object ({why})"))
            card = card or served
        if card is None:
            self.finish(ctx, rt, rows)
            return
        for field in ("name", "description", "version"):
            value = card.get(field)
            ok = isinstance(value, str) and bool(value.strip())
            rows.append(check(f"field:{field}", ok, f"{field} = {value!r}" if ok else f"'{field}' must be a non-empty string, got {value!r}"))
        rows.append(_interface_row(card))
        capabilities = card.get("capabilities")
        rows.append(check("field:capabilities", isinstance(capabilities, dict),
                          "capabilities is an object" if isinstance(capabilities, dict) else f"'capabilities' must be an object, got {capabilities!r}"))
        rows += _modes_rows(card)
        rows.append(_skills_row(card.get("skills")))
        extensions = (capabilities or {}).get("extensions", []) if isinstance(capabilities, dict) else []
        rows.append(_extensions_row(extensions))
        rows.append(await self._endpoints_row(rt, base, extensions))
        uris = [e.get("uri") for e in extensions if isinstance(e, dict)] if isinstance(extensions, list) else []
        self.finish(ctx, rt, rows, agent_card=card, extensions=uris)

    async def _endpoints_row(self, rt: StepRuntime, base: str, extensions: Any) -> dict[str, Any]:
        """GET every read-only (``GET``) operation an extension advertises: it must answer 2xx JSON."""
        probed, problems = [], []
        for ext in extensions if isinstance(extensions, list) else []:
            params = (ext.get("params") or ext.get("config") or {}) if isinstance(ext, dict) else {}
            for name, spec in (params.get("methods") or {}).items():
                if not isinstance(spec, dict) or spec.get("method") != "GET":
                    continue
                endpoint = spec.get("endpoint") or params.get("endpoint")
                if not isinstance(endpoint, str):
                    problems.append(f"{ext['uri']} {name}: no endpoint")
                    continue
                target = endpoint if endpoint.startswith(("http://", "https://")) else _join(base, endpoint)
                _, problem = await get_json(rt, target, self.timeout_seconds)
                probed.append(f"{ext['uri']} {name}")
                if problem:
                    problems.append(f"{ext['uri']} {name}: {problem}")
        if problems:
            return check("extension_endpoints", False, "; ".join(problems))
        return check("extension_endpoints", True, f"answered: {probed}" if probed else "no read-only extension operations to probe")


def _interface_row(card: dict[str, Any]) -> dict[str, Any]:
    interfaces = card.get("supportedInterfaces")
    if not isinstance(interfaces, list) or not interfaces:
        return check("jsonrpc_interface", False, f"'supportedInterfaces' must be a non-empty list (A2A 1.0), got {interfaces!r}")
    bad = [i for i in interfaces if not isinstance(i, dict) or not str(i.get("url", "")).startswith(("http://", "https://"))
           or not i.get("protocolBinding") or not i.get("protocolVersion")]
    if bad:
        return check("jsonrpc_interface", False, f"interfaces need an http(s) 'url', 'protocolBinding' and 'protocolVersion': {bad!r}"[:500])
    url = rpc_url(card)
    return check("jsonrpc_interface", url is not None, f"JSON-RPC 1.0 at {url}" if url
                 else f"no interface with protocolBinding 'JSONRPC' and protocolVersion 1.x: {interfaces!r}"[:500])


def _modes_rows(card: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for field in ("defaultInputModes", "defaultOutputModes"):
        modes = card.get(field)
        ok = isinstance(modes, list) and bool(modes) and all(isinstance(m, str) and "/" in m for m in modes)
        rows.append(check(f"field:{field}", ok, f"{field} = {modes}" if ok else f"'{field}' must be a non-empty list of media types, got {modes!r}"))
    modes = card.get("defaultInputModes") or []
    ok = isinstance(modes, list) and any(m in ("text/plain", "text/*", "*/*") for m in modes)
    rows.append(check("text_input", ok, "accepts text/plain prompts" if ok else f"defaultInputModes {modes} do not accept text/plain (agent-env sends text prompts)"))
    return rows


def _skills_row(skills: Any) -> dict[str, Any]:
    if not isinstance(skills, list):
        return check("field:skills", False, f"'skills' must be a list, got {skills!r}")
    problems = [f"skills[{i}] needs non-empty 'id', 'name', 'description' and a 'tags' list"
                for i, s in enumerate(skills)
                if not isinstance(s, dict) or not all(isinstance(s.get(k), str) and s[k] for k in ("id", "name", "description"))
                or not isinstance(s.get("tags"), list)]
    return check("field:skills", not problems, "; ".join(problems) if problems else f"{len(skills)} skill(s)")


def _extensions_row(extensions: Any) -> dict[str, Any]:
    if not isinstance(extensions, list):
        return check("extensions", False, f"'capabilities.extensions' must be a list, got {extensions!r}")
    problems = []
    for i, ext in enumerate(extensions):
        if not isinstance(ext, dict) or not isinstance(ext.get("uri"), str) or not ext["uri"]:
            problems.append(f"extensions[{i}] needs a string 'uri'")
            continue
        params = ext.get("params") or ext.get("config") or {}
        if not isinstance(params, dict):
            problems.append(f"{ext['uri']}: 'params' must be an object")
            continue
        if params.get("endpoint") is not None and not isinstance(params["endpoint"], str):
            problems.append(f"{ext['uri']}: 'endpoint' must be a string")
        for name, spec in (params.get("methods") or {}).items():
            if not isinstance(spec, dict) or spec.get("method") not in HTTP_METHODS:
                problems.append(f"{ext['uri']}: operation '{name}' needs 'method' in {sorted(HTTP_METHODS)}")
            elif not isinstance(spec.get("request", {}), dict):
                problems.append(f"{ext['uri']}: operation '{name}' has a 'request' that is not an object")
    uris = [e.get("uri") for e in extensions if isinstance(e, dict)]
    return check("extensions", not problems, "; ".join(problems) if problems else f"extensions: {uris or 'none'}")


def rpc_url(card: dict[str, Any]) -> str | None:
    """The card's JSON-RPC endpoint for A2A 1.x (what this project's client speaks)."""
    for interface in card.get("supportedInterfaces") or []:
        if (isinstance(interface, dict) and interface.get("protocolBinding") == "JSONRPC"
                and str(interface.get("protocolVersion", "")).startswith("1.") and interface.get("url")):
            return interface["url"]
    return None


@step("verify_a2a_core_protocol")
class VerifyA2ACoreProtocolStep(_AgentValidator):
    """A2A 1.0 over JSON-RPC: ``SendMessage`` answers a task that ends in a terminal state
    with a status message and keeps our ``contextId``; ``GetTask`` reads it back; unknown
    tasks and methods, and cancelling a finished task, get the spec's error codes. Any
    terminal state passes: this checks the protocol, not the answer."""

    prompt: str = "Hello from the agentenv conformance check. Please reply briefly."
    timeout_seconds: float = 120

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = self.deployed_agent(ctx)
        card, problem = await get_json(rt, _join(self.url(agent), CARD_PATHS[0]), self.timeout_seconds)
        url = rpc_url(card) if card else None
        rows = [check("jsonrpc_interface", url is not None, f"JSON-RPC 1.0 at {url}" if url else
                      problem or "the card names no JSON-RPC 1.x interface; probing the agent URL")]
        url = url or self.url(agent)
        context_id = uuid.uuid4().hex
        message = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": self.prompt}],
                   "contextId": context_id}
        body, problem = await _rpc(rt, url, "SendMessage", {"message": message}, self.timeout_seconds)
        result = (body or {}).get("result") or {}
        task = result.get("task")
        if problem or "error" in body or not (isinstance(task, dict) and task.get("id") or "message" in result):
            why = problem or f"SendMessage must answer a task (with an id) or a message, got {body!r}"[:500]
            self.finish(ctx, rt, rows + [check("send_message", False, why)])
            return
        if task is None:
            rows.append(check("send_message", True, "answered a message directly (no task to follow)"))
            self.finish(ctx, rt, rows + [advisory("get_task", True, "not applicable: no task")])
            return
        rows.append(check("send_message", True, f"answered task {task['id']} in state {_state(task)}"))
        task, problem = await self._until_terminal(rt, url, task)
        state = _state(task)
        rows.append(check("task_terminal", not problem and state in TERMINAL_STATES,
                          problem or f"task ended in state '{state}'"))
        rows.append(check("context_id", task.get("contextId") == context_id,
                          f"contextId {task.get('contextId')!r}" + ("" if task.get("contextId") == context_id
                                                                    else f" is not the one sent ({context_id!r})")))
        parts = ((task.get("status") or {}).get("message") or {}).get("parts") or []
        texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        rows.append(check("status_message", bool(texts), f"reply text: {texts[-1][:200]!r}" if texts
                          else f"the final status carries no message with a text part: {task.get('status')!r}"[:500]))
        got, problem = await _rpc(rt, url, "GetTask", {"id": task["id"]}, self.timeout_seconds)
        read = (got or {}).get("result") or {}
        ok = not problem and read.get("id") == task["id"] and _state(read) == state
        rows.append(check("get_task", ok, problem or (f"GetTask read back task {task['id']} in state '{state}'" if ok
                          else f"GetTask answered {got!r}"[:500])))
        rows.append(await _error_row(rt, url, "task_not_found", "GetTask", {"id": f"no-such-task-{uuid.uuid4().hex}"},
                                     TASK_NOT_FOUND, self.timeout_seconds))
        rows.append(await _error_row(rt, url, "method_not_found", "agentenv/NoSuchMethod", {},
                                     METHOD_NOT_FOUND, self.timeout_seconds))
        rows.append(await _error_row(rt, url, "cancel_finished_task", "CancelTask", {"id": task["id"]},
                                     TASK_NOT_CANCELABLE, self.timeout_seconds))
        self.finish(ctx, rt, rows)

    async def _until_terminal(self, rt, url, task) -> tuple[dict[str, Any], str | None]:
        deadline = time.monotonic() + self.timeout_seconds
        while _state(task) not in TERMINAL_STATES:
            if time.monotonic() > deadline:
                return task, f"still '{_state(task)}' after {self.timeout_seconds:g}s"
            got, problem = await _rpc(rt, url, "GetTask", {"id": task["id"]}, self.timeout_seconds)
            if problem or "error" in got:
                return task, problem or f"GetTask failed: {got['error']!r}"
            task = got.get("result") or {}
            await asyncio.sleep(0.2)
        return task, None


@step("verify_a2a_agent_mcp")
class VerifyA2AAgentMcpStep(_AgentValidator):
    """MCP through the agent: the mcp-config extension, the env registered with the agent
    (registered here when missing), the registered URL serving tools, and a prompt after
    which the agent's trajectory shows calls of the env's tools (and, when the agent attaches
    the trajectory to its reply, that it is the one served). For a replay agent the prompt
    must be one it has an episode for, else the tool-use check is not graded."""

    reads = {"agent_name": AGENT, "env_id": ENV}

    env_id: str
    env_step_id: str | None = None
    prompt: str | None = None
    timeout_seconds: float = 300

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = self.deployed_agent(ctx)
        env = find_deployed_env(ctx, self.env_id, self.env_step_id)
        base = self.url(agent)
        card = agent.a2a_card or await rt.a2a.get_card(base)
        add = extension_request(card, MCP_CONFIG, "add")
        if add is None:
            self.finish(ctx, rt, [check("mcp_config_advertised", False, f"the card does not advertise {MCP_CONFIG} with an 'add' operation")])
            return
        rows = [check("mcp_config_advertised", "url" in add.required,
                      f"{MCP_CONFIG} add takes {sorted({*add.required, *add.optional})}" if "url" in add.required
                      else f"{MCP_CONFIG} add must require 'url', requires {list(add.required)}")]
        rows.append(await self._registration_row(rt, base, card, env, add))
        try:
            tools = {t.name for t in await list_mcp_tools(env.mcp_url, min(self.timeout_seconds, 60),
                                                          rt.provider.server_auth.headers_for(env.mcp_url))}
            rows.append(check("env_tools_listed", bool(tools), f"{env.mcp_url} serves {sorted(tools)}"))
        except Exception as exc:
            self.finish(ctx, rt, rows + [check("env_tools_listed", False, f"{env.mcp_url}: {describe(exc)}")])
            return
        rows += await self._tool_use_rows(rt, agent, base, card, tools)
        self.finish(ctx, rt, rows)

    async def _registration_row(self, rt, base, card, env, add) -> dict[str, Any]:
        if extension_request(card, MCP_CONFIG, "list") is None:
            return advisory("env_registered", True, "the card offers no 'list' operation; registration not readable")
        try:
            listed = (await rt.a2a.get_extension(base, card, MCP_CONFIG)).get("mcp_servers")
            if not isinstance(listed, list):
                return check("env_registered", False, f"list must answer {{'mcp_servers': [...]}}, got {listed!r}")
            if any(isinstance(s, dict) and s.get("url") == env.mcp_url for s in listed):
                return check("env_registered", True, f"{env.mcp_url} is registered")
            body = {"url": env.mcp_url}
            if "name" in add.optional:
                body["name"] = env.mcp_server_name or env.env_id
            await rt.a2a.post_extension(base, card, MCP_CONFIG, body)
            listed = (await rt.a2a.get_extension(base, card, MCP_CONFIG)).get("mcp_servers") or []
        except Exception as exc:
            return check("env_registered", False, describe(exc))
        ok = any(isinstance(s, dict) and s.get("url") == env.mcp_url for s in listed)
        return check("env_registered", ok, f"registered {env.mcp_url} through add" if ok
                     else f"after add, list still lacks {env.mcp_url}: {listed!r}"[:500])

    async def _tool_use_rows(self, rt, agent, base, card, tools) -> list[dict[str, Any]]:
        prompt = self.prompt or (
            f"Call one tool of the MCP server of the '{self.env_id}' environment ({', '.join(sorted(tools))}) "
            "with harmless arguments and report its raw output.")
        offers_trajectory = extension_request(card, TRAJECTORY, "get") is not None
        try:  # asking for the trajectory on the reply, as prompt_agent does
            reply = await rt.a2a.send_and_wait(base, prompt, timeout_seconds=self.timeout_seconds,
                                               requested_extensions=(TRAJECTORY,) if offers_trajectory else ())
        except Exception as exc:
            return [check("tool_invoked", False, f"the prompt failed: {describe(exc)}")]
        scripted = self.scripted(rt, agent)
        if reply.state != "completed" and scripted and reply.data.get("error_type") == "NoScriptedReply":
            return [not_graded("tool_invoked", f"{scripted} and no episode for the prompt {prompt!r}; "
                               "set `prompt` to one it replays")]
        if reply.state != "completed":
            return [check("tool_invoked", False, f"the task ended '{reply.state}': {reply.text[:300]}")]
        return await self._trajectory_rows(rt, base, card, reply, tools, offers_trajectory)

    async def _trajectory_rows(self, rt, base, card, reply: A2AReply, tools, offers_trajectory: bool,
                               ) -> list[dict[str, Any]]:
        count = reply.data.get("tool_call_count", (reply.data.get("usage") or {}).get("tool_call_count"))
        if not offers_trajectory:
            ok = isinstance(count, int) and count > 0
            return [check("tool_invoked", ok, f"tool_call_count = {count!r} (the card offers no trajectory to see which tools)")]
        try:
            events = await rt.a2a.get_trajectory(base, card, reply.task_id)
        except Exception as exc:
            return [check("tool_invoked", False, f"the trajectory of task {reply.task_id} could not be read: {describe(exc)}")]
        calls = [e for e in events or [] if isinstance(e, dict) and e.get("type") == "tool_call"]
        env_calls = [e for e in calls if _bare(str(e.get("name", ""))) in tools and not e.get("is_error")]
        rows = [check("tool_invoked", bool(env_calls),
                      f"called {[e.get('name') for e in env_calls]}" if env_calls
                      else f"no successful call of the env's tools in the trajectory (calls: {[e.get('name') for e in calls]})")]
        ok = isinstance(count, int) and count == len(calls)
        rows.append(check("tool_call_count_reported", ok, f"tool_call_count = {count!r}"
                          + ("" if ok else f", the trajectory shows {len(calls)} tool call(s)")))
        return rows + trajectory_on_reply_rows(reply, events)


def trajectory_on_reply_rows(reply: A2AReply, served: Any) -> list[dict[str, Any]]:
    """An agent that attaches the trajectory to its reply (asked with ``A2A-Extensions``) must
    attach the one its trajectory endpoint serves: prompt_agent then stores that one instead of
    asking. Attaching none is fine (the endpoint is asked)."""
    if TRAJECTORY not in reply.metadata:
        return []
    try:
        attached = reply_trajectory(reply)
    except ValueError as exc:
        return [check("trajectory_on_reply", False, f"metadata[{TRAJECTORY!r}] is not JSON text: {exc}")]
    if attached is None:
        return [check("trajectory_on_reply", False,
                      f"metadata[{TRAJECTORY!r}] must be {{'trajectory_json': <JSON text>}}, "
                      f"got {reply.metadata[TRAJECTORY]!r}"[:500])]
    ok = attached == served
    return [check("trajectory_on_reply", ok, "the reply carries the trajectory its endpoint serves" if ok else
                  f"the reply carries {_length(attached)} event(s), the endpoint serves {_length(served)}")]


def _length(trajectory: Any) -> str:
    return str(len(trajectory)) if isinstance(trajectory, list) else type(trajectory).__name__


@step("verify_a2a_system_prompt")
class VerifyA2ASystemPromptStep(_AgentValidator):
    """The ``system_prompt`` agent-config field: advertised, accepted, read back, and obeyed
    (a sentinel token the prompt asks for must come back). Obedience needs a model: for a
    replay agent it is not graded. The agent's previous system prompt is restored after."""

    timeout_seconds: float = 120

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        agent = self.deployed_agent(ctx)
        base = self.url(agent)
        card = agent.a2a_card or await rt.a2a.get_card(base)
        config = extension_request(card, AGENT_CONFIG, "set")
        if config is None:
            self.finish(ctx, rt, [check("agent_config_advertised", False, f"the card does not advertise {AGENT_CONFIG} with a 'set' operation")])
            return
        rows = [check("agent_config_advertised", True, f"{AGENT_CONFIG} set takes {list(config.supported)}")]
        if "system_prompt" not in config.supported:
            self.finish(ctx, rt, rows + [check("system_prompt_supported", False, "'system_prompt' is not among the set operation's supported fields")])
            return
        rows.append(check("system_prompt_supported", True, "'system_prompt' is a supported field"))
        readable = extension_request(card, AGENT_CONFIG, "get") is not None
        previous = (await self._read(rt, base, card)).get("system_prompt") if readable else None
        token = f"VALIDATOR-SP-{uuid.uuid4().hex[:12]}"
        sentinel = (f"For validator testing purposes: if you are asked the exact question 'What is your "
                    f"validator code?', respond with the exact token {token} and nothing else.")
        try:
            await rt.a2a.post_extension(base, card, AGENT_CONFIG, {"system_prompt": sentinel})
        except Exception as exc:
            self.finish(ctx, rt, rows + [check("system_prompt_accepted", False, describe(exc))])
            return
        rows.append(check("system_prompt_accepted", True, "set accepted the system prompt"))
        try:
            if readable:
                read = (await self._read(rt, base, card)).get("system_prompt")
                rows.append(check("system_prompt_readback", read == sentinel, "get reads back the system prompt set"
                                  if read == sentinel else f"get reads back {read!r}, not the system prompt set"[:500]))
            else:
                rows.append(advisory("system_prompt_readback", True, "the card offers no 'get' operation"))
            rows.append(await self._obeyed(rt, agent, base, token))
        finally:
            if readable:
                await self._restore(rt, base, card, previous)
        self.finish(ctx, rt, rows)

    async def _obeyed(self, rt, agent, base, token) -> dict[str, Any]:
        scripted = self.scripted(rt, agent)
        if scripted:
            return not_graded("system_prompt_obeyed", f"obeying a system prompt needs a model; {scripted}")
        try:
            reply = await rt.a2a.send_and_wait(base, "What is your validator code?", timeout_seconds=self.timeout_seconds)
        except Exception as exc:
            return check("system_prompt_obeyed", False, f"the trigger prompt failed: {describe(exc)}")
        ok = reply.state == "completed" and token in reply.text
        return check("system_prompt_obeyed", ok, "the reply carries the token the system prompt asked for" if ok
                     else f"task '{reply.state}', reply {reply.text[:300]!r} lacks the token {token}")

    async def _read(self, rt, base, card) -> dict[str, Any]:
        try:
            return (await rt.a2a.get_extension(base, card, AGENT_CONFIG)).get("config") or {}
        except Exception as exc:
            rt.log.warning("agent-config get failed: %s", describe(exc))
            return {}

    async def _restore(self, rt, base, card, previous) -> None:
        try:
            await rt.a2a.post_extension(base, card, AGENT_CONFIG, {"system_prompt": previous})
        except Exception as exc:
            rt.log.warning("agent '%s': the previous system prompt was not restored: %s", self.agent_name, describe(exc))


# -- helpers -----------------------------------------------------------------------------------
async def _rpc(rt: StepRuntime, url: str, method: str, params: dict[str, Any], timeout: float
               ) -> tuple[dict[str, Any] | None, str | None]:
    """One raw JSON-RPC call: (the response object, None) or (None, what is wrong with it)."""
    rid = uuid.uuid4().hex[:8]
    try:
        response = await rt.http.post(url, json={"jsonrpc": "2.0", "id": rid, "method": method, "params": params},
                                      headers=A2A_HEADERS, timeout=timeout)
    except httpx.HTTPError as exc:
        return None, f"{method}: {describe(exc)}"
    try:
        body = response.json()
    except ValueError:
        return None, f"{method} -> HTTP {response.status_code}, not JSON: {response.text[:300]!r}"
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or ("result" in body) == ("error" in body):
        return None, f"{method} -> HTTP {response.status_code}, not a JSON-RPC 2.0 response: {body!r}"[:500]
    if body.get("id") != rid:
        return None, f"{method}: response id {body.get('id')!r} does not echo the request id {rid!r}"
    return body, None


async def _error_row(rt, url, check_id, method, params, code, timeout) -> dict[str, Any]:
    body, problem = await _rpc(rt, url, method, params, timeout)
    if problem:
        return check(check_id, False, problem)
    error = body.get("error")
    if not isinstance(error, dict):
        return check(check_id, False, f"{method} succeeded; expected error {code}")
    got = error.get("code")
    return check(check_id, got == code, f"{method} got error code {got} ({error.get('message')!r})"
                 + ("" if got == code else f", expected {code}"))


def _state(task: dict[str, Any]) -> str:
    """``TASK_STATE_COMPLETED`` → ``completed`` (the client's spelling of states)."""
    state = (task.get("status") or {}).get("state") or ""
    return state.removeprefix("TASK_STATE_").lower().replace("-", "_")


def _bare(name: str) -> str:
    """``mcp__<alias>__<tool>`` → ``<tool>``."""
    return name.rsplit("__", 1)[-1] if name.startswith("mcp__") else name


def _join(base: str, path: str) -> str:
    return base.rstrip("/") + "/" + path.lstrip("/")
