"""The data-plane client: round trips against an env app in process, and its error wording."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import httpx
import pytest

from agentenv_dagster.builtin.envs import build_env
from agentenv_dagster.runtime.dataplane import (
    DataPlaneClient,
    DataPlaneError,
    env_base_url,
    file_part_from_bytes,
)

BASE = "http://env.test"


def in_process(kind: str) -> httpx.AsyncClient:
    # The data plane needs no MCP session, so the app runs without its lifespan.
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_env(kind).starlette_app()))


def answering(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


@pytest.mark.anyio
async def test_reset_add_get_round_trip():
    async with in_process("item-store") as http:
        plane = DataPlaneClient(http)
        await plane.reset(BASE)
        await plane.add(BASE, [file_part_from_bytes("items.json", json.dumps({"items": ["a"]}).encode())])
        await plane.add(BASE, [{"kind": "data", "data": {"items": ["b"]}}])
        assert await plane.get(BASE) == [{"kind": "data", "data": {"items": ["a", "b"]}}]
        await plane.reset(BASE + "/")
        assert await plane.get(BASE) == [{"kind": "data", "data": {"items": []}}]


@pytest.mark.anyio
async def test_env_errors_keep_upstream_wording():
    async with in_process("item-store") as http:
        plane = DataPlaneClient(http)
        with pytest.raises(DataPlaneError, match=re.escape(
            "data/add failed: document 0: 'items' must be a list of non-empty names ({'code': 'add_failed'})"
        )):
            await plane.add(BASE, [{"kind": "data", "data": {"items": "a"}}])
        with pytest.raises(DataPlaneError, match=re.escape(
            "data/add failed: invalid_request ({'detail': 'params.parts must be a non-empty list of Parts'})"
        )):
            await plane.add(BASE, [])


@pytest.mark.anyio
async def test_error_without_data_names_the_code():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url == "http://env.test/agentenv"
        body = json.loads(request.content)
        assert body == {"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}}
        return httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "error": {
            "code": -32601, "message": "method not found: data/get"}})

    async with answering(handler) as http:
        with pytest.raises(DataPlaneError, match=re.escape("data/get failed: method not found: data/get (-32601)")):
            await DataPlaneClient(http).get(BASE)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(404, text="nope"), "data/reset failed: HTTP 404 from http://env.test/agentenv"),
        (httpx.Response(200, text="<html>"), "data/reset failed: http://env.test/agentenv did not answer JSON"),
        (httpx.Response(200, json=[1]), "data/reset failed: http://env.test/agentenv did not answer a JSON-RPC object"),
    ],
)
@pytest.mark.anyio
async def test_unusable_answers_are_data_plane_errors(response, message):
    async with answering(lambda request: response) as http:
        with pytest.raises(DataPlaneError, match=re.escape(message)):
            await DataPlaneClient(http).reset(BASE)


@pytest.mark.anyio
async def test_unreachable_env_is_a_data_plane_error():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with answering(refuse) as http:
        with pytest.raises(DataPlaneError, match=re.escape(
            "data/add failed: ConnectError calling http://env.test/agentenv: connection refused"
        )):
            await DataPlaneClient(http).add(BASE, [{"kind": "data", "data": {}}])


@pytest.mark.anyio
async def test_get_without_parts_is_an_error():
    async with answering(lambda request: httpx.Response(200, json={"jsonrpc": "2.0", "id": 1, "result": {}})) as http:
        with pytest.raises(DataPlaneError, match=re.escape("data/get failed: the answer has no parts ({})")):
            await DataPlaneClient(http).get(BASE)


def test_file_part_from_bytes_carries_the_bytes_inline():
    part = file_part_from_bytes("inbox.json", b'{"emails": []}')
    assert part == {"kind": "file", "file": {
        "bytes": base64.b64encode(b'{"emails": []}').decode(), "name": "inbox.json", "mimeType": "application/json"}}
    assert file_part_from_bytes("a.csv", b"x", "text/csv")["file"]["mimeType"] == "text/csv"


@pytest.mark.parametrize(
    ("mcp_url", "base_url"),
    [
        ("http://127.0.0.1:8123/mcp", "http://127.0.0.1:8123"),
        ("http://127.0.0.1:8123/mcp/", "http://127.0.0.1:8123"),
        ("https://gw.example/svc/mcp-email/mcp", "https://gw.example/svc/mcp-email"),
        ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
    ],
)
def test_env_base_url_strips_the_mcp_path(mcp_url, base_url):
    assert env_base_url(mcp_url) == base_url


def test_client_does_not_import_dagster():
    code = "import sys, agentenv_dagster.runtime.dataplane; sys.exit('dagster' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
