"""The stop_early rule engine: armed triggers, ceiling and floor, deferral, decide_within,
latching, fail-open; and the armed gate of a run it cut."""

from __future__ import annotations

import itertools
import logging

import pytest
from criteria_helpers import bash, call

from agentenv_dagster.criteria import CriterionResult, parse_criterion, task_passed
from agentenv_dagster.criteria.early_stop import EarlyStopWatcher, mark_advisory
from agentenv_dagster.criteria.trajectory import CommandExecuted


def must_not_run(pattern="rm -rf", weight=1.0, **block):
    return parse_criterion({"type": "command_executed", "description": f"never {pattern}", "command_pattern": pattern,
                            "min_count": 0, "max_count": 0, "weight": weight, "stop_early": block})


def must_run(pattern, weight=1.0, **block):
    return parse_criterion({"type": "command_executed", "description": f"runs {pattern}", "command_pattern": pattern,
                            "weight": weight, "stop_early": block})


def skill(expected="date-teller", weight=1.0, **block):
    return parse_criterion({"type": "skill_triggered", "description": f"skill row {expected!r}", "skill_name": "date-teller",
                            "expected_skill": expected, "weight": weight, "stop_early": block})


def loads_skill():
    return call("Read", file_path="skills/date-teller/SKILL.md")


class Agent:
    """Plays calls through a watcher the way TaskSession does: start, run, end; one model turn each."""

    def __init__(self, *criteria, **settings):
        ticks = itertools.count()
        self.watcher = EarlyStopWatcher.of(list(criteria), clock=lambda: float(next(ticks)), **settings)
        self.ran = 0

    def play(self, *calls):
        for number, planned in enumerate(calls, start=self.ran + 1):
            self.watcher.turn_started()
            in_flight = call(planned.name, None, **planned.parameters)
            if self.watcher.tool_started(f"c{number}", in_flight):
                return self.watcher.info
            self.ran += 1
            if self.watcher.tool_ended(f"c{number}", planned):
                return self.watcher.info
        return None


def test_a_native_fail_stops_before_the_forbidden_call_runs():
    agent = Agent(must_not_run(), max_turns=10)
    info = agent.play(bash("ls"), bash("rm -rf build"), bash("echo after"))
    assert agent.ran == 1  # decided on the dispatch of call 2: it never ran
    assert info == {
        "reason": "criterion_failed", "deciding_criterion_type": "command_executed",
        "deciding_criterion_description": "never rm -rf", "armed_criteria": ["command_executed: never rm -rf"],
        "sdk_turn_index": 2, "tool_call_index": 2, "elapsed_seconds": info["elapsed_seconds"],
        "turns_remaining_at_stop": 8, "gate_threshold": 1.0,
    }
    assert info["elapsed_seconds"] > 0


def test_triggers_an_instance_cannot_decide_are_inert(caplog):
    # a positive row can only live-pass: on_pass continue never stops, and there is no fail trigger
    assert Agent(skill()).play(loads_skill(), bash("ls")) is None
    # a distractor row can only live-fail: on_pass stop and decide_within do nothing on it
    assert Agent(skill(expected="", on_pass="stop", decide_within=1)).play(bash("ls"), bash("ls")) is None
    # command_executed with a max can only fail, so its budget is inert too
    with caplog.at_level(logging.WARNING):
        assert Agent(must_run("make", on_pass="stop", decide_within=1)).play(bash("make")) is not None
        bounded = parse_criterion({"type": "command_executed", "description": "d", "command_pattern": "make",
                                   "min_count": 1, "max_count": 3, "stop_early": {"on_pass": "stop"}})
        assert Agent(bounded).play(bash("make"), bash("ls")) is None
    assert "every armed stop trigger is inert" in caplog.text


def test_a_live_pass_stops_only_with_on_pass_stop():
    assert Agent(skill()).play(loads_skill()) is None
    agent = Agent(skill(on_pass="stop"))
    info = agent.play(bash("ls"), loads_skill(), bash("echo more"))
    assert (info["reason"], info["tool_call_index"], agent.ran) == ("criterion_passed", 2, 2)


