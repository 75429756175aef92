"""Model clients: one Messages-API-shaped request and reply for every provider, through its own SDK.

Callers (judges, the judge agent, the tool-use agent) send a system prompt, messages of text or ``text``/
``tool_use``/``tool_result`` blocks, tools with an ``input_schema`` and ``tool_choice``. ``protocol = "anthropic"``
sends them as they are through ``anthropic``; ``protocol = "openai"`` translates them to Chat Completions through
``openai`` (OpenAI, LiteLLM, vLLM, Ollama). A forced tool is a forced call, or with ``verdict = "json_schema"`` a
response in the tool's schema read as the call's input; nothing else in a reply ever stands for a tool call. A
reply the SDK cannot read is :class:`UnreadableReply`, which callers grade as a missing verdict, never a failed step.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import ResolvedModel

RETRYABLE_STATUS = frozenset({408, 409, 429})  # with every 5xx: what the SDKs themselves retry
STOP_REASONS = {"tool_calls": "tool_use", "function_call": "tool_use", "stop": "end_turn", "length": "max_tokens",
                "content_filter": "refusal"}


class ModelAPIError(RuntimeError):
    """The API refused or failed the call past the SDK's retries (``retryable``: another attempt may help)."""

    def __init__(self, message: str, *, status: int | None = None, kind: str = "", detail: str = "",
                 retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.detail = detail or message
        self.retryable = retryable


class UnreadableReply(ValueError):
    """The API answered, but its reply cannot be read (too deep, numbers too long, not JSON)."""


class MissingKey(RuntimeError):
    """The model's provider lacks a setting it needs (a key, a base URL); the message says which."""


@dataclass
class TextBlock:
    text: str
    type: str = "text"

    def model_dump(self, exclude_none: bool = True) -> dict[str, Any]:
        return {"type": self.type, "text": self.text}


@dataclass
class ToolUseBlock:
    id: str
    name: str
    input: Any
    type: str = "tool_use"

    def model_dump(self, exclude_none: bool = True) -> dict[str, Any]:
        return {"type": self.type, "id": self.id, "name": self.name, "input": self.input}


@dataclass
class Usage:
    input_tokens: int = 0  # uncached input
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


@dataclass
class ModelReply:
    content: list[TextBlock | ToolUseBlock]
    stop_reason: str | None
    usage: Usage = field(default_factory=Usage)

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.content if b.type == "text")

    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if b.type == "tool_use"]


class ModelClient(contextlib.AbstractAsyncContextManager):
    """One provider's SDK client for ``model``; ``create`` takes a Messages-shaped request. Close it after use."""

    sdk = ("", "")  # the SDK's module and client class, imported when a model is used: most runs never load one
    api, host, reply = "", "", ""  # how messages name the API, its default host and its reply
    bare_errors = False  # whether an error body without an ``error`` object is the error itself

    def __init__(self, model: ResolvedModel, *, api_key: str | None = None, base_url: str | None = None,
                 max_retries: int = 2) -> None:
        if missing := model.missing_setting(api_key, base_url):
            raise MissingKey(missing)
        self.model = model
        self.base_url = base_url or model.base_url()
        module, client_class = self.sdk
        self._sdk = importlib.import_module(module)
        self._client = getattr(self._sdk, client_class)(api_key=api_key or model.api_key() or "unused",
                                                         base_url=self.base_url, max_retries=max_retries)

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def create(self, *, messages: list[dict[str, Any]], max_tokens: int, system: str | None = None,
                     tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
                     **params: Any) -> ModelReply:
        raise NotImplementedError

    async def _send(self, create: Any, request: dict[str, Any]) -> Any:
        """``create(**request)``; what fails past the SDK's retries is a ModelAPIError, a bad reply UnreadableReply."""
        try:
            return await create(**request)
        except self._sdk.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body["error"] if isinstance(body.get("error"), dict) else body if self.bare_errors else {}
            kind = str(error.get("type") or error.get("code") or type(exc).__name__)
            status, detail = exc.status_code, _excerpt(error.get("message") or exc, 2000)
            raise ModelAPIError(f"{self.api} error {status} ({kind}): {detail}", status=status, kind=kind,
                                detail=detail, retryable=status in RETRYABLE_STATUS or status >= 500) from exc
        except self._sdk.APIConnectionError as exc:
            unreachable = f"{self.api} unreachable at {self.base_url or self.host}: {exc}"
            raise ModelAPIError(unreachable, retryable=True) from exc
        except (RecursionError, ValueError) as exc:
            raise UnreadableReply(f"the {self.reply} could not be read: {_excerpt(exc)}") from None


