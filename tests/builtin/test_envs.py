"""The built-in envs, served for real: card, MCP tools, data plane and its error envelopes, TTL."""

from __future__ import annotations

import base64
import json
import os
import re
import time
from pathlib import Path

import httpx
import mcp
import pytest

from agentenv_dagster.builtin.envs.base import EnvApp
from agentenv_dagster.runtime.dataplane import DataPlaneClient, DataPlaneError, file_part_from_bytes
from agentenv_dagster.runtime.processes import ServerStartError, is_running, spawn_server, terminate

ENV_MODULE = "agentenv_dagster.builtin.envs"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The server runs in its own working directory, so it finds the package through PYTHONPATH.
SERVER_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def email(email_id: str, sender: str, subject: str, body: str) -> dict:
    return {"id": email_id, "from": sender, "to": "me@example.com", "subject": subject, "body": body,
            "date": "2025-01-02T09:00:00Z"}


REPORT = email("e1", "alice@example.com", "Quarterly report", "The numbers are in.")
LUNCH = email("e2", "bob@example.com", "Lunch?", "Tacos at noon")
INVOICE = email("e3", "billing@vendor.test", "Invoice 42", "Please pay the REPORTED amount")


@pytest.fixture(scope="module")
def env_files(tmp_path_factory) -> Path:
    """The folder the envs' data plane may read file:// Parts in (a run's artifact folders)."""
    return tmp_path_factory.mktemp("env-files")


@pytest.fixture(scope="module")
def spawn(tmp_path_factory, env_files):
    """Start env servers for real; every one is ended (and checked gone) after the tests."""
    started: list[int] = []

    def start(*args: str, ttl_seconds: float = 60):
        workdir = tmp_path_factory.mktemp("env")
        server = spawn_server(ENV_MODULE, [*args, "--file-root", str(env_files)], workdir=workdir, ttl_seconds=ttl_seconds,
                              env=SERVER_ENV)
        started.append(server.pid)
        return server

    yield start
    for pid in started:
        terminate(pid)
    assert not [pid for pid in started if is_running(pid)]


@pytest.fixture(scope="module")
def email_env(spawn):
    return spawn("email").authed_url  # the run's token in the URL: every request carries it


@pytest.fixture(scope="module")
def item_env(spawn):
    return spawn("item-store").authed_url


@pytest.fixture
async def plane():
    async with httpx.AsyncClient(timeout=10) as http:
        yield DataPlaneClient(http)


async def call(base_url: str, tool: str, args: dict | None = None):
    async with mcp.Client(f"{base_url}/mcp") as client:
        return await client.call_tool(tool, args or {})


def rpc(base_url: str, body) -> dict:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{base_url}/agentenv", content=content, timeout=10)
    assert response.status_code == 200  # errors travel in the envelope, never as HTTP errors
    return response.json()


@pytest.mark.parametrize(
    ("kind", "tools"),
    [("email", ["email_search", "read_email", "send"]), ("item-store", ["add_item", "list_items"])],
)
@pytest.mark.anyio
async def test_card_and_mcp_tools(kind, tools, email_env, item_env):
    base_url = {"email": email_env, "item-store": item_env}[kind]
    card = httpx.get(f"{base_url}/.well-known/agent-env.json", timeout=10).json()
    extensions = card["capabilities"].pop("extensions")
    assert card == {
        "name": kind,
        "protocolVersion": "1.0",
        "url": "/agentenv",
        "capabilities": {"tools": tools, "operations": ["data/reset", "data/add", "data/get"]},
        "children_environments": [],
        "additionalInterfaces": [{"transport": "mcp", "url": "/mcp"}],
    }
    # the virtual clock and the triggers, each with the endpoints of its operations
    assert [e["uri"] for e in extensions] == ["urn:agentenv:clock/v1", "urn:agentenv:triggers/v1"]
    assert extensions[0]["params"]["methods"]["set_time"] == {
        "method": "PUT", "endpoint": "/clock/set-time",
        "request": {"required": ["virtual_time"], "optional": ["virtual_seconds_per_real_second"]}}
    async with mcp.Client(f"{base_url}/mcp") as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == tools


