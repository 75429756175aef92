"""The ``stop_early`` watcher: decides, from tool calls as they start and end, when an armed
run's outcome is settled, so the agent's turn can stop there.

A criterion is armed by its ``stop_early:`` block; ``run_limits.stop_early: false`` disarms all
(the watcher is then never built). Each armed criterion has the live polarities its fields allow
(``live_polarities``): a trigger this instance can never decide is inert, not an error, so one
dataset-fanned line serves positive and distractor rows alike. Every armed criterion may
fail-stop; ``on_pass: stop`` adds a pass-stop; ``decide_within: N`` (pass-capable instances only)
turns "still undecided after N completed tool calls" into an effective fail.

Each round (a tool call starting, or ending) computes the effective verdicts, then:

- **fail-stop** when some armed criterion has effectively failed and the armed set's *ceiling*
  (every criterion not failed scores 1) is below ``gate_threshold`` — held while any
  pass-capable armed criterion is undecided, so an early misfire never hides a later pass;
- **pass-stop** when the ``on_pass: stop`` subset's *floor* (only passes score) reaches the
  threshold — held while a pass-capable armed criterion outside the subset is undecided.

Fail-stop is checked first. Verdicts latch on resolved rounds only (a call in flight may fire a
stop but leaves nothing behind), and ``decide_within`` expires only when no call is in flight,
so a criterion is never failed on the very call that would satisfy it. A live verdict that
raises disarms the watcher: a bug degrades to a full run, never to a false stop. The scores
still come from the normal checkers on the frozen trajectory; this only decides when to stop.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from .base import Criterion, CriterionResult, ToolCall
from .registry import parse_criterion

logger = logging.getLogger(__name__)

Verdict = Literal["pass", "fail", "undecided"]
CRITERION_PASSED, CRITERION_FAILED, DECISION_BUDGET_EXCEEDED = (
    "criterion_passed", "criterion_failed", "decision_budget_exceeded")


def is_armed(criterion: Criterion) -> bool:
    """The block's presence is the arming (only live-observable criteria have the field)."""
    return getattr(criterion, "stop_early", None) is not None


def mark_advisory(results: list[CriterionResult], criteria: list[Criterion]) -> list[bool]:
    """On a run the watcher cut: flag every unarmed gating criterion advisory (it never had the
    whole trajectory to be satisfied on); the armed mask that ``task_passed`` gates on."""
    armed = [is_armed(c) for c in criteria]
    for result, gated in zip(results, armed, strict=True):
        result.advisory = result.gating and not gated
    return armed


@dataclass
class _Armed:
    """One armed criterion and its triggers, resolved against what this instance can decide."""

    criterion: Criterion
    can_pass: bool
    pass_stop: bool  # on_pass: stop, and it can live-pass
    fail_stop: bool  # the implicit trigger, when it can live-fail
    budget: int | None  # decide_within, when it can live-pass (a fail-only "undecided" is its success)
    latched: Verdict = "undecided"
    budget_expired: bool = False

    @classmethod
    def of(cls, criterion: Criterion) -> _Armed:
        polarities = criterion.live_polarities()
        block = criterion.stop_early  # type: ignore[attr-defined]
        can_pass = "pass" in polarities
        return cls(criterion, can_pass=can_pass, pass_stop=can_pass and block.on_pass == "stop",
                   fail_stop="fail" in polarities, budget=block.decide_within if can_pass else None)

    @property
    def weight(self) -> float:
        return self.criterion.weight

    def label(self) -> str:
        return f"{self.criterion.type}: {self.criterion.description}"


