"""An env's triggers (``urn:agentenv:triggers/v1``): conditions on the env that run actions.

A trigger is ``{"id", "when", "actions"}``, as agent-env's gateway takes them:

- ``when.type == "action"``: a watched tool call (``tool``, optional ``where`` predicates on
  ``args.<path>`` / ``result.<path>``, ``repeat``);
- ``when.type == "state"``: a ``check`` pipeline of tool reads whose last step's ``predicate``
  holds. It is evaluated after every watched tool call and after every ``data/add`` (new data,
  such as an arriving email, is a change of state too);
- ``when.type == "time"``: the virtual clock reaches ``at`` (RFC3339, or a duration after the
  clock's t0), optionally recurring ``every`` duration up to ``count`` times.

Actions are ``nl`` (the instruction is sent over A2A to the registered executor agent, which
acts through the env's own MCP tools) or ``tool`` (the env calls one of its tools, with
``${args.x}`` / ``${result.x}`` placeholders from the provoking call). Calls carry their role in
the ``AgentEnv-Role`` header (``default`` without one); only ``watch_roles`` are watched and the
executor's own calls never are, so an executor cannot set off a cascade. Firing runs in the
background: a fire never fails the call that provoked it, it is recorded in the firing log.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import uuid
from collections import deque
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

import httpx

from agentenv_dagster.runtime.a2a_client import A2AClient

from .clock import ClockError, VirtualClock, iso, parse_duration
from .conditions import (
    PLACEHOLDER, TriggerError, check_pipeline, check_predicate, extract, fill, holds, lookup, time_mark,
)

ROLE_HEADER = "AgentEnv-Role"
DEFAULT_ROLE = "default"
STATUSES = ("armed", "firing", "queued", "fired", "failed")
IN_FLIGHT = ("firing", "queued")
ACTION_TYPES = ("nl", "tool")
WHEN_TYPES = ("action", "state", "time")
EVENT_KINDS = frozenset({"added", "removed", "detected", "action_ok", "action_failed", "fired", "failed",
                         "eval_error"})
MAX_EVENTS = 5000
DRIVER_INTERVAL_S = 0.2  # real seconds between time-trigger polls while one is armed
_WHEN_SUMMARY = ("type", "tool", "repeat", "at", "every", "count")

# (tool name, arguments) -> (is_error, parsed result, text) for the env's own tools
InternalCall = Callable[[str, dict], Awaitable[tuple[bool, Any, str]]]


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat()


class TriggerEngine:
    def __init__(self, clock: VirtualClock, call: InternalCall, tool_names: Callable[[], set[str]]) -> None:
        self.clock = clock
        self._call = call
        self._tool_names = tool_names
        self._triggers: dict[str, dict[str, Any]] = {}
        self._events: deque[dict[str, Any]] = deque(maxlen=MAX_EVENTS)
        self._seq = 0
        self._watch_roles: set[str] = {DEFAULT_ROLE}
        self._executor: dict[str, Any] | None = None
        self._configured = False
        self._tasks: set[asyncio.Task] = set()
        self._driver: asyncio.Task | None = None

    # -- registration ----------------------------------------------------------------------
    def register(self, body: Any) -> dict[str, Any]:
        """Add triggers by id, all or none: an identical re-add is a no-op, a different spec
        under a known id is refused. ``watch_roles`` and ``executor`` are set once."""
        if not isinstance(body, dict):
            raise TriggerError("body must be a JSON object")
        watch_roles = self._watch_roles_of(body)
        executor = self._executor_of(body, watch_roles)
        triggers = body.get("triggers")
        if not isinstance(triggers, list):
            raise TriggerError("triggers must be a list")
        batch: list[str] = []
        to_add: list[dict[str, Any]] = []
        for raw in triggers:
            if not isinstance(raw, dict):
                raise TriggerError("every trigger needs a non-empty string id")
            spec = copy.deepcopy(raw)
            tid = spec.setdefault("id", f"trg_{uuid.uuid4().hex[:12]}")
            if not isinstance(tid, str) or not tid:
                raise TriggerError("every trigger needs a non-empty string id")
            if tid in batch:
                raise TriggerError(f"trigger '{tid}': duplicate id")
            batch.append(tid)
            self._validate(spec, executor)
            existing = self._triggers.get(tid)
            if existing is not None:
                if existing["spec"] != spec:
                    raise TriggerError(f"trigger '{tid}': already registered with a different spec — "
                                       "remove it first or use a new id")
                continue
            to_add.append(spec)
        self._watch_roles, self._executor, self._configured = watch_roles, executor, True
        for spec in to_add:
            self._triggers[spec["id"]] = {
                "spec": spec, "status": "armed", "detected_at": None, "fired_at": None, "fire_count": 0,
                "failure_count": 0, "last_failure_at": None, "pending": deque(), "next_mark": None,
                "mark_generation": None, "evaluating": False, "recheck": None,
            }
            self._emit("added", spec["id"])
        if any(spec["when"]["type"] == "time" for spec in to_add):
            self._start_driver()
        return {"ok": True, "added": batch, "all": list(self._triggers)}

    def remove(self, body: Any) -> dict[str, Any]:
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise TriggerError("ids must be a list of non-empty strings")
        removed = [tid for tid in ids if self._triggers.pop(tid, None) is not None]
        for tid in removed:
            self._emit("removed", tid)
        return {"ok": True, "removed": removed}

    def clear(self) -> dict[str, Any]:
        """Everything back to a fresh env: triggers, config and the firing log."""
        for task in list(self._tasks):
            task.cancel()
        self._triggers.clear()
        self._events.clear()
        self._seq = 0
        self._watch_roles, self._executor, self._configured = {DEFAULT_ROLE}, None, False
        return {"ok": True}

    def state(self) -> dict[str, Any]:
        return {
            "config": {"watch_roles": sorted(self._watch_roles), "executor_configured": self._executor is not None},
            "triggers": [
                {"id": tid, "type": t["spec"]["when"]["type"],
                 "when": {k: t["spec"]["when"][k] for k in _WHEN_SUMMARY if k in t["spec"]["when"]},
                 "status": t["status"], "detected_at": t["detected_at"], "fired_at": t["fired_at"],
                 "fire_count": t["fire_count"], "failure_count": t["failure_count"],
                 "last_failure_at": t["last_failure_at"], "pending": len(t["pending"]),
                 "next_mark": iso(t["next_mark"]) if t["next_mark"] else None}
                for tid, t in self._triggers.items()
            ],
            "events": list(self._events),
            "events_dropped": self._seq - len(self._events),
        }

    def _watch_roles_of(self, body: dict) -> set[str]:
        raw = body.get("watch_roles")
        if raw is None:
            return self._watch_roles
        if not isinstance(raw, list) or not all(isinstance(r, str) and r for r in raw):
            raise TriggerError("watch_roles must be a list of non-empty strings")
        if self._configured and set(raw) != self._watch_roles:
            raise TriggerError(f"watch_roles {sorted(raw)} conflicts with the already-registered "
                               f"{sorted(self._watch_roles)} — clear to change it")
        return set(raw)

    def _executor_of(self, body: dict, watch_roles: set[str]) -> dict[str, Any] | None:
        raw = body.get("executor")
        if raw is None:
            return self._executor
        if not isinstance(raw, dict) or not isinstance(raw.get("a2a_url"), str) or not raw["a2a_url"]:
            raise TriggerError("executor.a2a_url must be a non-empty string")
        role = raw.get("role")
        if not isinstance(role, str) or not role:
            raise TriggerError("executor.role must be a non-empty string (the executor's AgentEnv-Role, kept "
                               "out of watch_roles so its own tool calls never fire triggers)")
        if role in watch_roles:
            raise TriggerError(f"executor.role {role!r} must not be in watch_roles {sorted(watch_roles)} — "
                               "the executor's own tool calls would fire triggers (cascade)")
        headers = raw.get("headers") or {}
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            raise TriggerError("executor.headers must be an object of strings (sent with every call to the executor)")
        executor = {"a2a_url": raw["a2a_url"], "timeout_seconds": float(raw.get("timeout_seconds", 120)),
                    "role": role, "headers": headers}
        if self._executor is not None and self._executor != executor:
            raise TriggerError("executor conflicts with the already-registered executor — clear to change it")
        return executor

    def _validate(self, spec: dict, executor: dict | None) -> None:
        tid, when, known = spec["id"], spec.get("when"), self._tool_names()
        if not isinstance(when, dict) or when.get("type") not in WHEN_TYPES:
            raise TriggerError(f"trigger '{tid}': when.type must be 'action', 'state', or 'time'")
        named: list[tuple[str, str]] = []
        if when["type"] == "action":
            if not isinstance(when.get("tool"), str) or not when["tool"]:
                raise TriggerError(f"trigger '{tid}': when.tool must be a non-empty string")
            if not isinstance(when.get("where", {}), dict):
                raise TriggerError(f"trigger '{tid}': when.where must be an object")
            for field, predicate in when.get("where", {}).items():
                check_predicate(predicate, f"trigger '{tid}': where.{field}")
            if not isinstance(when.get("repeat", False), bool):
                raise TriggerError(f"trigger '{tid}': when.repeat must be a boolean")
            named.append((when["tool"], "when.tool"))
        elif when["type"] == "state":
            when["check"] = check_pipeline(when.get("check"), f"trigger '{tid}': when.check")
            named += [(s["tool"], "when.check") for s in when["check"]["steps"]]
        else:
            self._validate_time(when, tid)
        if "repeat" in when and when["type"] != "action":
            raise TriggerError(f"trigger '{tid}': when.repeat is only valid on action triggers")
        actions = spec.get("actions")
        if not isinstance(actions, list) or not actions:
            raise TriggerError(f"trigger '{tid}': actions must be a non-empty list")
        for i, action in enumerate(actions):
            where = f"trigger '{tid}': actions[{i}]"
            kind = action.get("type") if isinstance(action, dict) else None
            if kind not in ACTION_TYPES:
                raise TriggerError(f"{where}: type must be one of {ACTION_TYPES}")
            if kind == "nl":
                if not isinstance(action.get("instruction"), str) or not action["instruction"]:
                    raise TriggerError(f"{where}: instruction must be a non-empty string")
                if executor is None:
                    raise TriggerError(f"{where}: nl actions require an executor")
            else:
                if not isinstance(action.get("tool"), str) or not action["tool"]:
                    raise TriggerError(f"{where}: tool must be a non-empty string")
                if not isinstance(action.get("args", {}), dict):
                    raise TriggerError(f"{where}: args must be an object")
                if when["type"] != "action" and PLACEHOLDER.search(json.dumps(action.get("args", {}))):
                    raise TriggerError(f"{where}: ${{args.*}} / ${{result.*}} need a provoking tool call; "
                                       "only action triggers carry args/result")
                named.append((action["tool"], f"actions[{i}].tool"))
        for tool, where in named:
            if tool not in known:
                raise TriggerError(f"trigger '{tid}': {where} names unknown tool {tool!r}")

    @staticmethod
    def _validate_time(when: dict, tid: str) -> None:
        try:
            if "at" not in when and "every" not in when:
                raise TriggerError(f"trigger '{tid}': when.type=='time' needs 'at' or 'every'")
            if "at" in when:
                time_mark(when["at"])
            if "every" in when and parse_duration(when["every"]).total_seconds() <= 0:
                raise TriggerError(f"trigger '{tid}': every must be a positive duration")
        except ClockError as exc:
            raise TriggerError(f"trigger '{tid}': {exc}") from None
        if "count" in when:
            if "every" not in when:
                raise TriggerError(f"trigger '{tid}': 'count' requires a recurring 'every'")
            if isinstance(when["count"], bool) or not isinstance(when["count"], int) or when["count"] <= 0:
                raise TriggerError(f"trigger '{tid}': count must be a positive integer")

    # -- detection ---------------------------------------------------------------------------
    def on_tool_call(self, role: str, name: str, arguments: dict, failed: bool, result: Any) -> None:
        """After a client's tool call: fire matching action triggers, re-check state triggers."""
        if self._executor is not None and role == self._executor["role"]:
            return  # the executor's own traffic is never watched
        if role not in self._watch_roles or not self._triggers:
            return
        self.on_clock_tick()
        if failed:
            return
        ctx = {"args": arguments, "result": result}
        for tid, trigger in self._triggers.items():
            when = trigger["spec"]["when"]
            if when["type"] != "action" or when["tool"] != name:
                continue
            if trigger["status"] != "armed" and not (when.get("repeat") and trigger["status"] in IN_FLIGHT):
                continue
            if all(holds(p, lookup(ctx, f)) for f, p in when.get("where", {}).items()):
                self._detect(tid, trigger, {"tool": name, "role": role}, ctx)
        self.on_state_change({"tool": name, "role": role})

    def on_state_change(self, provoking: dict[str, Any]) -> None:
        """Re-check every armed state trigger (after a write or a ``data/add``). A change
        during a check is noted and checked again after it: the running check may have read
        the state from before it."""
        for tid, trigger in self._triggers.items():
            if trigger["spec"]["when"]["type"] != "state" or trigger["status"] != "armed":
                continue
            if trigger["evaluating"]:
                trigger["recheck"] = provoking
            else:
                trigger["evaluating"] = True
                self._schedule(self._eval_state(tid, trigger, provoking))

    def on_clock_tick(self) -> None:
        """Fire the time triggers whose mark the virtual clock has reached."""
        now = self.clock.now()
        if now is None:
            return
        for tid, trigger in self._triggers.items():
            when = trigger["spec"]["when"]
            if when["type"] != "time" or trigger["status"] != "armed":
                continue
            if trigger["mark_generation"] != self.clock.generation:  # (re-)armed clock: new timeline
                trigger["next_mark"] = self._first_mark(when)
                trigger["mark_generation"] = self.clock.generation
            mark = trigger["next_mark"]
            if mark is None or now < mark:
                continue
            recurring = "every" in when and trigger["fire_count"] + 1 < when.get("count", float("inf"))
            trigger["next_mark"] = mark + parse_duration(when["every"]) if recurring else None
            self._detect(tid, trigger, {"source": "clock", "mark": iso(mark)}, {}, rearm=recurring)

    def _first_mark(self, when: dict) -> datetime:
        t0 = self.clock.t0()
        if "at" in when:
            kind, value = time_mark(when["at"])
            return value if kind == "abs" else t0 + value
        return t0 + parse_duration(when["every"])

    def _detect(self, tid: str, trigger: dict, provoking: dict, ctx: dict, rearm: bool = False) -> None:
        if trigger["status"] in IN_FLIGHT:  # a repeat trigger mid-fire: the fire drains the queue
            trigger["pending"].append(ctx)
            trigger["status"] = "queued"
            self._emit("detected", tid, provoking=provoking, queued=len(trigger["pending"]))
            return
        trigger["status"] = "firing"
        trigger["detected_at"] = _utc_now()
        self._emit("detected", tid, provoking=provoking)
        self._schedule(self._fire(tid, trigger, ctx, rearm))

    async def _eval_state(self, tid: str, trigger: dict, provoking: dict) -> None:
        try:
            matched = await self._run_check(trigger["spec"]["when"]["check"])
        except Exception as exc:
            self._emit("eval_error", tid, detail=str(exc)[:300])
            matched = False
        finally:
            trigger["evaluating"] = False
        recheck, trigger["recheck"] = trigger["recheck"], None
        if trigger["status"] != "armed":
            return
        if matched:
            self._detect(tid, trigger, provoking, {})
        elif recheck is not None:
            trigger["evaluating"] = True
            self._schedule(self._eval_state(tid, trigger, recheck))

    async def _run_check(self, check: dict) -> bool:
        bindings: dict[str, Any] = {}
        for step in check["steps"]:
            failed, data, text = await self._call(step["tool"], fill(step.get("args", {}), {}, bindings))
            if failed:
                return False
            value = extract(step.get("extract"), data, text)
            if step.get("bind"):
                if value in (None, "", []):
                    return False
                bindings[step["bind"]] = value
            if "predicate" in step and not holds(step["predicate"], value):
                return False
        return True

    # -- firing ------------------------------------------------------------------------------
    async def _fire(self, tid: str, trigger: dict, ctx: dict, rearm: bool) -> None:
        """Run the actions once per provoking event (draining any queued meanwhile); a failed
        fire re-arms, so one transient error does not silence the trigger for the run."""
        repeat = bool(trigger["spec"]["when"].get("repeat")) or rearm
        try:
            while True:
                ok = True
                for index, action in enumerate(trigger["spec"]["actions"]):
                    if not await self._run_action(tid, index, action, ctx):
                        ok = False
                        self._emit("failed", tid, action_index=index)
                        break
                if ok:
                    trigger["fire_count"] += 1
                    trigger["fired_at"] = _utc_now()
                    self._emit("fired", tid, fire_count=trigger["fire_count"])
                if trigger["pending"]:
                    ctx = trigger["pending"].popleft()
                    trigger["status"] = "firing"
                    continue
                trigger["status"] = "armed" if (repeat or not ok) else "fired"
                return
        finally:
            if trigger["status"] in IN_FLIGHT:  # cancelled mid-fire: never leave it wedged
                self._emit("failed", tid, detail="firing did not settle", dropped=len(trigger["pending"]))
                trigger["status"] = "armed"
                trigger["pending"].clear()

    async def _run_action(self, tid: str, index: int, action: dict, ctx: dict) -> bool:
        try:
            if action["type"] == "tool":
                args = fill(action.get("args", {}), ctx, {})
                failed, _, text = await self._call(action["tool"], args)
                if failed:
                    self._emit("action_failed", tid, action_index=index, tool=action["tool"], detail=text[:300])
                    return False
                detail: dict[str, Any] = {"tool": action["tool"], "args": args}
            else:
                detail = {"nl": action["instruction"][:120], **await self._call_executor(action["instruction"], tid)}
            self._emit("action_ok", tid, action_index=index, detail=detail)
            return True
        except Exception as exc:
            self._emit("action_failed", tid, action_index=index, detail=f"{type(exc).__name__}: {exc}"[:300])
            return False

    async def _call_executor(self, instruction: str, tid: str) -> dict[str, Any]:
        """Prompt the executor and wait for its task to end; anything but completed raises."""
        executor = self._executor
        if executor is None:
            raise RuntimeError("no executor is registered")
        async with httpx.AsyncClient(headers=executor["headers"],
                                     timeout=httpx.Timeout(30.0, read=executor["timeout_seconds"] + 5)) as http:
            a2a = A2AClient(http)
            try:
                reply = await a2a.send_and_wait(
                    executor["a2a_url"], instruction, executor["timeout_seconds"],
                    context_id=f"trigger-{tid}-{uuid.uuid4().hex[:8]}",
                )
            finally:
                await a2a.aclose()
        if reply.state != "completed":
            raise RuntimeError(f"executor task {reply.task_id} ended {reply.state}: {reply.text[:200]}")
        return {"executor_task_id": reply.task_id, "reply": reply.text[:300]}

    # -- plumbing ----------------------------------------------------------------------------
    def _schedule(self, coroutine: Awaitable[None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _start_driver(self) -> None:
        """Poll time triggers in the background, so they fire without any tool call."""
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        while any(t["spec"]["when"]["type"] == "time" and t["status"] != "fired" for t in self._triggers.values()):
            await asyncio.sleep(DRIVER_INTERVAL_S)
            with contextlib.suppress(Exception):
                self.on_clock_tick()

    def _emit(self, kind: str, trigger_id: str | None, **payload: Any) -> None:
        assert kind in EVENT_KINDS, f"unknown trigger event kind {kind!r}"
        self._seq += 1
        virtual = self.clock.now()
        event = {"seq": self._seq, "ts": _utc_now(), **({"virtual_time": iso(virtual)} if virtual else {}),
                 "kind": kind, **({"trigger_id": trigger_id} if trigger_id else {}), **payload}
        self._events.append(event)
        trigger = self._triggers.get(trigger_id or "")
        if kind in ("failed", "eval_error") and trigger is not None:
            trigger["failure_count"] += 1
            trigger["last_failure_at"] = event["ts"]