@pytest.mark.anyio
async def test_email_loads_every_part_kind_then_search_and_read(email_env, plane, env_files):
    seed_file = env_files / "lunch.json"
    seed_file.write_text(json.dumps({"emails": [LUNCH]}))
    await plane.reset(email_env)
    await plane.add(email_env, [file_part_from_bytes("inbox.json", json.dumps({"emails": [REPORT]}).encode())])
    await plane.add(email_env, [
        {"kind": "file", "file": {"uri": seed_file.as_uri(), "name": "lunch.json"}},
        {"kind": "data", "data": {"emails": [INVOICE]}},
    ])

    found = await call(email_env, "email_search", {"query": "REPORT"})
    assert not found.is_error
    assert found.structured_content == {"emails": [REPORT, INVOICE]}
    assert json.loads(found.content[0].text) == found.structured_content
    assert (await call(email_env, "email_search", {"sender": "BOB@"})).structured_content == {"emails": [LUNCH]}
    assert (await call(email_env, "email_search", {"query": "report", "sender": "alice"})).structured_content == {
        "emails": [REPORT]
    }
    assert (await call(email_env, "email_search")).structured_content == {"emails": [REPORT, LUNCH, INVOICE]}
    assert (await call(email_env, "read_email", {"email_id": "e2"})).structured_content == LUNCH

    missing = await call(email_env, "read_email", {"email_id": "nope"})
    assert missing.is_error
    assert "no email with id 'nope'" in missing.content[0].text


@pytest.mark.anyio
async def test_send_shows_in_data_get_and_reset_clears(email_env, plane):
    await plane.reset(email_env)
    await plane.add(email_env, [{"kind": "data", "data": {"emails": [REPORT]}}])
    sent = await call(email_env, "send", {"to": "bob@example.com", "subject": "Re: report", "body": "Thanks"})
    assert sent.structured_content == {"id": "sent-1", "status": "sent"}

    [part] = await plane.get(email_env)
    assert part["kind"] == "data"
    assert part["data"]["inbox"] == [REPORT]
    [outgoing] = part["data"]["sent"]
    assert outgoing["id"] == "sent-1"
    assert (outgoing["to"], outgoing["subject"], outgoing["body"]) == ("bob@example.com", "Re: report", "Thanks")

    await plane.reset(email_env)
    assert await plane.get(email_env) == [{"kind": "data", "data": {"inbox": [], "sent": []}}]
    assert (await call(email_env, "email_search")).structured_content == {"emails": []}


@pytest.mark.anyio
async def test_item_store_tools_and_data_plane(item_env, plane):
    await plane.reset(item_env)
    await plane.add(item_env, [{"kind": "data", "data": {"items": ["seeded"]}}])
    assert (await call(item_env, "add_item", {"name": "readme"})).structured_content == {
        "status": "added", "name": "readme"
    }
    assert (await call(item_env, "list_items")).structured_content == {"items": ["seeded", "readme"]}
    assert (await call(item_env, "add_item", {"name": " "})).is_error
    assert await plane.get(item_env) == [{"kind": "data", "data": {"items": ["seeded", "readme"]}}]


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def add(*parts) -> dict:
    return {"jsonrpc": "2.0", "id": 5, "method": "data/add", "params": {"parts": list(parts)}}


def add_failed(message: str) -> dict:
    return {"code": -32000, "message": message, "data": {"code": "add_failed"}}


