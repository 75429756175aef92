"""The agent side of ``urn:agentenv:triggers/v1``: a stakeholder's scripted reactions.

register_agent_triggers gives a user-simulator (stakeholder) agent its triggers. Between the
turns of a multi-turn prompt_agent the run asks it to *decide* (``{turn, solver_message,
context_id, env_triggers}``): every trigger whose ``when`` holds fires, its ``say`` texts become
the user's next message and an ``end`` closes the conversation; when none fires, the run asks
the agent's brain as usual. Deterministic, no model, as upstream's protocol framework:

- ``when``: ``step`` (``turn``, ``cmp`` eq|gte), ``env_trigger`` (an env trigger's ``status``,
  default ``fired``, as the run read it from the env), ``conversational`` (``where.message``
  predicate on what the solver said), ``all`` / ``any`` (``of``);
- ``actions``: ``say`` (``text``), ``end``; ``once`` (default true) fires a trigger once per
  conversation, and a turn at or below the last one decided (a retried span) starts it afresh.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timezone
from typing import Any

from agentenv_dagster.builtin.envs.conditions import TriggerError, check_predicate, holds

__all__ = ["AgentTriggers", "TriggerError"]

WHEN_TYPES = ("step", "env_trigger", "conversational", "all", "any")
ACTION_TYPES = ("say", "end")
MAX_LOG_ENTRIES = 1024


class AgentTriggers:
    """Registered triggers, what fired in each conversation, and the firing log."""

    def __init__(self) -> None:
        self._triggers: dict[str, dict[str, Any]] = {}
        self._fired: dict[str, set[str]] = {}  # context id -> once-triggers already fired
        self._last_turn: dict[str, int] = {}
        self._log: deque[dict[str, Any]] = deque(maxlen=MAX_LOG_ENTRIES)
        self._seq = 0

    def register(self, body: Any) -> dict[str, Any]:
        """Add triggers, all or none: re-adding an identical one is a no-op, a different spec
        under a registered id is refused."""
        triggers = body.get("triggers") if isinstance(body, dict) else None
        if not isinstance(triggers, list) or not triggers:
            raise TriggerError("'triggers' must be a non-empty list")
        specs: dict[str, dict[str, Any]] = {}
        for index, trigger in enumerate(triggers):
            spec = _spec(trigger, index)
            if spec["id"] in specs:
                raise TriggerError(f"duplicate trigger id '{spec['id']}' in this batch")
            if self._triggers.get(spec["id"], spec) != spec:
                raise TriggerError(f"trigger '{spec['id']}' already registered with a different spec (use a new id)")
            specs[spec["id"]] = spec
        self._triggers.update(specs)
        self._emit("registered", added=list(specs))
        return {"ok": True, "added": list(specs), "all": list(self._triggers)}

    def decide(self, body: Any) -> dict[str, Any]:
        body = body if isinstance(body, dict) else {}
        turn, message = body.get("turn"), body.get("solver_message", "")
        context_id, env_triggers = body.get("context_id", "default"), body.get("env_triggers")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 1:
            raise TriggerError("decide: 'turn' must be a positive integer")
        if not isinstance(context_id, str) or not context_id:
            raise TriggerError("decide: 'context_id' must be a non-empty string")
        if not isinstance(message, str):
            raise TriggerError("decide: 'solver_message' must be a string")
        envs = env_triggers if isinstance(env_triggers, dict) else {}
        if turn <= self._last_turn.get(context_id, 0):
            self._fired.pop(context_id, None)
            self._emit("reset", context_id=context_id, turn=turn)
        self._last_turn[context_id] = turn
        fired_before = self._fired.setdefault(context_id, set())
        fired, texts, done = [], [], False
        for tid, spec in self._triggers.items():
            if spec["once"] and tid in fired_before or not _holds(spec["when"], turn, message, envs):
                continue
            fired.append(tid)
            texts += [a["text"] for a in spec["actions"] if a["type"] == "say"]
            done = done or any(a["type"] == "end" for a in spec["actions"])
        for tid in fired:
            fired_before.add(tid)
            self._emit("fired", trigger_id=tid, turn=turn, context_id=context_id)
        return {"parts": [{"kind": "text", "text": "\n".join(texts)}] if texts else [], "done": done, "fired": fired}

    def state(self) -> dict[str, Any]:
        return {
            "triggers": [{"id": tid, "when_type": s["when"]["type"], "once": s["once"]}
                         for tid, s in self._triggers.items()],
            "firing_log": list(self._log),
        }

    def _emit(self, kind: str, **fields: Any) -> None:
        self._seq += 1
        self._log.append({"seq": self._seq, "ts": datetime.now(timezone.utc).isoformat(), "kind": kind, **fields})


def _spec(trigger: Any, index: int) -> dict[str, Any]:
    if not isinstance(trigger, dict):
        raise TriggerError(f"trigger[{index}] must be an object")
    tid = trigger.get("id")
    if not isinstance(tid, str) or not tid:
        raise TriggerError(f"trigger[{index}].id must be a non-empty string")
    once = trigger.get("once", True)
    if not isinstance(once, bool):
        raise TriggerError(f"trigger '{tid}'.once must be a boolean")
    actions = trigger.get("actions")
    if not isinstance(actions, list) or not actions:
        raise TriggerError(f"trigger '{tid}'.actions must be a non-empty list")
    return {"id": tid, "once": once, "when": _when(trigger.get("when"), tid),
            "actions": [_action(a, tid) for a in actions]}


def _when(when: Any, tid: str) -> dict[str, Any]:
    """The condition with its defaults filled in; TriggerError naming the trigger otherwise."""
    if not isinstance(when, dict) or "type" not in when:
        raise TriggerError(f"trigger '{tid}': 'when' must be an object with a 'type'")
    kind = when["type"]
    if kind == "step":
        turn, cmp = when.get("turn", 1), when.get("cmp", "eq")
        if isinstance(turn, bool) or not isinstance(turn, int) or turn < 1:
            raise TriggerError(f"trigger '{tid}': step.turn must be a positive integer")
        if cmp not in ("eq", "gte"):
            raise TriggerError(f"trigger '{tid}': step.cmp must be 'eq' or 'gte'")
        return {"type": kind, "turn": turn, "cmp": cmp}
    if kind == "env_trigger":
        fields = {"env_id": when.get("env_id"), "trigger_id": when.get("trigger_id"),
                  "status": when.get("status", "fired")}
        for name, value in fields.items():
            if not isinstance(value, str) or not value:
                raise TriggerError(f"trigger '{tid}': env_trigger.{name} must be a non-empty string")
        return {"type": kind, **fields}
    if kind == "conversational":
        where = when.get("where")
        if not isinstance(where, dict) or not where:
            raise TriggerError(f"trigger '{tid}': conversational.where must be a non-empty object")
        for field, predicate in where.items():
            if field != "message":
                raise TriggerError(f"trigger '{tid}': conversational.where field {field!r} not in ('message',)")
            check_predicate(predicate, f"trigger '{tid}': where.{field}")
        return {"type": kind, "where": where}
    if kind in ("all", "any"):
        of = when.get("of")
        if not isinstance(of, list) or not of:
            raise TriggerError(f"trigger '{tid}': {kind}.of must be a non-empty list")
        return {"type": kind, "of": [_when(sub, tid) for sub in of]}
    raise TriggerError(f"trigger '{tid}': unknown when.type {kind!r} (known: {', '.join(WHEN_TYPES)})")


def _action(action: Any, tid: str) -> dict[str, Any]:
    if not isinstance(action, dict) or action.get("type") not in ACTION_TYPES:
        raise TriggerError(f"trigger '{tid}': each action must be an object with a 'type' in {ACTION_TYPES}")
    if action["type"] == "end":
        return {"type": "end"}
    if not isinstance(action.get("text"), str) or not action["text"]:
        raise TriggerError(f"trigger '{tid}': say.text must be a non-empty string")
    return {"type": "say", "text": action["text"]}


def _holds(when: dict[str, Any], turn: int, message: str, envs: dict[str, Any]) -> bool:
    kind = when["type"]
    if kind == "step":
        return turn == when["turn"] if when["cmp"] == "eq" else turn >= when["turn"]
    if kind == "env_trigger":
        statuses = envs.get(when["env_id"])
        return isinstance(statuses, dict) and statuses.get(when["trigger_id"]) == when["status"]
    if kind == "conversational":
        return all(holds(predicate, message) for predicate in when["where"].values())
    branches = (_holds(sub, turn, message, envs) for sub in when["of"])
    return all(branches) if kind == "all" else any(branches)
