"""The live agent: a tool-use loop over the registered MCP tools, on the model of any provider
(``runtime.models``: the Messages API for Anthropic's models, Chat Completions for OpenAI's,
a LiteLLM proxy's, vLLM's or Ollama's). The ``anthropic`` agent kind is this agent, whatever
its model.

In an agent host the model API's key and base URL are the host's (``model_access.py``: handed
on its standard input, bound together); an agent started on its own reads its provider's key
from its environment (``model_key_env``: for example ``ANTHROPIC_API_KEY`` or
``OPENAI_API_KEY``). Never argv or a file, so the key never shows in a process list or a task
document. Model, ``base_url`` and the providers come from the config file, and agent-config
may override the model, system prompt, turn cap and params.

Tasks of one A2A context are one conversation: each prompt continues the messages of the
context's earlier tasks, so a multi-turn ``prompt_agent`` (and a user simulator, whose
persona is its system prompt) talks to a model that remembers the dialog.

Config file::

    {"name": "anthropic-agent", "model": "claude-... | openai/gpt-...", "base_url": null,
     "providers": {"openai": {"protocol": "openai", "base_url": ..., "api_key": "env:OPENAI_API_KEY"}},
     "max_tokens": 4096, "max_turns": 20, "system_prompt": "", "model_params": {}}
"""

from __future__ import annotations

from dataclasses import asdict

from agentenv_dagster.builtin.agents.model_access import MODELS
from agentenv_dagster.builtin.agents.server import AgentFailure, Reply, TaskSession
from agentenv_dagster.config import ModelConfig, ResolvedModel, model_key_env
from agentenv_dagster.runtime.models import ModelAPIError, ModelReply, UnreadableReply, model_client

RESERVED_PARAMS = frozenset({"model", "messages", "system", "tools"})


class AnthropicBrain:
    def __init__(self, config: dict) -> None:
        self.model = config.get("model")
        self.models = ModelConfig(base_url=config.get("base_url"), providers=config.get("providers") or {})
        self.system_prompt = config.get("system_prompt") or ""
        self.max_turns = int(config.get("max_turns", 20))
        self.params = {"max_tokens": int(config.get("max_tokens", 4096)),
                       **config.get("model_params", {})}
        self.conversations: dict[str, list[dict]] = {}  # A2A context id -> its messages so far

    async def run(self, prompt: str, session: TaskSession) -> Reply:
        params = self._request_params(session)
        model, given = self._model(session.model)
        max_turns = int(session.config.get("max_turns") or self.max_turns)
        history = self.conversations.get(session.context_id or "", [])
        messages: list[dict] = [*history, {"role": "user", "content": prompt}]
        async with model_client(model, max_retries=2, **given) as client:
            for _ in range(max_turns):
                session.turn_started()
                response = await _create(client, messages, params)
                for bucket, tokens in asdict(response.usage).items():  # cache reads too (OpenAI caches unasked)
                    session.usage[bucket] = session.usage.get(bucket, 0) + tokens
                text = response.text
                calls = response.tool_uses()
                if response.stop_reason != "tool_use" or not calls:
                    self._remember(session, messages, text)
                    return Reply(text)
                if text:
                    session.record_message("assistant", text)
                messages.append({"role": "assistant", "content": [b.model_dump() for b in response.content]})
                results = []
                for call in calls:
                    outcome = await session.call_tool(call.name, call.input)
                    results.append({"type": "tool_result", "tool_use_id": call.id,
                                    "is_error": outcome.is_error,
                                    **({"content": outcome.text} if outcome.text else {})})
                messages.append({"role": "user", "content": results})
        raise AgentFailure("MaxTurnsExceeded", f"no final reply within max_turns={max_turns}")

    def _model(self, ref: str) -> tuple[ResolvedModel, dict[str, str]]:
        """The session's model, and the key and base URL to call it with: its host's (handed
        on the host's standard input), else its provider's key in this process's environment."""
        try:
            model = self.models.resolve(ref)
        except ValueError as exc:
            raise AgentFailure("InvalidModel", str(exc)) from None
        access = MODELS.access(model.provider)
        if access is not None:
            return model, {"api_key": access.api_key, "base_url": access.base_url}
        if model.missing_setting():
            variable = model_key_env(model.provider)
            raise AgentFailure("MissingAPIKey", f"{variable} is not set in the agent's environment; the agent reads "
                               f"the key of model '{ref}' only from there")
        return model, {}

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
        system = _system_prompt(settings.get("system_prompt") or self.system_prompt, session.skills)
        if system:
            params["system"] = system
        if session.tools:
            params["tools"] = [{"name": t.name, "description": t.description,
                                "input_schema": t.input_schema} for t in session.tools]
        return params


async def _create(client, messages: list[dict], params: dict) -> ModelReply:
    """One request; what the SDK's own retries (429, 5xx, connection) leave, and a request
    the API refuses (4xx), fail the task as ``ModelAPIError`` with the API's own words."""
    try:
        return await client.create(messages=messages, **params)
    except ModelAPIError as exc:
        raise AgentFailure("ModelAPIError", str(exc)) from exc
    except UnreadableReply as exc:
        raise AgentFailure("ModelAPIError", str(exc)) from exc


def _system_prompt(base: str, skills: list[dict]) -> str:
    """Skills are offered to the model as sections appended to the system prompt."""
    sections = [base] if base else []
    sections += [f"# Skill: {s['name']}\n{s['description']}\n\n{s['skill_md']}" for s in skills]
    return "\n\n".join(sections)