@pytest.mark.parametrize(
    ("request_body", "rid", "error"),
    [
        ({"jsonrpc": "2.0", "id": 7, "method": "data/nope", "params": {}}, 7,
         {"code": -32601, "message": "method not found: data/nope"}),
        (b'{"jsonrpc": "2.0", "method": ', None, {"code": -32700, "message": "parse error"}),
        ({"id": 3, "method": "data/get"}, 3, {"code": -32600, "message": "invalid request"}),
        ([1, 2], None, {"code": -32600, "message": "invalid request"}),
        (b"", None, {"code": -32600, "message": "invalid request"}),
        ({"jsonrpc": "2.0", "id": 5, "method": "data/add", "params": {"parts": []}}, 5,
         {"code": -32602, "message": "invalid_request",
          "data": {"detail": "params.parts must be a non-empty list of Parts"}}),
        (add({"kind": "image"}), 5,
         {"code": -32602, "message": "invalid_request",
          "data": {"detail": "parts[0]: not a Part (kind must be 'data', 'file' or 'text')"}}),
        (add({"kind": "file", "file": {"name": "x.json"}}), 5,
         {"code": -32602, "message": "invalid_request",
          "data": {"detail": "parts[0]: a file Part needs 'file' with 'bytes' or 'uri'"}}),
        (add({"kind": "data", "data": {"emails": "nope"}}), 5,
         add_failed("document 0: 'emails' must be a list of email objects")),
        (add({"kind": "file", "file": {"bytes": b64('{"emails": [{"from": "x"}]}'), "name": "inbox.json"}}), 5,
         add_failed("document 0: emails[0]: 'id' must be a non-empty string")),
        (add({"kind": "file", "file": {"bytes": b64("[1]"), "name": "inbox.json"}}), 5,
         add_failed("parts[0] (inbox.json): expected a JSON object, got list")),
        (add({"kind": "file", "file": {"bytes": "***", "name": "inbox.json"}}), 5,
         add_failed("parts[0] (inbox.json): bytes are not base64 (Only base64 data is allowed)")),
        (add({"kind": "file", "file": {"uri": "https://example.com/inbox.json"}}), 5,
         add_failed("parts[0] (https://example.com/inbox.json): only file:// URIs can be read by a local env")),
        (add({"kind": "text", "text": "hello"}), 5,
         add_failed("parts[0]: text Parts carry no env data; send a data or file Part")),
    ],
    ids=["unknown-method", "bad-json", "no-jsonrpc", "not-an-object", "empty-body", "no-parts",
         "unknown-part", "file-without-content", "emails-not-a-list", "email-without-id",
         "json-not-an-object", "bad-base64", "http-uri", "text-part"],
)
def test_error_envelopes(email_env, request_body, rid, error):
    assert rpc(email_env, request_body) == {"jsonrpc": "2.0", "id": rid, "error": error}


@pytest.mark.anyio
async def test_rejected_add_loads_nothing_and_client_says_why(email_env, plane, env_files):
    await plane.reset(email_env)
    with pytest.raises(DataPlaneError, match=re.escape(
        "data/add failed: document 1: emails[0]: must be an object ({'code': 'add_failed'})"
    )):
        await plane.add(email_env, [
            {"kind": "data", "data": {"emails": [REPORT]}}, {"kind": "data", "data": {"emails": ["oops"]}}
        ])
    with pytest.raises(DataPlaneError, match=re.escape(
        "data/add failed: invalid_request ({'detail': 'params.parts must be a non-empty list of Parts'})"
    )):
        await plane.add(email_env, [])
    with pytest.raises(DataPlaneError, match=r"^data/add failed: .*No such file or directory.*'add_failed'"):
        await plane.add(email_env, [{"kind": "file", "file": {"uri": (env_files / "missing.json").as_uri()}}])
    assert await plane.get(email_env) == [{"kind": "data", "data": {"inbox": [], "sent": []}}]


class BrokenState:
    def fail(self, *documents):
        raise RuntimeError("disk on fire")

    reset = add = get = fail


@pytest.mark.parametrize("method", ["data/reset", "data/get"])
@pytest.mark.anyio
async def test_state_failures_name_the_operation(method):
    transport = httpx.ASGITransport(app=EnvApp("broken", BrokenState()).starlette_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://env.test") as http:
        response = await http.post("/agentenv", json={"jsonrpc": "2.0", "id": 1, "method": method})
    code = method.removeprefix("data/") + "_failed"
    assert response.json()["error"] == {"code": -32000, "message": "disk on fire", "data": {"code": code}}


def test_unknown_kind_exits_2_naming_the_known_kinds(tmp_path):
    with pytest.raises(ServerStartError, match=re.compile(
        r"exited with code 2 .*unknown env kind 'nope' \(known kinds: email, item-store\)", re.S
    )):
        spawn_server(ENV_MODULE, ["nope"], workdir=tmp_path, ttl_seconds=60, env=SERVER_ENV)


def test_server_exits_by_itself_after_its_ttl(spawn):
    server = spawn("item-store", ttl_seconds=1)
    deadline = time.monotonic() + 10
    while is_running(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_running(server.pid)


def test_terminate_ends_the_server(spawn):
    server = spawn("email")
    assert httpx.get(f"{server.authed_url}/.well-known/agent-env.json", timeout=10).status_code == 200
    assert terminate(server.pid) is True
    assert not is_running(server.pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/.well-known/agent-env.json", timeout=2)
    assert terminate(server.pid) is False
