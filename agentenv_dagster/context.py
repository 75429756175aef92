"""TaskStepContext: what steps publish for later steps, and how branches are merged.

agent-env threads one mutable object through every step; here each step receives the merge
of its ancestors' contexts, so what a step sees is decided by its dependency ancestry alone.
Records keep unknown keys so a saved context from agent-env round-trips.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_json

from .redaction import REDACTED, SECRET_KEYS, needs_redaction, redact, redacted_json

__all__ = ["REDACTED", "SECRET_KEYS", "redact", "redacted_json"]  # redaction's names, where contexts are



class _Record(BaseModel):
    model_config = ConfigDict(extra="allow")


class DeployedEnv(_Record):
    env_id: str
    env_version: str | int | None = None
    env_provider_type: str | None = None
    mcp_url: str | None = None
    mcp_server_name: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    instance_id: str | None = None
    created_at_utc: str | None = None
    expires_at_utc: str | None = None


class DeployedAgent(_Record):
    agent_name: str
    api_url: str
    a2a_url: str | None = None
    a2a_card: dict[str, Any] | None = None
    sandbox_id: str | None = None
    sandbox_type: str | None = None
    instance_id: str | None = None
    role: str | None = None
    on_host: bool = False


class DeployedSandbox(_Record):
    sandbox_name: str
    sandbox_mode: str
    sandbox_id: str | None = None
    sandbox_type: str | None = None
    instance_id: str | None = None
    created_at_utc: str | None = None
    expires_at_utc: str | None = None


class PromptResponse(_Record):
    prompt_id: str
    response: str
    prompt_text: str | None = None
    agent_trajectory_object_url: str | None = None
    tool_call_count: int | None = None
    model: str | None = None
    error_type: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    agent_session_id: str = ""
    a2a_context_id: str | None = None
    agent_name: str | None = None
    step_id: str | None = None
    structured_output: Any = None


class TaskStepContext(BaseModel):
    """The run's shared record: deployments, responses and free-form metadata."""

    model_config = ConfigDict(extra="allow")

    deployed_envs: list[DeployedEnv] = Field(default_factory=list)
    deployed_agents: list[DeployedAgent] = Field(default_factory=list)
    deployed_sandboxes: list[DeployedSandbox] = Field(default_factory=list)
    prompt_responses: list[PromptResponse] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    agent_model: str | None = None
    default_agent_model: str | None = None
    agent_artifact_id: str | None = None
    agent_harness: str | None = None
    instance_id: str | None = None

    # -- lookups (first match, as agent-env's next(...)) -----------------------------------
    def find_env(self, env_id: str) -> DeployedEnv | None:
        return next((e for e in self.deployed_envs if e.env_id == env_id), None)

    def find_agent(self, agent_name: str) -> DeployedAgent | None:
        return next((a for a in self.deployed_agents if a.agent_name == agent_name), None)

    def find_prompt_response(self, prompt_id: str) -> PromptResponse | None:
        return next((p for p in self.prompt_responses if p.prompt_id == prompt_id), None)

    def failure_of(self, step_type: str) -> dict[str, Any] | None:
        """The first failure a step of ``step_type`` recorded in ``failed_steps`` (this
        attempt's: not one a retry rolled back), if one failed."""
        return next((f for f in self.metadata.get("failed_steps") or []
                     if f.get("step_type") == step_type and not f.get("retried")), None)

    def find_sandbox(self, sandbox_name: str) -> DeployedSandbox | None:
        return next((s for s in self.deployed_sandboxes if s.sandbox_name == sandbox_name), None)

    def metadata_map(self, key: str) -> dict[str, Any]:
        """A dict-valued metadata key, created on first use."""
        return self.metadata.setdefault(key, {})

    def metadata_list(self, key: str) -> list[Any]:
        """A list-valued metadata key, created on first use."""
        return self.metadata.setdefault(key, [])

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_safe_dict(self) -> dict[str, Any]:
        """The context redacted (``redaction.py``): what leaves the process."""
        data = self.to_dict()
        return redact(data) if needs_redaction(to_json(data, fallback=str)) else data

    def scrub_secret_values(self) -> None:
        """Replace, in place, every known secret value found outside a secret-named key (an
        agent's reply or a command's output that echoed a key) with ``***``, so what a step
        recorded is safe to report as it is. Values under secret-named keys (a ``-D``
        password the run still needs) stay, and are remembered as secrets."""
        data = self.to_dict()
        if not needs_redaction(to_json(data, fallback=str)):
            return
        scrubbed = redact(data, keep_secret_keys=True)
        if scrubbed != data:
            clean = type(self).from_dict(scrubbed)
            for name in type(self).model_fields:
                setattr(self, name, getattr(clean, name))
            self.__pydantic_extra__ = clean.__pydantic_extra__

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "TaskStepContext":
        return cls.model_validate(data or {})

    @classmethod
    def merge(cls, contexts: Iterable["TaskStepContext"]) -> "TaskStepContext":
        """Merge ancestor contexts: list items de-duplicated by value, metadata deep-merged,
        scalars first-set-wins (the order given is dependency order)."""
        return cls.merge_dicts(ctx.to_dict() for ctx in contexts)

    @classmethod
    def merge_dicts(cls, contexts: Iterable[dict[str, Any]]) -> "TaskStepContext":
        """:meth:`merge` of stored (dict) contexts; one alone is read as it is. The merge
        shares the parts it does not change with its inputs (copying a dict or a list only
        where a later context adds to it), and changes no input."""
        contexts = list(contexts)
        if len(contexts) == 1:
            return cls.from_dict(contexts[0])
        merged: dict[str, Any] = {}
        for ctx in contexts:
            _merge_into(merged, ctx)
        return cls.from_dict(merged)


def _merge_into(target: dict[str, Any], source: dict[str, Any]) -> None:
    for key, value in source.items():
        if key not in target or target[key] is None:
            target[key] = value
        elif isinstance(target[key], dict) and isinstance(value, dict):
            if target[key] is not value:
                target[key] = dict(target[key])  # the first source's own dict stays as it was
                _merge_into(target[key], value)
        elif isinstance(target[key], list) and isinstance(value, list):
            seen = {_identity(item) for item in target[key]}
            added = [item for item in value if _identity(item) not in seen and not seen.add(_identity(item))]
            if added:
                target[key] = [*target[key], *added]


def _identity(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)