@dataclass
class EarlyStopWatcher:
    """Fed ``turn_started`` / ``tool_started`` / ``tool_ended``; ``info`` is the
    ``EarlyStopInfo`` record once a stop fired (then ``should_stop`` is true and stays so)."""

    armed: list[_Armed]
    gate_threshold: float = 1.0
    max_turns: int | None = None
    task_id: str = ""
    clock: Callable[[], float] = time.monotonic
    info: dict[str, Any] | None = None
    disarmed: bool = False
    _calls: list[ToolCall] = field(default_factory=list)  # resolved, in order
    _pending: set[str] = field(default_factory=set)
    _turns: int = 0
    _previous: list[Verdict] = field(default_factory=list)
    _started: float = 0.0

    def __post_init__(self) -> None:
        self._started = self.clock()
        self._previous = ["undecided"] * len(self.armed)
        if not any(a.pass_stop or a.fail_stop or a.budget for a in self.armed):
            logger.warning("[%s] every armed stop trigger is inert for this instance; the run cannot stop early",
                           self.task_id)

    @classmethod
    def of(cls, criteria: list[Criterion], **settings: Any) -> EarlyStopWatcher:
        """A watcher over armed ``criteria`` (``gate_threshold``, ``max_turns``, ``task_id``, ``clock``)."""
        unarmed = [c.type for c in criteria if not is_armed(c)]
        if not criteria or unarmed:
            raise ValueError(f"a watcher needs criteria that each carry a stop_early block (unarmed: {unarmed})")
        return cls([_Armed.of(c) for c in criteria], **settings)

    @classmethod
    def from_config(cls, config: dict[str, Any], *, max_turns: int | None = None) -> EarlyStopWatcher:
        """From the agent-config ``stop_early`` value, ``{criteria: [...], gate_threshold, task_id}``;
        ValueError for a malformed one, so the agent refuses the config."""
        documents = config.get("criteria")
        if not isinstance(documents, list):
            raise ValueError("'criteria' must be a list of criterion documents")
        threshold = config.get("gate_threshold", 1.0)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold <= 1:
            raise ValueError(f"'gate_threshold' must be in (0, 1], got {threshold!r}")
        return cls.of([parse_criterion(d) for d in documents], gate_threshold=float(threshold),
                      max_turns=max_turns, task_id=str(config.get("task_id") or ""))

    @property
    def should_stop(self) -> bool:
        return self.info is not None

    @property
    def tool_call_index(self) -> int:
        """Completed tool calls so far (cumulative over every turn the watcher saw)."""
        return len(self._calls)

    def turn_started(self) -> None:
        """A model turn (an assistant message) began: what ``turns_remaining_at_stop`` counts."""
        self._turns += 1

    def attempt_ended(self) -> None:
        """The agent's attempt ended (replied, crashed or timed out): a call still in flight
        will never resolve, so it no longer holds a ``decide_within`` expiry back on a retry."""
        self._pending.clear()

    def tool_started(self, call_id: str, call: ToolCall) -> bool:
        """A call was dispatched; True when the turn must stop before it runs."""
        return self._round(lambda: self._pending.add(call_id), in_flight=call)

    def tool_ended(self, call_id: str, call: ToolCall) -> bool:
        """A call resolved (``call.status`` set); True when the turn must stop now."""
        def record() -> None:
            self._pending.discard(call_id)
            self._calls.append(call)
        return self._round(record, in_flight=None)

    def _round(self, record: Callable[[], None], in_flight: ToolCall | None) -> bool:
        if self.info is not None or self.disarmed:
            return self.should_stop
        record()
        try:
            self._evaluate(in_flight)
        except Exception:  # noqa: BLE001 - fail open: a verdict bug must never cause a false stop
            self.disarmed = True
            logger.exception("[%s] early-stop live verdict raised; watcher disarmed, the run continues in full",
                             self.task_id)
        return self.should_stop

    def _verdicts(self, in_flight: ToolCall | None, index: int) -> list[Verdict]:
        """This round's effective verdicts; decided ones latch when nothing is in flight."""
        calls = [*self._calls, in_flight] if in_flight is not None else self._calls
        resolved = in_flight is None
        verdicts: list[Verdict] = []
        for armed in self.armed:
            if armed.latched != "undecided":
                verdicts.append(armed.latched)
                continue
            live = armed.criterion.live_verdict(calls)  # type: ignore[attr-defined]
            verdict: Verdict = "undecided" if live is None else "pass" if live else "fail"
            expired = (resolved and not self._pending and verdict == "undecided"
                       and armed.budget is not None and index >= armed.budget)
            if expired:
                verdict = "fail"
            if resolved and verdict != "undecided":
                armed.latched, armed.budget_expired = verdict, expired
            verdicts.append(verdict)
        return verdicts

    def _evaluate(self, in_flight: ToolCall | None) -> None:
        index = self.tool_call_index + (1 if in_flight is not None else 0)
        verdicts = self._verdicts(in_flight, index)
        pairs = list(zip(self.armed, verdicts))
        if not any(a.can_pass and v == "undecided" for a, v in pairs):
            native = [a for a, v in pairs if v == "fail" and a.fail_stop and not a.budget_expired]
            timed_out = [a for a, v in pairs if v == "fail" and a.budget_expired]
            ceiling = math.fsum(a.weight for a, v in pairs if v != "fail") / math.fsum(a.weight for a in self.armed)
            if (native or timed_out) and ceiling < self.gate_threshold:
                reason = CRITERION_FAILED if native else DECISION_BUDGET_EXCEEDED
                self._fire(reason, (native or timed_out)[0], index)
                return
        subset = [i for i, a in enumerate(self.armed) if a.pass_stop]
        outside_undecided = any(a.can_pass and not a.pass_stop and v == "undecided" for a, v in pairs)
        if subset and not outside_undecided:
            floor = (math.fsum(self.armed[i].weight for i in subset if verdicts[i] == "pass")
                     / math.fsum(self.armed[i].weight for i in subset))
            if floor >= self.gate_threshold:
                flipped = [i for i in subset if verdicts[i] != self._previous[i]]
                self._fire(CRITERION_PASSED, self.armed[(flipped or subset)[-1]], index)
                return
        if in_flight is None:
            self._previous = verdicts

    def _fire(self, reason: str, deciding: _Armed, index: int) -> None:
        self.info = {
            "reason": reason,
            "deciding_criterion_type": deciding.criterion.type,
            "deciding_criterion_description": deciding.criterion.description,
            "armed_criteria": [a.label() for a in self.armed],
            "sdk_turn_index": self._turns,
            "tool_call_index": index,
            "elapsed_seconds": round(max(self.clock() - self._started, 0.0), 3),
            "turns_remaining_at_stop": None if self.max_turns is None else max(self.max_turns - self._turns, 0),
            "gate_threshold": self.gate_threshold,
        }
        logger.info("[%s] early stop: %s by %s at tool call %d", self.task_id, reason, deciding.criterion.type, index)
