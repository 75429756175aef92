"""The real coding agents, deployed by the local provider into an agent host: claude-code is
the real claude_agent_sdk and the Claude Code CLI it bundles, talking to the fake Messages
API; codex is the real Codex CLI (when on PATH) against the fake Responses API, and our
adapter around a stand-in ``codex`` executable that plays ``codex exec --json`` JSONL for
the cases a model cannot easily be scripted into (tool refusals, failed turns, resume). All
work in their sandbox folder, beside the real item-store env over MCP."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import signal
import stat
import sys
import textwrap
from pathlib import Path

import anyio
import httpx
import pytest
from fakes.messages_api import text_reply, tool_use_reply
from fakes.responses_api import FakeResponsesAPI, function_call, message

from agentenv_dagster.config import AgentEntry, AgentEnvConfig, AgentsConfig, ModelConfig
from agentenv_dagster.runtime.a2a_client import AGENT_CONFIG_URI, MCP_CONFIG_URI, A2AClient
from agentenv_dagster.runtime.local import DeploymentError, LocalProvider
from agentenv_dagster.runtime.processes import is_running, spawn_server, terminate

pytestmark = pytest.mark.anyio
REPO = Path(__file__).resolve().parents[2]
HAS_CLAUDE_SDK = importlib.util.find_spec("claude_agent_sdk") is not None
needs_claude_sdk = pytest.mark.skipif(not HAS_CLAUDE_SDK, reason="claude-agent-sdk is not installed "
                                      "(pip install 'agentenv-dagster[agents]')")
MODEL = "claude-sonnet-4-6"


@pytest.fixture(scope="module")
def item_store(tmp_path_factory):
    """The real item-store env (its URL, and the token an agent calls it with)."""
    server = spawn_server("agentenv_dagster.builtin.envs", ["item-store"],
                          workdir=tmp_path_factory.mktemp("item-store"), ttl_seconds=300)
    try:
        yield server
    finally:
        terminate(server.pid)
    assert not is_running(server.pid)


@pytest.fixture
def provide(tmp_path, monkeypatch):
    """``provide(entry, **model)`` -> a LocalProvider whose registry has ``entry`` as 'coder';
    everything it deployed is torn down afterwards."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    providers: list[LocalProvider] = []

    def provide(entry: AgentEntry, **model) -> LocalProvider:
        config = AgentEnvConfig(model=ModelConfig(**model), agents=AgentsConfig(registry={"coder": entry}), root=tmp_path)
        providers.append(LocalProvider(config, tmp_path / f"run{len(providers)}"))
        return providers[-1]

    provide.providers = providers
    yield provide
    for provider in providers:
        provider.teardown()
        hosts = [e for e in provider.ledger.entries().values() if e.get("pid")]
        assert not [e for e in hosts if is_running(e["pid"])]


class ProvidersAuth(httpx.Auth):
    """The run token of whichever of the test's providers a request goes to."""

    def __init__(self, providers: list[LocalProvider]) -> None:
        self.providers = providers

    def auth_flow(self, request):
        for provider in self.providers:
            request.headers.update(provider.server_auth.headers_for(request.url))
        yield request


@pytest.fixture
async def a2a(provide):
    async with httpx.AsyncClient(timeout=60, auth=ProvidersAuth(provide.providers)) as http:
        yield A2AClient(http)


async def deploy(a2a: A2AClient, provider: LocalProvider, workspace: Path, env, env_vars: dict | None = None,
                 **agent_config) -> tuple[str, dict]:
    """Deploy the provider's 'coder' as the deploy_agent step does: MCP env (with its token),
    then agent-config."""
    agent = provider.deploy_agent("coder", agent_name="agent", ttl_seconds=120, workspace=workspace, env_vars=env_vars)
    card = await a2a.get_card(agent.a2a_url)
    await a2a.post_extension(agent.a2a_url, card, MCP_CONFIG_URI,
                             {"url": f"{env.url}/mcp", "name": "items", "headers": env.auth_headers})
    if agent_config:
        await a2a.post_extension(agent.a2a_url, card, AGENT_CONFIG_URI, agent_config)
    return agent.a2a_url, card


