"""One process that serves many embedded agents, each under its own URL.

Starting a Python server per agent costs an interpreter's start and imports for every row,
which a dataset of a thousand rows cannot pay on a small machine. A run therefore starts one
host and deploys
each agent into it: ``POST /agents`` with the agent's id, sandbox folder and config (what
the single-agent process reads from ``--config-file``) serves a full agent — card,
JSON-RPC, agentenv extensions, its own sandbox and MCP registrations — under
``/agents/<id>``; ``DELETE /agents/<id>`` ends it and cancels what it is running.

The agents share one set of routes and one A2A request handler: the path picks the agent
(a context variable the handler's tasks inherit), so adding one costs a dict entry.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types import AgentCard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.builtin.agents.brains import build_brain
from agentenv_dagster.builtin.agents.server import PLACEHOLDER_URL, EmbeddedAgent, build_app, build_card
from agentenv_dagster.runtime.sandbox import LocalSandbox

PREFIX = "/agents/"


@dataclass
class Tenant:
    agent: EmbeddedAgent
    card: AgentCard


_current: ContextVar[Tenant] = ContextVar("agentenv_hosted_agent")


class HostedAgent(AgentExecutor):
    """Whichever hosted agent the request is for: every call goes to the current tenant's."""

    async def execute(self, context, event_queue) -> None:
        await _current.get().agent.execute(context, event_queue)

    async def cancel(self, context, event_queue) -> None:
        await _current.get().agent.cancel(context, event_queue)

    async def mcp_config(self, request: Request) -> JSONResponse:
        return await _current.get().agent.mcp_config(request)

    async def agent_config(self, request: Request) -> JSONResponse:
        return await _current.get().agent.agent_config(request)

    async def skill_config(self, request: Request) -> JSONResponse:
        return await _current.get().agent.skill_config(request)

    async def trajectory(self, request: Request) -> JSONResponse:
        return await _current.get().agent.trajectory(request)

    async def triggers(self, request: Request) -> JSONResponse:
        return await _current.get().agent.triggers(request)

    async def triggers_decide(self, request: Request) -> JSONResponse:
        return await _current.get().agent.triggers_decide(request)


async def _tenant_card(_: AgentCard) -> AgentCard:
    return _current.get().card


class AgentHost:
    def __init__(self) -> None:
        self.url = ""
        self.tenants: dict[str, Tenant] = {}
        self._cards: dict[tuple[str, str], tuple[AgentCard, str]] = {}  # by name and description: the card, its JSON

    def set_url(self, url: str) -> None:
        self.url = url

    def app(self):
        control = Starlette(routes=[
            Route("/agents", self.create, methods=["POST"]),
            Route("/agents", self.listing, methods=["GET"]),
            Route("/agents/{agent_id}", self.delete, methods=["DELETE"]),
        ])
        hosted = build_app(HostedAgent(), build_card("hosted-agent", "An agent in an agent host"), _tenant_card)

        async def dispatch(scope, receive, send):
            """``/agents/<id>/...`` goes to that agent, the rest to the control routes."""
            path = scope.get("path", "")
            if scope["type"] == "http" and path.startswith(PREFIX):
                agent_id, _, rest = path[len(PREFIX):].partition("/")
                tenant = self.tenants.get(agent_id)
                if tenant is not None and (rest or scope["method"] != "DELETE"):
                    scope = {**scope, "path": "/" + rest, "root_path": scope.get("root_path", "") + PREFIX + agent_id}
                    token = _current.set(tenant)
                    try:
                        await hosted(scope, receive, send)
                    finally:
                        _current.reset(token)
                    return
            await control(scope, receive, send)

        return dispatch

    async def create(self, request: Request) -> JSONResponse:
        """One agent (``{id, sandbox, config}``, answered 201), or several in one request
        (``{"agents": [...]}``, answered 200 with each one's outcome in order): a dataset run
        deploys its rows' agents in a few requests rather than one a row."""
        body = await request.json()
        if isinstance(body.get("agents"), list):
            return JSONResponse({"agents": [self._add(item) for item in body["agents"]]})
        answer = self._add(body)
        return JSONResponse(answer, status_code=answer.pop("status"))

    def _add(self, body: dict) -> dict:
        """Serve one agent; its answer carries the HTTP status its own request would have had."""
        agent_id, config, sandbox = body.get("id"), body.get("config") or {}, body.get("sandbox")
        if not isinstance(agent_id, str) or not agent_id or "/" in agent_id or not isinstance(sandbox, str):
            return {"status": 400, "error": "an agent needs an 'id' (no '/') and a 'sandbox' folder"}
        if agent_id in self.tenants:
            return {"status": 409, "error": f"agent '{agent_id}' exists"}
        kind = config.get("kind", "")
        try:
            brain = build_brain(kind, config)
        except ValueError as exc:
            return {"status": 400, "error": f"agent config: {exc}"}
        root = Path(sandbox)
        root.mkdir(parents=True, exist_ok=True)
        name, description = config.get("name") or f"{kind}-agent", config.get("description") or f"Embedded {kind} agent"
        template, card_json = self._card(name, description)
        card = AgentCard()
        card.CopyFrom(template)
        url = f"{self.url}{PREFIX}{agent_id}"
        for interface in card.supported_interfaces:
            interface.url = url + "/"
        agent = EmbeddedAgent(brain, LocalSandbox(root.resolve()), config.get("workspace"))
        if config.get("name"):  # its identity from the start, as an agent-config ``name`` would set it
            agent.config["name"] = config["name"]
        self.tenants[agent_id] = Tenant(agent, card)
        # the card comes with the answer: the deployer need not ask for it again
        return {"status": 201, "id": agent_id, "url": url,
                "card": json.loads(card_json.replace(json.dumps(PLACEHOLDER_URL), json.dumps(url + "/")))}

    def _card(self, name: str, description: str) -> tuple[AgentCard, str]:
        """The card for a name and description, and its JSON, built once: building one, and
        a2a's conversion to JSON, validate every proto field, while an agent's copy differs
        only in its URL."""
        key = (name, description)
        if key not in self._cards:
            card = build_card(name, description)
            self._cards[key] = card, json.dumps(agent_card_to_dict(card))
        return self._cards[key]

    async def listing(self, request: Request) -> JSONResponse:
        return JSONResponse({"agents": sorted(self.tenants)})

    async def delete(self, request: Request) -> JSONResponse:
        tenant = self.tenants.pop(request.path_params["agent_id"], None)
        if tenant is None:
            return JSONResponse({"error": "no such agent"}, status_code=404)
        cancelled = tenant.agent.cancel_running()
        return JSONResponse({"deleted": request.path_params["agent_id"], "cancelled_tasks": cancelled})