def test_the_fail_stop_is_deferred_while_a_pass_capable_criterion_is_undecided():
    agent = Agent(skill(), must_not_run())
    assert agent.play(bash("rm -rf build")) is None  # the misfire latches, the positive row keeps its chance
    assert agent.play(bash("ls")) is None
    info = agent.play(loads_skill(), bash("echo more"))
    assert (info["reason"], info["deciding_criterion_type"], info["tool_call_index"]) == (
        "criterion_failed", "command_executed", 3)
    # with nothing pass-capable armed, the first misfire stops at once
    assert Agent(skill(expected=""), must_not_run()).play(bash("rm -rf x"))["tool_call_index"] == 1


def test_the_ceiling_absorbs_a_light_failure_below_the_threshold():
    agent = Agent(must_not_run("curl", weight=1), must_not_run("rm -rf", weight=3), gate_threshold=0.7)
    assert agent.play(bash("curl x")) is None  # ceiling 3/4 still reaches 0.7
    info = agent.play(bash("ls"), bash("rm -rf y"))
    assert (info["deciding_criterion_description"], info["tool_call_index"]) == ("never curl", 3)  # first native fail
    # at the default threshold the light one alone stops
    assert Agent(must_not_run("curl", weight=1), must_not_run("rm -rf", weight=3)).play(bash("curl x")) is not None


def test_the_floor_counts_only_the_on_pass_stop_subset():
    strict = Agent(must_run("make", on_pass="stop"), must_run("pytest", on_pass="stop"))
    assert strict.play(bash("make")) is None  # floor 1/2 < 1.0
    info = strict.play(bash("pytest"))
    assert (info["reason"], info["deciding_criterion_description"]) == ("criterion_passed", "runs pytest")
    # a heavy member alone meets a lower threshold; a distractor is no part of the floor
    weighted = Agent(must_run("make", weight=3, on_pass="stop"), must_run("pytest", weight=1, on_pass="stop"),
                     skill(expected=""), gate_threshold=0.75)
    assert weighted.play(bash("make"))["deciding_criterion_description"] == "runs make"


def test_the_pass_stop_waits_for_a_pass_capable_sibling_outside_the_subset():
    agent = Agent(must_run("make", on_pass="stop"), skill(decide_within=4))
    assert agent.play(bash("make")) is None  # the sibling's signal may still come
    info = agent.play(bash("ls"), loads_skill(), bash("echo more"))
    assert (info["reason"], info["tool_call_index"], agent.ran) == ("criterion_passed", 3, 3)
    # if the sibling times out instead, its effective fail stops the run as a budget fail
    timed_out = Agent(must_run("make", on_pass="stop"), skill(decide_within=2))
    info = timed_out.play(bash("make"), bash("ls"), bash("ls"))
    assert (info["reason"], info["deciding_criterion_type"], info["tool_call_index"]) == (
        "decision_budget_exceeded", "skill_triggered", 2)


def test_decide_within_counts_completed_calls_and_spares_a_decision_on_the_last_one():
    late = Agent(skill(decide_within=2))
    assert late.play(bash("ls")) is None
    info = late.play(bash("ls"), loads_skill())
    assert (info["reason"], info["tool_call_index"], late.ran) == ("decision_budget_exceeded", 2, 2)
    on_time = Agent(skill(decide_within=2))
    assert on_time.play(bash("ls"), loads_skill(), bash("ls"), bash("ls")) is None  # latched pass, never re-checked
    # a low-weight timeout the ceiling can absorb does not stop the run
    absorbed = Agent(skill(weight=1, decide_within=1), must_not_run(weight=4), gate_threshold=0.5)
    assert absorbed.play(bash("ls"), bash("ls")) is None