def tool_calls(trajectory: list[dict]) -> list[dict]:
    return [e for e in trajectory if e["type"] == "tool_call"]


# --- claude-code: the real SDK and CLI -------------------------------------------------------


@needs_claude_sdk
@pytest.mark.slow
async def test_claude_code_works_in_its_sandbox_and_its_tool_calls_are_telemetry(
        a2a, provide, fake_messages_api, item_store, tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    fake_messages_api.enqueue(
        tool_use_reply("Write", {"file_path": str(workspace / "hello.py"), "content": "print('hello')\n"},
                       text="I'll write the script.", usage=(100, 20)),
        tool_use_reply("mcp__items__add_item", {"name": "hello.py"}, usage=(120, 10)),
        text_reply("Wrote hello.py and stored it.", usage=(150, 8)),
    )
    entry = AgentEntry(kind="claude-code", permission_mode="acceptEdits", disallowed_tools=["WebSearch"])
    provider = provide(entry, base_url=fake_messages_api.base_url, api_key="sk-test")
    url, card = await deploy(a2a, provider, workspace, item_store, system_prompt="Always store what you write.",
                                  max_turns=5, model=MODEL)
    reply = await a2a.send_and_wait(url, "Write hello.py and store it", timeout_seconds=120)

    assert reply.state == "completed", reply.text
    assert reply.text == "Wrote hello.py and stored it."
    assert (workspace / "hello.py").read_text() == "print('hello')\n"  # Claude Code's own Write tool
    assert reply.data["tool_call_count"] == 2 and reply.data["model"] == MODEL
    assert reply.data["usage"]["input_tokens"] == 370 and reply.data["usage"]["output_tokens"] == 38
    calls = tool_calls(await a2a.get_trajectory(url, card, reply.task_id))
    assert [c["name"] for c in calls] == ["Write", "mcp__items__add_item"]
    assert calls[0]["arguments"]["file_path"] == str(workspace / "hello.py") and not calls[0]["is_error"]
    assert '"status":"added"' in calls[1]["result"].replace(" ", "")  # the real env answered
    assert all(c["duration_seconds"] >= 0 and c["started_at"] for c in calls)

    first = fake_messages_api.requests[0].body
    assert first["model"] == MODEL
    tools = {t["name"] for t in first["tools"]}
    assert {"Write", "Bash"} <= tools and "WebSearch" not in tools  # disallowed_tools
    assert "mcp__items__add_item" in json.dumps(first["messages"])  # offered (deferred, behind ToolSearch)
    assert "Always store what you write." in json.dumps(first["system"])
    assert fake_messages_api.requests[0].headers.get("x-api-key") == "sk-test"


@needs_claude_sdk
@pytest.mark.slow
async def test_claude_code_stops_at_run_limits_max_turns(a2a, provide, fake_messages_api, item_store, tmp_path):
    fake_messages_api.enqueue(tool_use_reply("Bash", {"command": "echo one > one.txt"}),
                              tool_use_reply("Bash", {"command": "echo two > two.txt"}))
    provider = provide(AgentEntry(kind="claude-code"), base_url=fake_messages_api.base_url, api_key="sk-test")
    url, card = await deploy(a2a, provider, tmp_path / "ws", item_store, max_turns=1, model=MODEL)
    reply = await a2a.send_and_wait(url, "Write two files", timeout_seconds=120)

    assert reply.state == "failed"
    assert reply.data["error_type"] == "MaxTurnsExceeded", reply.text
    assert len(fake_messages_api.requests) == 1


@needs_claude_sdk
@pytest.mark.slow
async def test_claude_code_reaches_the_model_through_the_host_proxy_and_its_bash_never_sees_the_key(
        a2a, provide, fake_messages_api, item_store, tmp_path, monkeypatch):
    real_key = "sk-ant-api03-REAL-" + "9" * 20
    monkeypatch.setenv("ANTHROPIC_API_KEY", real_key)  # ours: in the deployer's environment
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    fake_messages_api.enqueue(tool_use_reply("Bash", {"command": "env > env.txt"}), text_reply("Looked around."))
    provider = provide(AgentEntry(kind="claude-code", allowed_tools=["Bash"]), base_url=fake_messages_api.base_url)
    url, card = await deploy(a2a, provider, workspace, item_store, model=MODEL)
    reply = await a2a.send_and_wait(url, "What is in your environment?", timeout_seconds=120)

    assert reply.state == "completed", reply.text
    seen = (workspace / "env.txt").read_text()  # what Claude Code's own Bash found
    host = next(e for e in provider.ledger.entries().values() if e.get("pid"))["url"]
    assert real_key not in seen and provider.ledger.token() not in seen
    assert f"ANTHROPIC_BASE_URL={host}/model-proxy/anthropic" in seen
    proxy_key = next(line.split("=", 1)[1] for line in seen.splitlines() if line.startswith("ANTHROPIC_API_KEY="))
    assert proxy_key != real_key
    # the model API got the real key, from the proxy
    assert {r.headers.get("x-api-key") for r in fake_messages_api.requests} == {real_key}
    # the proxy key works only through the host, and nothing else does
    body = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    fake_messages_api.enqueue(text_reply("proxied"))
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{host}/model-proxy/anthropic/v1/messages", json=body, headers={"x-api-key": "guess"})
        proxied = await http.post(f"{host}/model-proxy/anthropic/v1/messages", json=body, headers={"x-api-key": proxy_key})
        elsewhere = await http.get(f"{host}/agents", headers={"x-api-key": proxy_key})
    assert (refused.status_code, proxied.status_code, elsewhere.status_code) == (401, 200, 401)
    assert fake_messages_api.requests[-1].headers.get("x-api-key") == real_key


# --- codex: the real CLI, when installed, against the fake Responses API --------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("codex") is None, reason="the Codex CLI is not on PATH (npm install -g @openai/codex)")
async def test_the_real_codex_cli_works_in_its_sandbox(a2a, provide, item_store, tmp_path, monkeypatch):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "codex-home").mkdir()
    with FakeResponsesAPI() as api:
        api.enqueue(function_call("exec_command", {"cmd": "echo hello > hello.txt"}), message("Done."))
        monkeypatch.setenv("CODEX_BASE_URL", api.base_url)
        monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex-home"))
        monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")
        url, card = await deploy(a2a, provide(AgentEntry(kind="codex", model="gpt-5-codex")), workspace, item_store,
                                      system_prompt="Be terse.")
        reply = await a2a.send_and_wait(url, "Write hello.txt", timeout_seconds=120)

    assert reply.state == "completed", reply.text
    assert reply.text == "Done." and (workspace / "hello.txt").read_text() == "hello\n"
    calls = tool_calls(await a2a.get_trajectory(url, card, reply.task_id))
    assert [(c["name"], c["is_error"]) for c in calls] == [("Bash", False)]
    assert "echo hello > hello.txt" in calls[0]["arguments"]["command"]
    assert reply.data["usage"]["output_tokens"] == 40  # two model calls of 20
    first = api.requests[0]
    assert first["model"] == "gpt-5-codex" and "Be terse." in json.dumps(first)
    assert "add_item" in json.dumps(first["tools"])  # codex connected to the env's MCP server itself


