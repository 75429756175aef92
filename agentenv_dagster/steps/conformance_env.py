"""Conformance validators for env authors: the env card, the data plane, the MCP tool schemas.

Each validator probes a deployed env over the wire and records one verification row per
check (``score`` 1/0, ``result``, a ``justification`` that names what was wrong), so an env
author reads exactly which part of the contract their server misses. The shared
``ConformanceVerifier`` base also serves the agent validators in ``conformance_agent.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import httpx
from jsonschema import SchemaError
from jsonschema.validators import validator_for

from ..context import DeployedEnv, TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.dataplane import CARD_PATH, MCP_PATH, RPC_PATH, env_base_url
from .base import ENV
from .registry import step
from .verifiers import _Verifier

CORE_OPERATIONS = ("data/reset", "data/add", "data/get")
PART_KINDS = ("data", "file", "text")
# MCP tool names: what agents can expose as ``mcp__<alias>__<tool>`` and models accept.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


# -- rows --------------------------------------------------------------------------------------
def check(check_id: str, passed: bool, justification: str, **extra: Any) -> dict[str, Any]:
    """One graded check."""
    return {"id": check_id, "score": 1.0 if passed else 0.0, "result": passed,
            "justification": justification, **extra}


def advisory(check_id: str, passed: bool, justification: str) -> dict[str, Any]:
    """A finding worth reading that does not count toward the score (``skipped``)."""
    return {**check(check_id, passed, justification), "skipped": True, "advisory": True}


def not_graded(check_id: str, reason: str) -> dict[str, Any]:
    """A check that cannot be decided here (e.g. it needs a model): never a guessed verdict."""
    return {"id": check_id, "score": None, "result": None, "graded": False, "skipped": True,
            "justification": f"not graded: {reason}"}


class ConformanceVerifier(_Verifier):
    """A validator whose rows are checks; some may be not graded (see ``finish``)."""

    timeout_seconds: float = 60

    def finish(self, ctx: TaskStepContext, rt: StepRuntime, rows: list[dict[str, Any]], **extra: Any) -> None:
        """Record the rows. A not-graded check leaves the verification not graded unless the
        graded rows already decide it (``all_pass`` with a failure, ``any_pass`` with a pass)."""
        self.record(ctx, rows, **extra)
        graded = [r for r in rows if not r.get("skipped")]
        ungraded = [r for r in rows if r.get("graded") is False]
        decided = (
            (self.score_aggregator == "all_pass" and any(r["result"] is False for r in graded))
            or (self.score_aggregator == "any_pass" and any(r["result"] is True for r in graded))
        )
        if ungraded and not decided:
            reason = "; ".join(f"{r['id']}: {r['justification'].removeprefix('not graded: ')}" for r in ungraded)
            ctx.metadata_map("verifications")[self.verifier_key].update(score=None, graded=False, reason=reason)
        failed = [f"{r['id']} ({r['justification']})" for r in graded if r["result"] is not True]
        if failed:
            rt.log.warning("%s '%s': %d of %d checks failed: %s", self.type, self.verifier_key,
                           len(failed), len(graded), "; ".join(failed))
        else:
            rt.log.info("%s '%s': %d checks passed%s", self.type, self.verifier_key, len(graded),
                        f", {len(ungraded)} not graded" if ungraded else "")


class _EnvValidator(ConformanceVerifier):
    reads = {"env_id": ENV}

    env_id: str
    env_step_id: str | None = None

    def deployed_env(self, ctx: TaskStepContext) -> DeployedEnv:
        return find_deployed_env(ctx, self.env_id, self.env_step_id)


def find_deployed_env(ctx: TaskStepContext, env_id: str, env_step_id: str | None) -> DeployedEnv:
    """The deployment of ``env_id`` (the one ``env_step_id`` made, when given)."""
    envs = [e for e in ctx.deployed_envs if e.env_id == env_id]
    if env_step_id is not None:
        envs = [e for e in envs if e.metadata.get("deploy_step_id") == env_step_id]
    if not envs or not envs[0].mcp_url:
        raise RuntimeError(f"Env '{env_id}' not found in context.deployed_envs")
    return envs[0]


@step("verify_env_card")
class VerifyEnvCardStep(_EnvValidator):
    """The env card at ``/.well-known/agent-env.json``: its fields, the MCP endpoint it names
    (must be the deployed ``mcp_url``) and the tools it claims (must be what MCP lists)."""

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        env = self.deployed_env(ctx)
        base = env_base_url(env.mcp_url)
        card, problem = await get_json(rt, base + CARD_PATH, self.timeout_seconds)
        if problem:
            self.finish(ctx, rt, [check("card_served", False, problem)])
            return
        rows = [check("card_served", True, f"GET {base}{CARD_PATH} answered a JSON object")]
        rows += _card_field_rows(card)
        rows.append(_mcp_interface_row(card, base, env.mcp_url))
        try:
            tools = [t.name for t in await list_mcp_tools(
                env.mcp_url, self.timeout_seconds, rt.provider.server_auth.headers_for(env.mcp_url))]
        except Exception as exc:
            rows.append(check("tools_match_mcp", False, f"MCP at {env.mcp_url} could not be listed: {describe(exc)}"))
        else:
            rows.append(_tools_row(card, tools))
        self.finish(ctx, rt, rows, environment_card=card)


def _card_field_rows(card: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for field in ("name", "url"):
        value = card.get(field)
        ok = isinstance(value, str) and bool(value.strip())
        rows.append(check(f"field:{field}", ok, f"{field} = {value!r}" if ok else f"'{field}' must be a non-empty string, got {value!r}"))
    version = card.get("protocolVersion")
    rows.append(check("field:protocolVersion", version == "1.0",
                      f"protocolVersion = {version!r}" + ("" if version == "1.0" else ", expected '1.0'")))
    capabilities = card.get("capabilities")
    if not isinstance(capabilities, dict):
        rows.append(check("field:capabilities", False, f"'capabilities' must be an object, got {capabilities!r}"))
        return rows
    rows.append(check("field:capabilities", True, "capabilities is an object"))
    tools = capabilities.get("tools")
    ok = isinstance(tools, list) and all(_tool_name(t) for t in tools)
    rows.append(check("capabilities.tools", ok, f"{len(tools)} tool(s) listed" if ok
                      else f"'capabilities.tools' must list tool names (or objects with 'name'), got {tools!r}"))
    operations = capabilities.get("operations")
    if not isinstance(operations, list):
        rows.append(check("capabilities.operations", False, f"'capabilities.operations' must be a list, got {operations!r}"))
    else:
        missing = [op for op in CORE_OPERATIONS if op not in operations]
        rows.append(check("capabilities.operations", not missing, f"operations {operations}"
                          + (f" lack the core data plane {missing}" if missing else "")))
    rows.append(_extensions_row(capabilities.get("extensions", [])))
    children = card.get("children_environments", [])
    ok = isinstance(children, list) and all(isinstance(c, dict) and c.get("name") for c in children)
    rows.append(check("children_environments", ok, f"{len(children)} child environment(s)" if ok
                      else f"'children_environments' must be a list of objects with a 'name', got {children!r}"))
    return rows


def _extensions_row(extensions: Any) -> dict[str, Any]:
    if not isinstance(extensions, list):
        return check("capabilities.extensions", False, f"'capabilities.extensions' must be a list, got {extensions!r}")
    problems = []
    for i, ext in enumerate(extensions):
        if not isinstance(ext, dict) or not isinstance(ext.get("uri"), str) or not ext["uri"]:
            problems.append(f"extensions[{i}] needs a string 'uri'")
            continue
        methods = (ext.get("params") or {}).get("methods") or {}
        for name, spec in methods.items() if isinstance(methods, dict) else []:
            if not isinstance(spec, dict) or not isinstance(spec.get("method"), str):
                problems.append(f"{ext['uri']}: method '{name}' needs an HTTP 'method'")
    uris = [e.get("uri") for e in extensions if isinstance(e, dict)]
    return check("capabilities.extensions", not problems,
                 "; ".join(problems) if problems else f"extensions: {uris or 'none'}")


def _mcp_interface_row(card: dict[str, Any], base: str, mcp_url: str) -> dict[str, Any]:
    """agent-env computes the MCP URL from the card: env URL + '/' + the mcp interface path."""
    interfaces = card.get("additionalInterfaces") or []
    named = [i.get("url") for i in interfaces if isinstance(i, dict) and i.get("transport") == "mcp"]
    path = named[0] if named and isinstance(named[0], str) else MCP_PATH
    expected = path if path.startswith(("http://", "https://")) else base.rstrip("/") + "/" + path.lstrip("/")
    ok = expected.rstrip("/") == mcp_url.rstrip("/")
    source = "the card's mcp interface" if named else f"the default path {MCP_PATH} (the card names no mcp interface)"
    return check("mcp_interface", ok, f"{source} gives {expected}" + ("" if ok else f", but the env serves MCP at {mcp_url}"))


def _tools_row(card: dict[str, Any], mcp_tools: list[str]) -> dict[str, Any]:
    listed = (card.get("capabilities") or {}).get("tools") if isinstance(card.get("capabilities"), dict) else None
    if not isinstance(listed, list):
        return check("tools_match_mcp", False, f"the card lists no tools; MCP serves {sorted(mcp_tools)}")
    claimed = {_tool_name(t) for t in listed}
    missing, extra = sorted(claimed - set(mcp_tools)), sorted(set(mcp_tools) - claimed)
    ok = not missing and not extra
    why = f"card and MCP agree on {sorted(claimed)}" if ok else (
        f"card lists tools MCP does not serve: {missing}; " if missing else "") + (
        f"MCP serves tools the card omits: {extra}" if extra else "")
    return check("tools_match_mcp", ok, why.rstrip("; "))


def _tool_name(entry: Any) -> str | None:
    if isinstance(entry, str) and entry:
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("name"), str) and entry["name"]:
        return entry["name"]
    return None


@step("verify_env_core_protocol")
class VerifyEnvCoreProtocolStep(_EnvValidator):
    """The JSON-RPC data plane at ``<env>/agentenv``: ``data/get``, ``data/add`` and
    ``data/reset`` and upstream's error envelopes (always HTTP 200).

    Without ``seed_parts`` the probes change nothing (``data/add`` with no parts, ``data/reset``
    judged from the card). With ``seed_parts`` it runs the round trip reset → add → reset and
    checks that the state changed and came back; the env is left reset.
    """

    seed_parts: list[dict[str, Any]] | None = None

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        env = self.deployed_env(ctx)
        rpc = _DataPlaneProbe(rt, env_base_url(env.mcp_url) + RPC_PATH, self.timeout_seconds)
        rows = [await _get_row(rpc)]
        if self.seed_parts:
            rows += await _round_trip_rows(rpc, self.seed_parts)
        else:
            rows.append(await _add_probe_row(rpc))
            card, _ = await get_json(rt, env_base_url(env.mcp_url) + CARD_PATH, self.timeout_seconds)
            rows.append(_reset_advertised_row(card))
        method = f"agentenv/no-such-method-{uuid.uuid4().hex[:6]}"
        rows.append(await rpc.error_row("error:method_not_found", {"method": method, "params": {}}, -32601))
        rows.append(await rpc.error_row("error:parse", b"{not json", -32700))
        rows.append(await rpc.error_row("error:invalid_request", {"params": {}}, -32600))
        self.finish(ctx, rt, rows)


class _DataPlaneProbe:
    """Raw JSON-RPC calls, so the envelope itself (HTTP 200, ``jsonrpc``, echoed id) is checked."""

    def __init__(self, rt: StepRuntime, url: str, timeout: float):
        self.rt, self.url, self.timeout = rt, url, timeout

    async def call(self, request: dict[str, Any] | bytes) -> tuple[dict[str, Any] | None, str | None]:
        """(the JSON-RPC response, None) or (None, what is wrong with the answer)."""
        rid = None
        if isinstance(request, dict):
            rid = uuid.uuid4().hex[:8]
            request = json.dumps({"jsonrpc": "2.0", "id": rid, **request}).encode()
        try:
            response = await self.rt.http.post(self.url, content=request, timeout=self.timeout,
                                               headers={"Content-Type": "application/json"})
        except httpx.HTTPError as exc:
            return None, f"POST {self.url}: {describe(exc)}"
        if response.status_code != 200:
            return None, f"POST {self.url} -> HTTP {response.status_code} (JSON-RPC answers use HTTP 200): {response.text[:300]}"
        try:
            body = response.json()
        except ValueError:
            return None, f"POST {self.url} did not answer JSON: {response.text[:300]!r}"
        if not isinstance(body, dict) or body.get("jsonrpc") != "2.0" or ("result" in body) == ("error" in body):
            return None, f"not a JSON-RPC 2.0 response (needs jsonrpc '2.0' and one of result/error): {body!r}"[:500]
        if rid is not None and body.get("id") != rid:
            return None, f"response id {body.get('id')!r} does not echo the request id {rid!r}"
        return body, None

    async def result(self, method: str, params: dict[str, Any]) -> tuple[Any, str | None]:
        body, problem = await self.call({"method": method, "params": params})
        if problem:
            return None, problem
        if "error" in body:
            return None, f"{method} answered error {body['error']!r}"[:500]
        return body["result"], None

    async def error_row(self, check_id: str, request: dict[str, Any] | bytes, code: int) -> dict[str, Any]:
        body, problem = await self.call(request)
        if problem:
            return check(check_id, False, problem)
        error = body.get("error")
        got = error.get("code") if isinstance(error, dict) else None
        what = "an unknown method" if code == -32601 else "a body that is not JSON" if code == -32700 else "a request without 'method'"
        return check(check_id, got == code, f"{what} got error code {got} ({(error or {}).get('message')!r})"
                     + ("" if got == code else f", expected {code}"))


def _parts_problem(result: Any) -> str | None:
    parts = result.get("parts") if isinstance(result, dict) else None
    if not isinstance(parts, list):
        return f"data/get must answer {{'parts': [...]}}, got {result!r}"[:300]
    for i, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("kind") not in PART_KINDS:
            return f"data/get parts[{i}] is not a Part (kind must be one of {PART_KINDS}): {part!r}"[:300]
    return None


async def _get_row(rpc: _DataPlaneProbe) -> dict[str, Any]:
    result, problem = await rpc.result("data/get", {})
    problem = problem or _parts_problem(result)
    return check("data/get", not problem, problem or f"answered {len(result['parts'])} Part(s)")


async def _add_probe_row(rpc: _DataPlaneProbe) -> dict[str, Any]:
    """``data/add`` with no parts changes nothing; any answer but -32601 shows it is served."""
    body, problem = await rpc.call({"method": "data/add", "params": {"parts": []}})
    if problem:
        return check("data/add", False, problem)
    code = (body.get("error") or {}).get("code") if isinstance(body.get("error"), dict) else None
    if code == -32601:
        return check("data/add", False, "data/add is not served (-32601 method not found)")
    return check("data/add", True, "served (probed with no parts: "
                 + (f"error {code}" if "error" in body else "accepted") + ")")


def _reset_advertised_row(card: dict[str, Any] | None) -> dict[str, Any]:
    operations = ((card or {}).get("capabilities") or {}).get("operations") if isinstance(card, dict) else None
    if not isinstance(operations, list):
        return check("data/reset", False, "not called (it clears the env) and the card advertises no operations; "
                     "set seed_parts to exercise it")
    ok = "data/reset" in operations
    return check("data/reset", ok, "advertised by the card (not called: it clears the env; set seed_parts to exercise it)"
                 if ok else f"the card's operations {operations} lack data/reset")


async def _round_trip_rows(rpc: _DataPlaneProbe, seed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    _, problem = await rpc.result("data/reset", {})
    if problem:
        return [check("data/reset", False, problem)]
    rows = [check("data/reset", True, "accepted")]
    empty, problem = await rpc.result("data/get", {})
    loaded = None
    if not problem:
        _, problem = await rpc.result("data/add", {"parts": seed})
        if problem:
            return rows + [check("data/add", False, f"seed_parts were refused: {problem}")]
        loaded, problem = await rpc.result("data/get", {})
    if problem:
        return rows + [check("data/add", False, problem)]
    changed = loaded != empty
    rows.append(check("data/add", changed, f"{len(seed)} seed Part(s) loaded; data/get shows the change" if changed
                      else "data/add accepted the seed Parts but data/get answers the same state as after data/reset"))
    _, problem = await rpc.result("data/reset", {})
    after, problem = (None, problem) if problem else await rpc.result("data/get", {})
    ok = not problem and after == empty
    rows.append(check("reset_clears", ok, problem or ("data/reset cleared what data/add loaded" if ok else
                      f"after data/reset, data/get still differs from the reset state: {json.dumps(after)[:300]}")))
    return rows


@step("verify_mcp_tool_schema")
class VerifyMcpToolSchemaStep(_EnvValidator):
    """The env's MCP tools: reachable, uniquely and validly named, described, with valid JSON
    Schemas. Parameter-quality findings (a type and a description per parameter …) are
    advisory unless ``strict``."""

    expected_tools: list[str] = []
    strict: bool = False

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        env = self.deployed_env(ctx)
        try:
            tools = await list_mcp_tools(env.mcp_url, self.timeout_seconds, rt.provider.server_auth.headers_for(env.mcp_url))
        except Exception as exc:
            self.finish(ctx, rt, [check("mcp_reachable", False, f"MCP at {env.mcp_url} could not be listed: {describe(exc)}")])
            return
        names = [t.name for t in tools]
        rows = [check("mcp_reachable", True, f"tools/list at {env.mcp_url} answered {len(tools)} tool(s)"),
                check("has_tools", bool(tools), f"tools: {names}" if tools else "the server lists no tools")]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        rows.append(check("unique_names", not duplicates, f"duplicate tool names: {duplicates}" if duplicates else "all names unique"))
        missing = [t for t in self.expected_tools if t not in names]
        if self.expected_tools:
            rows.append(check("expected_tools", not missing, f"missing: {missing}" if missing else f"all of {self.expected_tools} served"))
        for tool in tools:
            rows.append(_tool_row(tool))
            issues = parameter_issues(tool.input_schema or {})
            row = (check if self.strict else advisory)(
                f"parameters:{tool.name}", not issues, "; ".join(issues) if issues else "every parameter typed and described")
            rows.append(row)
        self.finish(ctx, rt, rows, tools=[{"name": t.name, "description": t.description or "",
                                           "input_schema": t.input_schema} for t in tools])


def _tool_row(tool: Any) -> dict[str, Any]:
    problems = []
    if not TOOL_NAME.match(tool.name or ""):
        problems.append(f"name {tool.name!r} must match {TOOL_NAME.pattern}")
    if not (tool.description or "").strip():
        problems.append("no description")
    problems += schema_problems("inputSchema", tool.input_schema, require_object=True)
    if tool.output_schema is not None:
        problems += schema_problems("outputSchema", tool.output_schema, require_object=True)
    return check(f"tool:{tool.name}", not problems, "; ".join(problems) if problems else "valid name, description and schemas")


def schema_problems(label: str, schema: Any, *, require_object: bool) -> list[str]:
    if not isinstance(schema, dict):
        return [f"{label} must be a JSON Schema object, got {schema!r}"]
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        return [f"{label} is not a valid JSON Schema: {exc.message}"]
    problems = []
    if require_object and schema.get("type") != "object":
        problems.append(f"{label} must have type 'object', got {schema.get('type')!r}")
    properties = schema.get("properties") or {}
    unknown = [r for r in schema.get("required") or [] if r not in properties]
    if unknown:
        problems.append(f"{label} requires undeclared properties {unknown}")
    return problems


def parameter_issues(schema: dict[str, Any]) -> list[str]:
    """Upstream's parameter-quality findings (``verify_mcp_tool_schema``)."""
    issues = []
    if "required" in schema and not schema["required"]:
        issues.append("empty 'required' array")
    for name, param in (schema.get("properties") or {}).items():
        if not isinstance(param, dict) or not param:
            issues.append(f"parameter '{name}' has an empty or invalid schema")
            continue
        param = _resolve_ref(param, schema)
        variants = [_resolve_ref(v, schema) for v in param.get("anyOf") or [] if isinstance(v, dict)]
        if "type" not in param and not any("type" in v for v in variants):
            issues.append(f"parameter '{name}' has no type")
        if "description" not in param:
            issues.append(f"parameter '{name}' has no description")
        if param.get("type") == "array" and "items" not in param:
            issues.append(f"parameter '{name}' is an array without 'items'")
        if param.get("type") == "object" and "properties" not in param:
            issues.append(f"parameter '{name}' is an object without 'properties'")
        if "enum" in param and not param["enum"]:
            issues.append(f"parameter '{name}' has an empty enum")
    return issues