class AnthropicModel(ModelClient):
    """The Messages API, through ``anthropic``."""

    sdk = ("anthropic", "AsyncAnthropic")
    api, host, reply = "Messages API", "api.anthropic.com", "Messages API reply"

    async def create(self, *, messages, max_tokens, system=None, tools=None, tool_choice=None, **params) -> ModelReply:
        request: dict[str, Any] = {"model": self.model.name, "messages": messages, "max_tokens": max_tokens, **params}
        request.update({k: v for k, v in (("system", system), ("tools", tools), ("tool_choice", tool_choice)) if v})
        message = await self._send(self._client.messages.create, request)
        content = [ToolUseBlock(b.id, b.name, b.input) if b.type == "tool_use" else TextBlock(b.text)
                   for b in message.content if b.type in ("tool_use", "text")]
        usage = Usage(**{bucket.name: getattr(message.usage, bucket.name, 0) or 0 for bucket in fields(Usage)})
        return ModelReply(content, message.stop_reason, usage)


class ChatCompletionsModel(ModelClient):
    """Chat Completions, through ``openai``: the request translated, the reply read back."""

    sdk = ("openai", "AsyncOpenAI")
    api, host, reply = "Chat Completions API", "api.openai.com", "Chat Completions reply"
    bare_errors = True  # servers other than OpenAI's may answer {"message": …} alone

    async def create(self, *, messages, max_tokens, system=None, tools=None, tool_choice=None, **params) -> ModelReply:
        forced = (tool_choice or {}).get("type") == "tool"
        as_schema = forced and self.model.settings.verdict == "json_schema"
        request: dict[str, Any] = {"model": self.model.name, "messages": chat_messages(system, messages),
                                   self.model.settings.max_tokens_param: max_tokens, **params}
        if as_schema:
            tool = next((t for t in tools or [] if t["name"] == tool_choice["name"]), None)
            if tool is None:
                raise ValueError(f"tool_choice names '{tool_choice['name']}', which is not among the tools")
            request["response_format"] = {"type": "json_schema", "json_schema": {
                "name": tool["name"], "description": tool.get("description", ""), "schema": tool["input_schema"]}}
        elif tools:
            request["tools"] = [{"type": "function", "function": {
                "name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}}
                for t in tools]
            if forced:
                request["tool_choice"] = {"type": "function", "function": {"name": tool_choice["name"]}}
            elif tool_choice:
                request["tool_choice"] = {"any": "required"}.get(tool_choice.get("type"), "auto")
        completion = await self._send(self._client.chat.completions.create, request)
        if not completion.choices:
            raise UnreadableReply(f"the {self.reply} has no choices")
        choice = completion.choices[0]
        text = choice.message.content or ""
        if as_schema:  # the schema-constrained response is the forced call's input, whole
            call = ToolUseBlock(f"call_{completion.id}", tool_choice["name"], _json_or_text(text))
            return ModelReply([call], "tool_use", chat_usage(completion.usage))
        calls = [c for c in choice.message.tool_calls or [] if getattr(c, "function", None) is not None]
        content = ([TextBlock(text)] if text else []) + [
            ToolUseBlock(c.id, c.function.name, _json_or_text(c.function.arguments)) for c in calls]
        stop_reason = STOP_REASONS.get(choice.finish_reason or "", choice.finish_reason)
        return ModelReply(content, stop_reason, chat_usage(completion.usage))


def model_client(model: ResolvedModel, **options: Any) -> ModelClient:
    """The client for ``model``'s protocol (``MissingKey`` when its provider has no key)."""
    return (AnthropicModel if model.protocol == "anthropic" else ChatCompletionsModel)(model, **options)


def chat_messages(system: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages-API messages as Chat Completions messages: the system prompt first, a tool_use
    block as an assistant ``tool_calls`` entry, a tool_result block as a ``tool`` message."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            chat.append({"role": message["role"], "content": content})
            continue
        blocks = [b if isinstance(b, dict) else b.model_dump() for b in content]
        texts = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        if message["role"] == "assistant":
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": json.dumps(b.get("input") or {})}}
                     for b in blocks if b.get("type") == "tool_use"]
            chat.append({"role": "assistant", "content": texts or None, **({"tool_calls": calls} if calls else {})})
            continue
        chat += [{"role": "tool", "tool_call_id": block["tool_use_id"], "content": _result_text(block.get("content"))}
                 for block in blocks if block.get("type") == "tool_result"]
        if texts:
            chat.append({"role": "user", "content": texts})
    return chat


def chat_usage(usage: Any) -> Usage:
    """Chat Completions usage in the Messages buckets: cached prompt tokens are cache reads."""
    if usage is None:
        return Usage()
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", 0) or 0
    return Usage(input_tokens=max((usage.prompt_tokens or 0) - cached, 0), output_tokens=usage.completion_tokens or 0,
                 cache_read_input_tokens=cached)


def _result_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else str(content)


def _json_or_text(text: str | None) -> Any:
    """A tool call's arguments: their JSON, else the text as given (no schema accepts it, so the caller reports it)."""
    try:
        return json.loads(text or "")
    except (ValueError, RecursionError):
        return text


def _excerpt(value: Any, limit: int = 300) -> str:
    """A short, safe excerpt of anything (a huge integer's str may itself raise)."""
    try:
        text = str(value)
    except (ValueError, RecursionError):
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more characters]"
