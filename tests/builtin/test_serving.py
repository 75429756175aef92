"""The servers a run starts answer only the run: every route of an env, of an agent host and
of its hosted agents refuses a request without the run's token (401), even from a process
that found the port; a data plane reads files only under the run's artifact folders; a
server's environment holds none of our keys; and a server ends with the run's owner."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from agentenv_dagster.builtin.agents.server import EmbeddedAgent, build_app, build_card
from agentenv_dagster.builtin.envs import build_env
from agentenv_dagster.runtime.a2a_client import A2AClient
from agentenv_dagster.runtime.processes import ProcessIdentity, is_running, spawn_server, terminate
from agentenv_dagster.runtime.sandbox import LocalSandbox
from projects import REPO

PYTHONPATH = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
SECRET = "sk-ant-api03-SERVING-" + secrets.token_hex(8)


@pytest.fixture
def servers(tmp_path):
    """``start(module, args)`` -> a server of this test; all are ended (and checked gone)."""
    started = []

    def start(module: str, args: list[str], **kwargs):
        server = spawn_server(module, args, workdir=tmp_path / f"server{len(started)}", ttl_seconds=120,
                              env={**PYTHONPATH, **kwargs.pop("env", {})}, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        terminate(server.pid)
    assert not [s.pid for s in started if is_running(s.pid)]


def app_routes(app) -> list[tuple[str, str]]:
    """(method, path) of every route an app declares (a path parameter filled with ``x``)."""
    found = []
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            if method != "HEAD":
                found.append((method, route.path.replace("{agent_id}", "x")))
    return found


ATTACK = textwrap.dedent("""
    # Another process with no key of its own: it knows where the servers listen (it could read
    # /proc/net/tcp) and tries every route it knows, and the attack of issue 40 on a host.
    import json, sys, httpx
    routes, sandbox = json.loads(sys.argv[1]), sys.argv[2]
    answers = []
    for method, url in routes:
        body = ({"id": "evil", "sandbox": sandbox, "config": {"kind": "replay", "episodes": [],
                                                               "workspace": {"container": None}}}
                if url.endswith("/agents") else
                {"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}})
        try:
            response = httpx.request(method, url, json=body if method in ("POST", "PUT") else None, timeout=10)
            answers.append([method, url, response.status_code])
        except httpx.HTTPError as exc:
            answers.append([method, url, repr(exc)])
    print(json.dumps(answers))
""")


def attack(routes: list[tuple[str, str]], sandbox: Path) -> list[list]:
    done = subprocess.run([sys.executable, "-c", ATTACK, json.dumps(routes), str(sandbox)],
                          capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout)


def test_every_route_of_an_env_refuses_a_process_without_the_token(servers, tmp_path):
    env = servers("agentenv_dagster.builtin.envs", ["email"])
    routes = app_routes(build_env("email").starlette_app()) + [("GET", "/nowhere")]
    assert len(routes) >= 13  # card, data plane, MCP, clock, sync_time, triggers
    answers = attack([(method, env.url + path) for method, path in routes], tmp_path / "evil")
    assert [status for _, _, status in answers] == [401] * len(routes), answers
    wrong = httpx.post(f"{env.url}/agentenv", headers={"Authorization": "Bearer " + "x" * 43}, json={})
    assert wrong.status_code == 401
    # the run, with its token, is served
    ok = httpx.post(f"{env.url}/agentenv", headers=env.auth_headers,
                    json={"jsonrpc": "2.0", "id": 1, "method": "data/get", "params": {}})
    assert ok.status_code == 200 and "result" in ok.json()


def test_every_route_of_an_agent_host_and_its_agents_refuses_a_process_without_the_token(servers, tmp_path):
    host = servers("agentenv_dagster.builtin.agents", ["host"])
    created = httpx.post(f"{host.url}/agents", headers=host.auth_headers, json={
        "id": "a", "sandbox": str(tmp_path / "a"), "config": {"kind": "replay", "episodes": []}})
    assert created.status_code == 201
    agent_url = created.json()["url"]
    agent_routes = app_routes(build_app(EmbeddedAgent(None, LocalSandbox(tmp_path)), build_card("a", "a")))
    routes = [("POST", f"{host.url}/agents"), ("GET", f"{host.url}/agents"), ("DELETE", f"{host.url}/agents/a"),
              *((method, agent_url + path) for method, path in agent_routes),
              ("POST", f"{host.url}/model-proxy/anthropic/v1/messages")]
    assert len(agent_routes) >= 10  # cards, JSON-RPC, the agentenv extensions
    answers = attack(routes, tmp_path / "evil")
    assert [status for _, _, status in answers] == [401] * len(routes), answers
    assert not (tmp_path / "evil").exists()  # the attacker's agent was never made
    listed = httpx.get(f"{host.url}/agents", headers=host.auth_headers).json()
    assert listed == {"agents": ["a"]}


def test_an_agent_served_on_its_own_refuses_without_the_token(servers, tmp_path):
    (tmp_path / "replay.json").write_text(json.dumps({"episodes": []}))
    agent = servers("agentenv_dagster.builtin.agents",
                    ["replay", "--sandbox", str(tmp_path / "sb"), "--config-file", str(tmp_path / "replay.json")])
    assert httpx.get(f"{agent.url}/.well-known/agent-card.json").status_code == 401
    assert httpx.post(f"{agent.url}/ext/mcp-config", json={"url": "http://x/mcp"}).status_code == 401
    assert httpx.get(f"{agent.url}/.well-known/agent-card.json", headers=agent.auth_headers).status_code == 200


def test_a_server_started_without_a_token_does_not_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentenv_dagster.builtin.envs", "email",
                           "--ready-file", str(tmp_path / "ready.json")],
                          input="", capture_output=True, text=True, env={**os.environ, **PYTHONPATH}, timeout=60)
    assert done.returncode != 0 and "reads its bearer token from standard input" in done.stderr
    assert not (tmp_path / "ready.json").exists()


def test_data_add_reads_file_uris_only_under_the_run_artifact_folders(servers, tmp_path):
    allowed = tmp_path / "artifacts"
    allowed.mkdir()
    (allowed / "inbox.json").write_text(json.dumps({"emails": [{"id": "e1", "from": "a@x", "to": "b@x",
                                                               "subject": "s", "body": "b"}]}))
    outside = tmp_path / "private.json"
    outside.write_text('{"emails": []}')
    env = servers("agentenv_dagster.builtin.envs", ["email", "--file-root", str(allowed)])

    def add(path: Path) -> dict:
        part = {"kind": "file", "file": {"uri": path.as_uri(), "name": "x"}}
        return httpx.post(f"{env.url}/agentenv", headers=env.auth_headers, json={
            "jsonrpc": "2.0", "id": 1, "method": "data/add", "params": {"parts": [part]}}).json()

    assert add(allowed / "inbox.json") == {"jsonrpc": "2.0", "id": 1, "result": {}}
    refused = "parts[0] (x): a local env reads file:// URIs only under the run's artifact folders"
    # the same answer whether the file exists or not: no oracle on the host's files
    for path in (outside, tmp_path / "missing.json", Path("/etc/passwd"), allowed / ".." / "private.json"):
        assert add(path)["error"]["message"] == refused, path
    link = allowed / "link.json"
    link.symlink_to(outside)  # a link out of the folder is outside it
    assert add(link)["error"]["message"] == refused


def test_a_server_holds_none_of_our_keys_in_its_environment(servers, tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    monkeypatch.setenv("MY_SERVICE_TOKEN", SECRET)
    env = servers("agentenv_dagster.builtin.envs", ["email"])
    host = servers("agentenv_dagster.builtin.agents", ["host"],
                   secrets_for_server={"model_api": {"anthropic": {"api_key": SECRET}}})
    for server in (env, host):
        environ = Path(f"/proc/{server.pid}/environ").read_bytes()
        assert SECRET.encode() not in environ and server.token.encode() not in environ
        assert server.token not in Path(f"/proc/{server.pid}/cmdline").read_text()
    # a hosted agent's Bash: the allowlist, plus the sandbox's own variables
    workspace = tmp_path / "ws"
    episode = {"match": ".", "reply": "done", "actions": [{"tool": "Bash", "arguments": {"command": "env > env.txt"}}]}
    created = httpx.post(f"{host.url}/agents", headers=host.auth_headers, json={
        "id": "a", "sandbox": str(workspace), "config": {
            "kind": "replay", "episodes": [episode], "workspace": {"container": None, "env": {"TASK_VAR": "mine"}}}})
    async def prompt():
        async with httpx.AsyncClient(headers=host.auth_headers, timeout=30) as http:
            return await A2AClient(http).send_and_wait(created.json()["url"], "go", timeout_seconds=30)

    assert asyncio.run(prompt()).state == "completed"
    seen = (workspace / "env.txt").read_text()
    assert "TASK_VAR=mine" in seen and "PATH=" in seen
    assert SECRET not in seen and host.token not in seen and "PYTHONPATH" not in seen


def test_a_server_ends_as_soon_as_the_run_owner_is_killed(servers):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        env = servers("agentenv_dagster.builtin.envs", ["email"], owner=ProcessIdentity.of(owner.pid))
        assert is_running(env.pid)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.monotonic() + 5
        while is_running(env.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not is_running(env.pid)
    finally:
        owner.kill()
        owner.wait()


def test_an_owner_already_gone_or_a_stranger_with_its_pid_ends_the_server_at_once(servers):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    server = servers("agentenv_dagster.builtin.envs", ["email"], owner=ProcessIdentity(gone.pid, 1))
    deadline = time.monotonic() + 5
    while is_running(server.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_running(server.pid)
    # this process, but with another start time: a stranger that got the owner's pid
    stranger = ProcessIdentity.of(os.getpid())
    server = servers("agentenv_dagster.builtin.envs", ["email"],
                     owner=ProcessIdentity(stranger.pid, (stranger.started or 0) + 1))
    deadline = time.monotonic() + 5
    while is_running(server.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not is_running(server.pid)


def test_terminate_leaves_a_process_that_reused_the_pid_alone():
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        started = ProcessIdentity.of(other.pid).started
        assert terminate(other.pid, started=started + 1) is False  # recorded at another start: not this one
        assert is_running(other.pid)
        assert terminate(other.pid, started=started) is True
    finally:
        other.kill()
        other.wait()
