"""stop_early end to end (reference coder_eval.md §4): a Coder Eval task whose agent plays a
scripted trajectory of real tool calls in its sandbox, run through Dagster; the watcher in the
agent ends the turn, the criteria grade the frozen trajectory, the reports flag the stop."""

from __future__ import annotations

import importlib.util
import json
import tempfile
import textwrap
from pathlib import Path

import dagster as dg
import pytest
import yaml
from projects import leaked_servers, make_project

from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.coder_eval import CoderEvalRun, run_coder_eval_task

SKILL_FILE = "skills/date-teller/SKILL.md"
SANDBOX = {"python": None, "template_sources": [
    {"type": "starter_files", "files": [{"path": SKILL_FILE, "content": "# date-teller\nTell the date."}]}]}


def bash(command: str) -> dict:
    return {"tool": "Bash", "arguments": {"command": command}}


LOAD_SKILL = {"tool": "Read", "arguments": {"file_path": SKILL_FILE}}
WRITE_REPORT = {"tool": "Write", "arguments": {"file_path": "report.md", "content": "done"}}
REPORT_EXISTS = {"type": "file_exists", "path": "report.md", "description": "the report is written"}


def never(pattern: str, **fields) -> dict:
    return {"type": "command_executed", "description": f"never {pattern}", "command_pattern": pattern,
            "min_count": 0, "max_count": 0, "stop_early": {}, **fields}


def loads_skill(expected: str = "date-teller", **block) -> dict:
    return {"type": "skill_triggered", "description": "the date-teller skill is loaded", "skill_name": "date-teller",
            "expected_skill": expected, "stop_early": block}


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", tasks={})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def run(project: Path, actions: list[dict], criteria: list[dict], *overrides: str, **fields) -> CoderEvalRun:
    document = {"task_id": "stopper", "description": "d", "initial_prompt": "Tell me the date.",
                "agent": {"type": "replay", "episodes": [{"match": "date", "reply": "All done.", "actions": actions}]},
                "sandbox": SANDBOX, "run_limits": {"max_turns": 10}, "success_criteria": criteria, **fields}
    path = project / "tasks" / "stopper.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    out = Path(tempfile.mkdtemp(prefix="out-", dir=project))  # each run its own reports
    with dg.instance_for_test() as instance:
        return run_coder_eval_task(path, load_config(project), overrides=overrides, output_dir=out, instance=instance)


def ran(result) -> list[tuple[str, str]]:
    return [(c.tool_name, c.result_status) for t in result.iterations for c in t.commands]


def scores(result) -> list[tuple[str, float, bool]]:
    return [(c.criterion_type, c.score, c.advisory) for c in result.success_criteria_results]


def test_a_native_fail_stops_before_the_forbidden_command_and_the_kill_switch_runs_it_in_full(project):
    actions = [bash("mkdir build && touch build/keep"), bash("rm -rf build"), WRITE_REPORT]
    stopped = run(project, actions, [never("rm -rf"), REPORT_EXISTS])
    (result,) = stopped.results
    assert result.early_stop.model_dump() == {
        "reason": "criterion_failed", "deciding_criterion_type": "command_executed",
        "deciding_criterion_description": "never rm -rf", "armed_criteria": ["command_executed: never rm -rf"],
        "sdk_turn_index": 2, "tool_call_index": 2, "elapsed_seconds": result.early_stop.elapsed_seconds,
        "turns_remaining_at_stop": 8, "gate_threshold": 1.0}
    assert ran(result) == [("Bash", "success"), ("Bash", "unknown")]  # dispatched, never run
    assert (Path(result.sandbox_path) / "build" / "keep").exists()
    assert result.final_status.value == "FAILURE" and stopped.exit_code == 1
    assert scores(result) == [("command_executed", 0.0, False), ("file_exists", 0.0, True)]

    out = stopped.reports.run_json.parent
    row = json.loads((out / "run.json").read_text())["task_results"][0]
    assert (row["stopped_early"], row["early_stop_reason"], row["turns_remaining_at_stop"]) == (True, "criterion_failed", 8)
    assert ("> **NOTE:** [stopper] stopped early (criterion_failed); <= 8 turn(s) avoided — gated on armed "
            "criteria only; other criteria are advisory") in (out / "run.md").read_text()
    page = (out / "task.html").read_text()
    assert "stopped early (criterion_failed)</span>" in page and page.count("advisory — not gated") == 1
    task_json = json.loads((out / "default" / "stopper" / "00" / "task.json").read_text())
    assert task_json["early_stop"]["tool_call_index"] == 2
    assert [r.get("advisory") for r in task_json["success_criteria_results"]] == [None, True]

    full_run = run(project, actions, [never("rm -rf"), REPORT_EXISTS], "run_limits.stop_early=false")
    (full,) = full_run.results
    assert full.early_stop is None and len(ran(full)) == 3
    assert not (Path(full.sandbox_path) / "build").exists()
    assert scores(full) == [("command_executed", 0.0, False), ("file_exists", 1.0, False)]  # strict AND, no advisory
    assert full.final_status.value == "FAILURE"
    assert json.loads(full_run.reports.run_json.read_text())["task_results"][0]["stopped_early"] is False
    assert "stopped early" not in full_run.reports.run_md.read_text()