def _resolve_ref(param: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = param.get("$ref", "")
    if not ref.startswith("#/$defs/"):
        return param
    target = (schema.get("$defs") or {}).get(ref.removeprefix("#/$defs/"))
    return {**target, **{k: v for k, v in param.items() if k != "$ref"}} if isinstance(target, dict) else param


# -- wire helpers shared with the agent validators ---------------------------------------------
async def list_mcp_tools(url: str, timeout: float, headers: dict[str, str] | None = None) -> list[Any]:
    """Every tool the MCP server at ``url`` lists (all pages), through the ``mcp`` client,
    sending ``headers`` (the run's token, to a server of the run's own)."""
    import httpx2  # on first use, as the embedded agents do
    import mcp
    from mcp.client.streamable_http import streamable_http_client

    tools: list[Any] = []
    async with (asyncio.timeout(timeout), httpx2.AsyncClient(headers=headers or {}, timeout=timeout) as http,
                mcp.Client(streamable_http_client(url, http_client=http)) as client):
        cursor = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            if not (cursor := page.next_cursor):
                return tools


async def get_json(rt: StepRuntime, url: str, timeout: float) -> tuple[Any, str | None]:
    """(the JSON object at ``url``, None) or (None, why it is not usable)."""
    try:
        response = await rt.http.get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        return None, f"GET {url}: {describe(exc)}"
    if response.status_code != 200:
        return None, f"GET {url} -> HTTP {response.status_code}: {response.text[:300]}"
    try:
        body = response.json()
    except ValueError:
        return None, f"GET {url} did not answer JSON: {response.text[:300]!r}"
    if not isinstance(body, dict):
        return None, f"GET {url} answered {type(body).__name__}, not a JSON object"
    return body, None


def describe(exc: BaseException) -> str:
    """The first real cause inside (nested) exception groups, as ``Type: message``."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