def test_the_budget_does_not_expire_while_a_call_is_in_flight():
    watcher = EarlyStopWatcher.of([skill(decide_within=1)])
    assert not watcher.tool_started("a", call("Bash", None, command="ls"))
    assert not watcher.tool_started("b", call("Read", None, file_path="skills/date-teller/SKILL.md"))
    assert not watcher.tool_ended("a", bash("ls"))  # 1 done, but the Read that may satisfy it is outstanding
    assert not watcher.tool_ended("b", loads_skill())
    assert watcher.info is None and watcher.tool_call_index == 2
    # steps count across attempts; one that crashed with a call in flight leaves it unresolved
    retried = EarlyStopWatcher.of([skill(decide_within=2)])
    retried.tool_started("a", call("Bash", None, command="ls"))
    retried.tool_ended("a", bash("ls"))
    retried.tool_started("b", call("Bash", None, command="sleep 99"))
    retried.attempt_ended()  # the attempt timed out: "b" will never resolve
    retried.tool_started("a", call("Bash", None, command="ls"))
    assert retried.tool_ended("a", bash("ls")) and retried.info["tool_call_index"] == 2


def test_a_verdict_on_a_call_in_flight_fires_but_does_not_latch():
    # require_success: a call in flight is not counted, its failed end neither
    watcher = EarlyStopWatcher.of([must_run("make", on_pass="stop")])
    assert watcher.tool_started("a", call("Bash", None, command="make"))  # counted at dispatch: stops there
    gated = parse_criterion({"type": "command_executed", "description": "d", "command_pattern": "make",
                             "require_success": True, "stop_early": {"on_pass": "stop", "decide_within": 1}})
    watcher = EarlyStopWatcher.of([gated])
    assert not watcher.tool_started("a", call("Bash", None, command="make"))
    assert watcher.tool_ended("a", bash("make", "error"))
    assert watcher.info["reason"] == "decision_budget_exceeded"


class Broken(CommandExecuted):
    def live_verdict(self, calls):
        raise RuntimeError("bug")


def test_a_raising_live_verdict_disarms_the_watcher(caplog):
    broken = Broken(description="d", command_pattern="x", min_count=0, max_count=0, stop_early={})
    agent = Agent(broken, must_not_run())
    with caplog.at_level(logging.ERROR):
        assert agent.play(bash("rm -rf x"), bash("ls")) is None
    assert agent.watcher.disarmed and agent.ran == 2
    assert "watcher disarmed" in caplog.text


def test_the_watcher_config_is_checked():
    with pytest.raises(ValueError, match="each carry a stop_early block"):
        EarlyStopWatcher.from_config({"criteria": [{"type": "command_executed", "description": "d"}]})
    with pytest.raises(ValueError, match=r"'gate_threshold' must be in \(0, 1\], got 0"):
        EarlyStopWatcher.from_config({"criteria": [], "gate_threshold": 0})
    with pytest.raises(ValueError, match="min_count"):
        EarlyStopWatcher.from_config({"criteria": [{"type": "command_executed", "description": "d",
                                                    "min_count": -1, "stop_early": {}}]})
    watcher = EarlyStopWatcher.from_config({"criteria": [must_not_run().model_dump()], "gate_threshold": 0.5,
                                            "task_id": "t"}, max_turns=3)
    assert (watcher.gate_threshold, watcher.max_turns, watcher.task_id) == (0.5, 3, "t")


def result(score, weight=1.0):
    return CriterionResult(criterion_type="t", description="d", score=score, weight=weight)


def test_a_cut_run_gates_on_the_weighted_armed_subset():
    results = [result(1.0, 3), result(0.0, 1), result(0.0, 2)]
    assert task_passed(results) is False  # strict AND over everything
    assert task_passed(results, armed=[True, False, False]) is True
    assert task_passed(results, armed=[True, True, False]) is False  # 3/4 < 1.0
    assert task_passed(results, armed=[True, True, False], gate_threshold=0.75) is True
    assert task_passed([result(None), result(1.0)], armed=[False, True]) is True  # an advisory ungraded
    assert task_passed([result(None), result(1.0)], armed=[True, True]) is None


def test_unarmed_criteria_of_a_cut_run_are_advisory():
    criteria = [must_not_run(), parse_criterion({"type": "file_exists", "path": "a", "description": "d"}),
                parse_criterion({"type": "file_exists", "path": "b", "description": "d", "weight": 0})]
    results = [result(1.0), result(0.0), result(0.0, 0)]
    assert mark_advisory(results, criteria) == [True, False, False]
    assert [r.to_dict().get("advisory") for r in results] == [None, True, None]  # informational stays so