def test_a_live_pass_with_on_pass_stop_banks_the_rest_and_gates_on_the_armed_only(project):
    (result,) = run(project, [bash("ls"), LOAD_SKILL, WRITE_REPORT], [loads_skill(on_pass="stop"), REPORT_EXISTS]).results
    assert (result.early_stop.reason, result.early_stop.tool_call_index) == ("criterion_passed", 2)
    assert ran(result) == [("Bash", "success"), ("Read", "success")]  # the report was never written
    assert scores(result) == [("skill_triggered", 1.0, False), ("file_exists", 0.0, True)]
    assert result.final_status.value == "SUCCESS"  # fired-only gating: the unarmed failure is advisory


@pytest.mark.slow
def test_decide_within_fails_a_criterion_still_undecided_and_spares_one_decided_in_time(project):
    actions = [bash("ls"), bash("date"), LOAD_SKILL, WRITE_REPORT]
    (late,) = run(project, actions, [loads_skill(decide_within=2), REPORT_EXISTS]).results
    assert (late.early_stop.reason, late.early_stop.tool_call_index) == ("decision_budget_exceeded", 2)
    assert late.final_status.value == "FAILURE" and scores(late)[0] == ("skill_triggered", 0.0, False)
    (in_time,) = run(project, actions, [loads_skill(decide_within=3), REPORT_EXISTS]).results
    assert in_time.early_stop is None and len(ran(in_time)) == 4  # a live pass only latches
    assert in_time.final_status.value == "SUCCESS"  # a run it never cut gates strict-AND as always


def test_a_distractor_misfire_waits_until_the_positive_signal_has_resolved(project):
    actions = [bash("curl http://x"), bash("ls"), LOAD_SKILL, WRITE_REPORT]
    (result,) = run(project, actions, [loads_skill(), never("curl"), REPORT_EXISTS]).results
    assert (result.early_stop.reason, result.early_stop.deciding_criterion_type, result.early_stop.tool_call_index) == (
        "criterion_failed", "command_executed", 3)
    assert len(ran(result)) == 3  # the misfire on call 1 did not cut the skill out of the trajectory
    assert scores(result) == [("skill_triggered", 1.0, False), ("command_executed", 0.0, False),
                              ("file_exists", 0.0, True)]
    assert result.final_status.value == "FAILURE"


@pytest.mark.slow
def test_a_light_failure_the_weighted_ceiling_absorbs_does_not_stop_the_run(project):
    criteria = [never("curl", weight=1), never("rm -rf", weight=3), REPORT_EXISTS]
    actions = [bash("curl http://x"), bash("ls"), WRITE_REPORT]
    (absorbed,) = run(project, actions, criteria, run_limits={"max_turns": 10, "stop_early_gate_threshold": 0.7}).results
    assert absorbed.early_stop is None and len(ran(absorbed)) == 3  # ceiling 3/4 still reaches 0.7
    assert absorbed.final_status.value == "FAILURE"  # then strict AND over the full set
    (stopped,) = run(project, actions, criteria).results  # at 1.0 the same misfire dooms the gate
    assert stopped.early_stop.tool_call_index == 1 and len(ran(stopped)) == 1