# --- codex: our adapter around a stand-in CLI -----------------------------------------------

FAKE_CODEX = textwrap.dedent('''\
    #!{python}
    """Stands in for `codex exec --json`: logs its call, plays FAKE_CODEX_EVENTS (JSON lines),
    really running each completed command_execution in its working directory."""
    import json, os, subprocess, sys, time
    prompt = sys.stdin.read()
    with open(os.environ["FAKE_CODEX_LOG"], "a") as log:
        log.write(json.dumps({{"argv": sys.argv[1:], "stdin": prompt, "cwd": os.getcwd(),
                              "path": os.environ["PATH"], "pid": os.getpid()}}) + "\\n")
    for line in open(os.environ["FAKE_CODEX_EVENTS"]):
        event = json.loads(line)
        item = event.get("item") or {{}}
        if event["type"] == "sleep":
            time.sleep(event["seconds"])
            continue
        if event["type"] == "item.completed" and item.get("type") == "command_execution":
            done = subprocess.run(item["command"], shell=True, capture_output=True, text=True)
            item.update(aggregated_output=done.stdout + done.stderr, exit_code=done.returncode,
                        status="completed" if done.returncode == 0 else "failed")
        print(json.dumps(event), flush=True)
        if event["type"] == "turn.failed":
            sys.exit(1)
''')


