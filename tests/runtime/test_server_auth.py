"""The run's token goes with requests to the run's own servers only (the origins its ledger
lists), never to an outside agent, a live env or a model API on the same machine."""

from __future__ import annotations

import httpx

from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.runtime.server_auth import RunServerAuth


def sent(auth: RunServerAuth, url: str) -> str | None:
    """The Authorization header a request to ``url`` leaves with."""
    seen = {}

    def answer(request: httpx.Request) -> httpx.Response:
        seen["authorization"] = request.headers.get("authorization")
        return httpx.Response(200)

    with httpx.Client(transport=httpx.MockTransport(answer), auth=auth) as http:
        http.get(url)
    return seen["authorization"]


def test_the_token_goes_to_the_run_servers_and_nowhere_else(tmp_path):
    ledger = Ledger(tmp_path / "deployments")
    token = ledger.token()
    ledger.record("email-1", "env", pid=1, url="http://127.0.0.1:4100")
    ledger.record_hosted("agent-host-1", {"a1": "http://127.0.0.1:4200/agents/a1"})
    auth = RunServerAuth(ledger)
    assert sent(auth, "http://127.0.0.1:4100/agentenv") == f"Bearer {token}"
    assert sent(auth, "http://127.0.0.1:4200/agents/a2/") == f"Bearer {token}"  # the host's origin
    for elsewhere in ("http://127.0.0.1:4300/v1/messages",  # a model API on this machine
                      "https://api.anthropic.com/v1/messages", "http://agents.example.com:4100/"):
        assert sent(auth, elsewhere) is None, elsewhere
    # a server deployed since, by another process of the run, is found in the ledger
    ledger.record("item-store-2", "env", pid=2, url="http://127.0.0.1:4400")
    assert sent(auth, "http://127.0.0.1:4400/mcp") == f"Bearer {token}"
    assert auth.url_with_token("http://127.0.0.1:4400/mcp") == f"http://agentenv:{token}@127.0.0.1:4400/mcp"
    assert auth.url_with_token("http://127.0.0.1:4300/mcp") == "http://127.0.0.1:4300/mcp"


def test_the_token_is_made_once_owner_only_and_shared_by_the_run(tmp_path):
    first, second = Ledger(tmp_path / "deployments"), Ledger(tmp_path / "deployments")
    assert first.token(create=False) is None
    token = first.token()
    assert second.token() == token and len(token) >= 32
    assert (tmp_path / "deployments" / ".token").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "deployments").stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in (tmp_path / "deployments").iterdir()) == [".token"]  # nothing left staged