def test_a_pass_stop_waits_for_a_pass_capable_sibling_outside_its_subset(project):
    criteria = [{"type": "command_executed", "description": "builds", "command_pattern": "make",
                 "stop_early": {"on_pass": "stop"}}, loads_skill(decide_within=5), REPORT_EXISTS]
    actions = [bash("make -v || true"), bash("ls"), LOAD_SKILL, WRITE_REPORT]
    (result,) = run(project, actions, criteria).results
    assert (result.early_stop.reason, result.early_stop.tool_call_index) == ("criterion_passed", 3)
    assert scores(result)[:2] == [("command_executed", 1.0, False), ("skill_triggered", 1.0, False)]
    assert result.final_status.value == "SUCCESS" and len(ran(result)) == 3


def test_one_fanned_line_serves_positive_and_distractor_rows(project):
    """decide_within is inert on the distractor row, the fail trigger on the positive one."""
    criteria = [loads_skill("${row.expected}", decide_within=3)]
    actions = [bash("ls"), LOAD_SKILL, bash("date"), WRITE_REPORT]
    rows = {"rows": [{"id": "positive", "expected": "date-teller"}, {"id": "distractor", "expected": ""}]}
    results = {r.task_id: r for r in run(project, actions, criteria, dataset=rows).results}
    positive, distractor = results["stopper/positive"], results["stopper/distractor"]
    assert positive.early_stop is None and len(ran(positive)) == 4 and positive.final_status.value == "SUCCESS"
    assert (distractor.early_stop.reason, distractor.early_stop.tool_call_index) == ("criterion_failed", 2)
    assert distractor.final_status.value == "FAILURE" and len(ran(distractor)) == 2


def test_the_anthropic_agent_stops_without_asking_the_model_again(tmp_path, fake_messages_api):
    from fakes.messages_api import text_reply, tool_use_reply

    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url})
    path = root / "tasks" / "live.yaml"
    path.write_text(textwrap.dedent("""
        task_id: live
        description: d
        initial_prompt: Tidy up.
        agent: {type: anthropic, model: claude-test}
        sandbox: {python: null}
        run_limits: {max_turns: 5}
        success_criteria:
          - {type: command_executed, description: never rm, command_pattern: "rm -rf", min_count: 0, max_count: 0,
             stop_early: {}}
    """))
    fake_messages_api.enqueue(tool_use_reply("Bash", {"command": "ls"}), tool_use_reply("Bash", {"command": "rm -rf ."}),
                              text_reply("Tidied."))
    with dg.instance_for_test() as instance:
        (result,) = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance).results
    assert len(fake_messages_api.requests) == 2  # the third turn was never requested
    assert (result.early_stop.sdk_turn_index, result.early_stop.tool_call_index,
            result.early_stop.turns_remaining_at_stop) == (2, 2, 3)
    assert ran(result) == [("Bash", "success"), ("Bash", "unknown")] and result.final_status.value == "FAILURE"
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("claude_agent_sdk") is None, reason="claude-agent-sdk is not installed")
def test_claude_code_is_stopped_while_its_forbidden_command_runs(tmp_path, fake_messages_api):
    """Claude Code runs its tools itself: the stop ends the CLI mid-call, so it never finishes."""
    from fakes.messages_api import text_reply, tool_use_reply

    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url})
    config = root / ".agentenv" / "config.toml"
    config.write_text(config.read_text().replace(
        'kind = "replay"\nscript = "agents/reply_to_dana.replay.json"', 'kind = "claude-code"', 1))
    path = root / "tasks" / "coder.yaml"
    path.write_text(textwrap.dedent("""
        task_id: coder
        description: d
        initial_prompt: Tidy up.
        agent: {type: claude-code, model: claude-test, allowed_tools: [Bash]}
        sandbox: {python: null}
        run_limits: {max_turns: 6}
        success_criteria:
          - {type: command_executed, description: never rm, command_pattern: "rm -rf", min_count: 0, max_count: 0,
             stop_early: {}}
    """))
    fake_messages_api.enqueue(tool_use_reply("Bash", {"command": "mkdir build && touch build/keep"}),
                              tool_use_reply("Bash", {"command": "sleep 20; rm -rf build"}), text_reply("Tidied."))
    with dg.instance_for_test() as instance:
        (result,) = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance).results
    assert (result.early_stop.reason, result.early_stop.tool_call_index) == ("criterion_failed", 2), result.error_message
    assert len(fake_messages_api.requests) == 2 and result.final_status.value == "FAILURE"
    assert (Path(result.sandbox_path) / "build" / "keep").exists()
    assert result.duration_seconds < 20
    assert leaked_servers(root / ".agentenv" / "state") == []