@pytest.fixture
def fake_codex(tmp_path, monkeypatch):
    """A ``codex`` on PATH playing the events given to ``fake_codex(events)``; returns the
    log of its invocations."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    cli = bin_dir / "codex"
    cli.write_text(FAKE_CODEX.format(python=sys.executable))
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    log, events_file = tmp_path / "codex-calls.jsonl", tmp_path / "codex-events.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai-test")

    def play(events: list[dict]) -> Path:
        events_file.write_text("".join(json.dumps(e) + "\n" for e in events))
        return log

    # where it logs and what it plays: the agent's own variables (deploy_agent's env_vars)
    play.env = {"FAKE_CODEX_LOG": str(log), "FAKE_CODEX_EVENTS": str(events_file)}
    return play


def command(item_id: str, text: str, phase: str) -> dict:
    return {"type": f"item.{phase}", "item": {"id": item_id, "type": "command_execution", "command": text,
                                              "aggregated_output": "", "exit_code": None, "status": "in_progress"}}


CODEX_RUN = [
    {"type": "thread.started", "thread_id": "0199a213-81c0-7800-8aa1-bbab2a035a53"},
    {"type": "turn.started"},
    command("item_0", "echo hello > hello.txt", "started"),
    command("item_0", "echo hello > hello.txt", "completed"),
    {"type": "item.completed", "item": {"id": "item_1", "type": "reasoning", "text": "Now store it."}},
    {"type": "item.started", "item": {"id": "item_2", "type": "mcp_tool_call", "server": "items", "tool": "add_item",
                                      "arguments": {"name": "hello.txt"}, "result": None, "error": None,
                                      "status": "in_progress"}},
    {"type": "item.completed", "item": {"id": "item_2", "type": "mcp_tool_call", "server": "items", "tool": "add_item",
                                        "arguments": {"name": "hello.txt"}, "error": None, "status": "completed",
                                        "result": {"content": [{"type": "text", "text": "added"}], "structured_content": None}}},
    {"type": "item.completed", "item": {"id": "item_3", "type": "file_change", "status": "completed",
                                        "changes": [{"path": "notes.md", "kind": "add"}]}},
    {"type": "item.completed", "item": {"id": "item_4", "type": "agent_message", "text": "Done: hello.txt."}},
    {"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 90}},
]


async def test_codex_runs_in_its_sandbox_and_its_items_are_telemetry(a2a, provide, fake_codex, item_store, tmp_path):
    log = fake_codex(CODEX_RUN)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    entry = AgentEntry(kind="codex", model="gpt-5-codex", permission_mode="default", path_prepend=["cli_mocks"])
    url, card = await deploy(a2a, provide(entry), workspace, item_store, fake_codex.env, system_prompt="Be terse.",
                                  model="claude-sonnet-4-6")  # the run's Anthropic default: not for codex
    reply = await a2a.send_and_wait(url, "Write hello.txt", timeout_seconds=60, context_id="dialog-1")

    assert reply.state == "completed", reply.text
    assert reply.text == "Done: hello.txt."
    assert (workspace / "hello.txt").read_text() == "hello\n"
    assert reply.data["tool_call_count"] == 3
    assert reply.data["usage"] == {"input_tokens": 1000, "output_tokens": 90, "cache_read_input_tokens": 200}
    calls = tool_calls(await a2a.get_trajectory(url, card, reply.task_id))
    assert [(c["name"], c["is_error"]) for c in calls] == [
        ("Bash", False), ("mcp__items__add_item", False), ("Write", False)]
    assert calls[0]["arguments"] == {"command": "echo hello > hello.txt"} and calls[0]["result"].endswith("[exit code 0]")
    assert calls[1]["arguments"] == {"name": "hello.txt"} and calls[1]["result"] == "added"
    assert calls[2]["arguments"] == {"changes": [{"path": "notes.md", "kind": "add"}]}

    call = json.loads(log.read_text().splitlines()[0])
    assert call["stdin"] == "Write hello.txt" and Path(call["cwd"]) == workspace.resolve()
    assert call["path"].startswith(f"{workspace.resolve() / 'cli_mocks'}{os.pathsep}")  # CLI mocks first
    argv = call["argv"]
    assert argv[:3] == ["exec", "--json", "--skip-git-repo-check"] and argv[-1] == "-"
    for pair in (["-c", 'sandbox_mode="workspace-write"'], ["-c", 'approval_policy="never"'],
                 ["--model", "gpt-5-codex"], ["-c", 'developer_instructions="Be terse."'],
                 ["-c", f'mcp_servers.items.url="{item_store.url}/mcp"']):
        assert any(argv[i:i + 2] == pair for i in range(len(argv))), (pair, argv)

    again = await a2a.send_and_wait(url, "And now?", timeout_seconds=60, context_id="dialog-1")
    assert again.state == "completed"
    assert json.loads(log.read_text().splitlines()[1])["argv"][:3] == [
        "exec", "resume", "0199a213-81c0-7800-8aa1-bbab2a035a53"]  # one Codex thread per A2A context


async def test_codex_is_stopped_at_a_disallowed_tool(a2a, provide, fake_codex, item_store, tmp_path):
    fake_codex([{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                command("item_0", "touch after.txt", "started"), {"type": "sleep", "seconds": 3},
                command("item_0", "touch after.txt", "completed"),  # runs only if codex was not stopped
                {"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0, "output_tokens": 1}}])
    workspace = tmp_path / "workspace"
    entry = AgentEntry(kind="codex", allowed_tools=["Write", "mcp__items__add_item"], permission_mode="plan")
    url, card = await deploy(a2a, provide(entry), workspace, item_store, fake_codex.env)
    reply = await a2a.send_and_wait(url, "Ship it", timeout_seconds=60)

    assert reply.state == "failed" and reply.data["error_type"] == "ToolNotAllowed", reply.text
    assert "codex called Bash" in reply.data["error_message"]
    await anyio.sleep(3.5)
    assert not (workspace / "after.txt").exists()


async def test_a_failed_codex_turn_fails_the_task_with_its_message(a2a, provide, fake_codex, item_store, tmp_path):
    fake_codex([{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                {"type": "error", "message": "Reconnecting... 1/5"},
                {"type": "turn.failed", "error": {"message": "unexpected status 401 Unauthorized"}}])
    url, card = await deploy(a2a, provide(AgentEntry(kind="codex")), tmp_path / "ws", item_store, fake_codex.env)
    reply = await a2a.send_and_wait(url, "Hello", timeout_seconds=60)

    assert reply.state == "failed" and reply.data["error_type"] == "CodexError"
    assert reply.data["error_message"] == "codex turn failed: unexpected status 401 Unauthorized"


async def test_a_codex_run_still_going_at_the_teardown_is_stopped_with_its_host(a2a, provide, fake_codex, item_store,
                                                                                 tmp_path):
    """The teardown's SIGTERM ends the host at once, and the codex CLI it runs (in a process
    group of its own, which the teardown's signals do not reach) is stopped first, not left
    to run on."""
    log = fake_codex([{"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
                      {"type": "sleep", "seconds": 60}])
    provider = provide(AgentEntry(kind="codex"))
    url, card = await deploy(a2a, provider, tmp_path / "ws", item_store, fake_codex.env)
    sending = asyncio.ensure_future(a2a.send_and_wait(url, "Take your time", timeout_seconds=90))
    while not log.exists():
        assert not sending.done()
        await anyio.sleep(0.05)
    codex = json.loads(log.read_text().splitlines()[0])["pid"]
    try:
        assert is_running(codex)
        assert provider.teardown()  # what was running: the host
        deadline = anyio.current_time() + 10  # (against the CLI's 60 s)
        while is_running(codex) and anyio.current_time() < deadline:
            await anyio.sleep(0.05)
        assert not is_running(codex)
        with pytest.raises(httpx.TransportError):
            await sending
    finally:
        if is_running(codex):  # (the test failed: nothing of it is left running)
            os.killpg(codex, signal.SIGKILL)


# --- deploy-time checks ----------------------------------------------------------------------


def test_codex_without_its_cli_or_a_key_fails_at_deploy(provide, tmp_path, monkeypatch, fake_codex):
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "no-codex-home"))
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.delenv("CODEX_API_KEY", raising=False)
    with pytest.raises(DeploymentError, match=r"^A2A agent 'coder' \(kind codex\) needs an API key: set OPENAI_API_KEY"):
        provide(AgentEntry(kind="codex")).deploy_agent("coder", agent_name="a", ttl_seconds=60)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(DeploymentError, match=r"needs the Codex CLI \('codex' is not on PATH\): npm install -g @openai/codex$"):
        provide(AgentEntry(kind="codex")).deploy_agent("coder", agent_name="a", ttl_seconds=60)


@needs_claude_sdk
def test_claude_code_without_a_key_fails_at_deploy(provide):
    with pytest.raises(DeploymentError, match=r"^A2A agent 'coder' \(kind claude-code\) needs an API key"):
        provide(AgentEntry(kind="claude-code"), api_key=None).deploy_agent("coder", agent_name="a", ttl_seconds=60)


def test_claude_code_without_the_sdk_fails_at_deploy(provide, monkeypatch):
    monkeypatch.setitem(sys.modules, "claude_agent_sdk", None)  # as if it were not installed
    with pytest.raises(DeploymentError, match=r"needs the claude-agent-sdk package: pip install 'agentenv-dagster\[agents\]'"):
        provide(AgentEntry(kind="claude-code"), api_key="sk-test").deploy_agent("coder", agent_name="a", ttl_seconds=60)


def test_a_coding_cli_in_a_container_sandbox_is_refused(provide):
    with pytest.raises(DeploymentError, match=r"runs its CLI on this machine in the sandbox folder, not inside"):
        provide(AgentEntry(kind="claude-code"), api_key="sk-test").deploy_agent(
            "coder", agent_name="a", ttl_seconds=60, workspace=Path("/tmp"), container={"container_id": "c"})


@needs_claude_sdk
def test_unknown_sdk_options_fail_the_deploy(provide, tmp_path):
    provider = provide(AgentEntry(kind="claude-code", sdk_options={"max_thinking_tokens": 1000, "warp_speed": 9}),
                       api_key="sk-test")
    with pytest.raises(DeploymentError, match=r"sdk_options \['warp_speed'\] are not ClaudeAgentOptions fields"):
        provider.deploy_agent("coder", agent_name="a", ttl_seconds=60, workspace=tmp_path / "ws")
