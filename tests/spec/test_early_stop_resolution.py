"""stop_early at resolution (reference coder_eval.md §4): upstream's refusals in upstream's order
and words, checked on the task as it runs, so the ``run_limits.stop_early: false`` kill switch
(in the file, a variant or ``-D``) rescues it; and what an armed task's prompt step carries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from agentenv_dagster.compiler import load_document
from agentenv_dagster.config import load_config
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.steps import BUILTIN_STEPS

ARMED = {"type": "command_executed", "description": "never rm", "command_pattern": "rm -rf",
         "min_count": 0, "max_count": 0, "stop_early": {}}
REPLAY = {"type": "replay", "episodes": [{"match": ".", "reply": "ok"}]}

TRUE_REMOVED = (
    "run_limits.stop_early: true has been removed — arming is per-criterion now. Put a stop_early: block on the "
    "live-observable criterion instead (e.g. stop_early: {} / {on_pass: stop} / {decide_within: N}); "
    "run_limits.stop_early: false remains available as the run-level kill switch.")
SIMULATION = (
    "criterion-level stop_early arming is not supported together with simulation.enabled (early-stop v1 is "
    "single-shot only); use simulation.stop_on_criteria_pass for dialog-mode criteria stopping, or disarm with "
    "run_limits.stop_early: false.")
NO_AGENT_TYPE = (
    "criterion-level stop_early arming requires an agent block with a registered type; this task resolves "
    "without one. Disarm with run_limits.stop_early: false to bypass this check.")
NOT_COOPERATIVE = (
    "criterion-level stop_early arming requires an agent that supports cooperative stopping (claude-code, codex, "
    "replay, anthropic); agent type 'opencode' does not. Disarm with run_limits.stop_early: false to run this agent anyway.")
ZERO_GATE = (
    "run_limits.stop_early_gate_threshold (0.0) must be > 0.0 on an armed task (a threshold of 0 trivially "
    "passes the armed gate regardless of whether any armed criterion actually decided).")


def task(**fields: Any) -> dict[str, Any]:
    document = {"task_id": "t", "description": "d", "initial_prompt": "go", "agent": REPLAY,
                "sandbox": {"python": None}, "success_criteria": [ARMED]}
    document.update(fields)
    return {k: v for k, v in document.items() if v is not ...}


def resolve(tmp_path: Path, document: dict[str, Any], *overrides: str):
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    registry = BUILTIN_STEPS.with_impls(load_config(tmp_path).task_steps.impls)
    return path, load_document(path, registry, overrides=overrides)[0]


def refusal(tmp_path: Path, document: dict[str, Any], *overrides: str) -> str:
    with pytest.raises(TaskLoadError) as info:
        resolve(tmp_path, document, *overrides)
    (error,) = info.value.errors
    assert error.file == str(tmp_path / "task.yaml")
    return f"field '{error.field}': {error.message}"


SIMULATED = {"enabled": True, "persona": "p", "goal": "g", "simulator": REPLAY}


@pytest.mark.parametrize("document, expected", [
    (task(run_limits={"stop_early": True}), f"field 'run_limits.stop_early': {TRUE_REMOVED}"),
    # true is refused even with nothing armed: it is the removed master arm
    (task(run_limits={"stop_early": True}, success_criteria=[{"type": "file_exists", "path": "a", "description": "d"}]),
     f"field 'run_limits.stop_early': {TRUE_REMOVED}"),
    (task(simulation=SIMULATED, run_limits={"stop_early_gate_threshold": 0.0}), f"field 'simulation.enabled': {SIMULATION}"),
    (task(agent={"model": "m"}), f"field 'agent.type': {NO_AGENT_TYPE}"),
    (task(agent=..., run_limits={"stop_early_gate_threshold": 0.0}), f"field 'agent.type': {NO_AGENT_TYPE}"),
    (task(agent={"type": "opencode"}), f"field 'agent.type': {NOT_COOPERATIVE}"),
    (task(run_limits={"stop_early_gate_threshold": 0.0}), f"field 'run_limits.stop_early_gate_threshold': {ZERO_GATE}"),
])
def test_an_armed_task_that_cannot_run_armed_is_refused_in_upstream_order(tmp_path, document, expected):
    assert refusal(tmp_path, document) == expected


def test_the_kill_switch_rescues_what_arming_would_refuse(tmp_path):
    for document in (task(simulation=SIMULATED), task(agent={"type": "opencode"}),
                     task(run_limits={"stop_early_gate_threshold": 0.0})):
        _, lowered = resolve(tmp_path, document, "run_limits.stop_early=false")
        prompt = next(s for s in lowered.steps if s.type == "prompt_agent")
        assert prompt.stop_early is None  # no watcher at all
    # ...and -D can throw it the other way: true from the CLI is refused too
    assert refusal(tmp_path, task(), "run_limits.stop_early=true") == f"field 'run_limits.stop_early': {TRUE_REMOVED}"
    # an unarmed task with gate 0 is no one's business
    resolve(tmp_path, task(success_criteria=[{"type": "file_exists", "path": "a", "description": "d"}],
                           run_limits={"stop_early_gate_threshold": 0.0}))


def test_an_armed_task_configures_the_agents_watcher_with_its_armed_criteria(tmp_path):
    criteria = [ARMED, {"type": "file_exists", "path": "a", "description": "d"},
                {"type": "skill_triggered", "description": "s", "skill_name": "x", "expected_skill": "${row.skill}",
                 "stop_early": {"on_pass": "stop", "decide_within": 3}}]
    document = task(success_criteria=criteria, run_limits={"stop_early_gate_threshold": 0.5, "max_turns": 7},
                    dataset={"rows": [{"id": "r1", "skill": "x"}]})
    _, lowered = resolve(tmp_path, document)
    prompt = next(s for s in lowered.steps if s.type == "prompt_agent")
    assert prompt.stop_early["gate_threshold"] == 0.5 and prompt.stop_early["task_id"] == "t"
    assert [(c["type"], c["stop_early"]) for c in prompt.stop_early["criteria"]] == [
        ("command_executed", {"on_pass": "continue"}), ("skill_triggered", {"on_pass": "stop", "decide_within": 3})]
    assert prompt.stop_early["criteria"][1]["expected_skill"] == "<row.skill>"  # filled per row, as the criteria
