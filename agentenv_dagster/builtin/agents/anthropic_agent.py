"""The live agent: an Anthropic Messages API tool-use loop over the registered MCP tools.

In an agent host the API key and its base URL are the host's (``model_access.py``: handed on
its standard input, bound together); an agent started on its own reads ``ANTHROPIC_API_KEY``
and its config's ``base_url``. Never argv or a file, so the key never shows in a process list
or a task document. Model and params come from the config, and agent-config may override the
model, system prompt, turn cap and params.

Tasks of one A2A context are one conversation: each prompt continues the messages of the
context's earlier tasks, so a multi-turn ``prompt_agent`` (and a user simulator, whose
persona is its system prompt) talks to a model that remembers the dialog.

Config file::

    {"name": "anthropic-agent", "model": "claude-...", "base_url": null,
     "max_tokens": 4096, "max_turns": 20, "system_prompt": "", "model_params": {}}
"""

from __future__ import annotations

import os

from agentenv_dagster.builtin.agents.model_access import MODELS
from agentenv_dagster.builtin.agents.server import AgentFailure, Reply, TaskSession

RESERVED_PARAMS = frozenset({"model", "messages", "system", "tools"})


class AnthropicBrain:
    def __init__(self, config: dict) -> None:
        self.model = config.get("model")
        self.base_url = config.get("base_url")
        self.system_prompt = config.get("system_prompt") or ""
        self.max_turns = int(config.get("max_turns", 20))
        self.params = {"max_tokens": int(config.get("max_tokens", 4096)),
                       **config.get("model_params", {})}
        self.conversations: dict[str, list[dict]] = {}  # A2A context id -> its messages so far

    async def run(self, prompt: str, session: TaskSession) -> Reply:
        access = MODELS.access("anthropic")
        api_key, base_url = (access.api_key, access.base_url) if access else (os.environ.get("ANTHROPIC_API_KEY"), self.base_url)
        if not api_key:
            raise AgentFailure(
                "MissingAPIKey",
                "ANTHROPIC_API_KEY is not set in the agent's environment; the anthropic "
                "agent reads its key only from there",
            )
        import anthropic  # imported here: the replay agent never pays for it

        params = self._request_params(session)
        max_turns = int(session.config.get("max_turns") or self.max_turns)
        history = self.conversations.get(session.context_id or "", [])
        messages: list[dict] = [*history, {"role": "user", "content": prompt}]
        client = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, max_retries=2)
        async with client:
            for _ in range(max_turns):
                session.turn_started()
                response = await _create(client, messages, params)
                session.usage["input_tokens"] += response.usage.input_tokens
                session.usage["output_tokens"] += response.usage.output_tokens
                text = "".join(b.text for b in response.content if b.type == "text")
                calls = [b for b in response.content if b.type == "tool_use"]
                if response.stop_reason != "tool_use" or not calls:
                    self._remember(session, messages, text)
                    return Reply(text)
                if text:
                    session.record_message("assistant", text)
                messages.append({"role": "assistant", "content": response.content})
                results = []
                for call in calls:
                    outcome = await session.call_tool(call.name, call.input)
                    results.append({"type": "tool_result", "tool_use_id": call.id,
                                    "is_error": outcome.is_error,
                                    **({"content": outcome.text} if outcome.text else {})})
                messages.append({"role": "user", "content": results})
        raise AgentFailure("MaxTurnsExceeded", f"no final reply within max_turns={max_turns}")

    def _remember(self, session: TaskSession, messages: list[dict], reply: str) -> None:
        """Keep the finished turn for the context's next task (a failed turn is forgotten)."""
        if session.context_id:
            self.conversations[session.context_id] = [
                *messages, {"role": "assistant", "content": [{"type": "text", "text": reply or "(no reply)"}]}]

    def _request_params(self, session: TaskSession) -> dict:
        """Model, system prompt, tools and params of every request; agent-config wins over
        the config file."""
        settings = session.config
        session.model = settings.get("model") or self.model or ""
        if not session.model:
            raise AgentFailure("NoModel", "no model in the agent config file or agent-config")
        params = {**self.params, **settings.get("model_params", {})}
        if reserved := sorted(RESERVED_PARAMS & params.keys()):
            raise AgentFailure("InvalidModelParams", f"model_params may not set {reserved}")
        params["model"] = session.model
        system = _system_prompt(settings.get("system_prompt") or self.system_prompt, session.skills)
        if system:
            params["system"] = system
        if session.tools:
            params["tools"] = [{"name": t.name, "description": t.description,
                                "input_schema": t.input_schema} for t in session.tools]
        return params


async def _create(client, messages: list[dict], params: dict):
    """One request; what the SDK's own retries (429, 5xx, connection) leave, and a request
    the API refuses (4xx), fail the task as ``ModelAPIError`` with the API's own words."""
    import anthropic

    try:
        return await client.messages.create(messages=messages, **params)
    except anthropic.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error") if isinstance(body.get("error"), dict) else {}
        raise AgentFailure("ModelAPIError", f"Messages API error {exc.status_code} "
                           f"({error.get('type') or type(exc).__name__}): {error.get('message') or exc}") from exc
    except anthropic.APIConnectionError as exc:
        raise AgentFailure("ModelAPIError", f"Messages API unreachable: {exc}") from exc


def _system_prompt(base: str, skills: list[dict]) -> str:
    """Skills are offered to the model as sections appended to the system prompt."""
    sections = [base] if base else []
    sections += [f"# Skill: {s['name']}\n{s['description']}\n\n{s['skill_md']}" for s in skills]
    return "\n\n".join(sections)
