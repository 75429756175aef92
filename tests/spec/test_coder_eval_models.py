"""Coder Eval task YAML (reference coder_eval.md §1): every model and load-time rule with its
exact message, unknown keys (top level warns, nested fails), prompt and path resolution beside
the YAML, experiments, ``-D`` overrides, and the whole checked-in corpus.

Criteria are parsed by ``agentenv_dagster.criteria``; until that package exists these tests run
on a stand-in with the few criterion types they use (the corpus test needs the real one).
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any, ClassVar, Literal

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from agentenv_dagster.errors import TaskLoadError
from projects import NO_CORPUS, upstream_corpus
from agentenv_dagster.spec.coder_eval import (
    DEFAULT_IGNORE_PATTERNS,
    CoderEvalWarning,
    OverrideError,
    TaskDefinition,
    apply_overrides,
    effective_ignore_patterns,
    is_coder_eval_document,
    load_coder_eval_experiment,
    load_coder_eval_task,
    load_dataset_rows,
    parse_override,
)

try:
    import agentenv_dagster.criteria  # noqa: F401

    REAL_CRITERIA = True
except ImportError:
    REAL_CRITERIA = False
UPSTREAM = upstream_corpus()
CORPUS = UPSTREAM / "coder_eval" if UPSTREAM else Path("upstream-corpus-absent")
needs_corpus = pytest.mark.skipif(UPSTREAM is None, reason=NO_CORPUS)


# -- a stand-in for agentenv_dagster.criteria while it does not exist --------------------------


class _Criterion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    requires_agent: ClassVar[bool] = False
    description: str
    weight: float = 1.0
    pass_threshold: float = 0.9
    suite_thresholds: dict[str, float] | None = None


class _FileExists(_Criterion):
    type: Literal["file_exists"]
    path: str


class _RunCommand(_Criterion):
    type: Literal["run_command"]
    command: str


class _CommandExecuted(_Criterion):
    requires_agent: ClassVar[bool] = True
    type: Literal["command_executed"]
    command_pattern: str | None = None
    min_count: int = 1
    max_count: int | None = None


class _ReferenceComparison(_Criterion):
    requires_agent: ClassVar[bool] = True
    type: Literal["reference_comparison"]
    agent_file: str
    reference_file: str


class _LlmJudge(_Criterion):
    type: Literal["llm_judge"]
    prompt: str
    files: list[str] = []


_STAND_IN = {c.model_fields["type"].annotation.__args__[0]: c for c in (
    _FileExists, _RunCommand, _CommandExecuted, _ReferenceComparison, _LlmJudge)}


def _stand_in_parse_criterion(data: dict[str, Any]) -> BaseModel:
    if data.get("type") not in _STAND_IN:
        raise ValueError(f"unknown criterion type {data.get('type')!r}")
    return _STAND_IN[data["type"]].model_validate(data)


@pytest.fixture(autouse=True)
def criteria_package(monkeypatch):
    if not REAL_CRITERIA:
        module = types.ModuleType("agentenv_dagster.criteria")
        module.parse_criterion = _stand_in_parse_criterion
        monkeypatch.setitem(sys.modules, "agentenv_dagster.criteria", module)


# -- helpers ---------------------------------------------------------------------------------


def exists(path: str = "app.py", **extra: Any) -> dict[str, Any]:
    return {"type": "file_exists", "path": path, "description": f"{path} exists", **extra}


def task(**fields: Any) -> dict[str, Any]:
    """A valid task with ``fields`` replaced; a field set to ``...`` is removed."""
    document = {"task_id": "t", "description": "d", "initial_prompt": "Do it.", "success_criteria": [exists()]}
    document.update(fields)
    return {key: value for key, value in document.items() if value is not ...}


def write(tmp_path: Path, data: Any, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def load(tmp_path: Path, data: Any):
    return load_coder_eval_task(write(tmp_path, data))


def problems(tmp_path: Path, data: Any, name: str = "task.yaml", loader=load_coder_eval_task) -> list[str]:
    """Every reported problem, minus the file prefix (which is checked here)."""
    path = write(tmp_path, data, name)
    with pytest.raises(TaskLoadError) as info:
        loader(path)
    assert all(error.file == str(path) for error in info.value.errors)
    return [str(error).removeprefix(f"{path}: ") for error in info.value.errors]


def problem(tmp_path: Path, data: Any) -> str:
    found = problems(tmp_path, data)
    assert len(found) == 1, found
    return found[0]


# -- the task and its unknown keys -----------------------------------------------------------


def test_a_minimal_task_loads_with_upstream_defaults(tmp_path):
    loaded = load(tmp_path, task())
    t = loaded.task
    assert (loaded.source, loaded.warnings) == (tmp_path / "task.yaml", [])
    assert (t.task_id, t.initial_prompt, t.tags, t.skip, t.agent) == ("t", "Do it.", [], False, None)
    assert (t.sandbox.driver, t.sandbox.python.env_packages, t.sandbox.limits.timeout) == ("tempdir", [], 300)
    assert (t.sandbox.docker.network, t.sandbox.docker.image) == ("bridge", "coder-eval-agent:latest")
    assert "HOME" in t.sandbox.docker.env_passthrough
    assert [c.type for c in t.success_criteria] == ["file_exists"]
    assert (t.run_limits, t.reference, t.dataset, t.simulation, t.pre_run, t.post_run) == (None,) * 4 + ([], [])


def test_unknown_top_level_keys_warn_once_each_and_are_dropped(tmp_path):
    loaded = load(tmp_path, task(max_iterations=3, agents=[], task_timeout=900))
    path = tmp_path / "task.yaml"
    tail = ". If this is a typo, fix it; if the field is stale from a previous schema, remove it."
    assert loaded.warnings == [
        f"{path}: field 'max_iterations': unknown top-level field will be ignored{tail}",
        f"{path}: field 'agents': unknown top-level field will be ignored (did you mean 'agent'?){tail}",
        f"{path}: field 'task_timeout': unknown top-level field will be ignored "
        f"(did you mean 'run_limits.task_timeout'?){tail}",
    ]
    assert "max_iterations" not in loaded.task.model_dump()


@pytest.mark.skipif(not REAL_CRITERIA, reason="the suite metrics are the real criteria's")
def test_a_suite_threshold_on_a_metric_never_computed_warns_naming_the_ones_there_are(tmp_path):
    label = {"type": "classification_match", "path": "label.txt", "description": "the label",
             "expected_label": "bug", "allowed_labels": ["bug", "billing"]}
    loaded = load(tmp_path, task(dataset={"rows": [{"id": "a", "label": "bug"}]}, success_criteria=[
        exists(suite_thresholds={"mean": 0.5, "completion_rate": 1.0, "pass_rate": 0.5}),
        {**label, "suite_thresholds": {"f1.macro": 0.5, "recall.bug": 0.5, "precision.(none)": 0.0, "recall.bugs": 0.5}},
        {**label, "expected_label": "${row.label}", "suite_thresholds": {"recall.any-label": 0.5, "f1.weighted": 0.5}},
    ]))
    found = {w.removeprefix(f"{tmp_path / 'task.yaml'}: ").split(", so this gate")[0]: w.split("it computes: ")[1]
             for w in loaded.warnings}
    assert list(found) == [
        "field 'success_criteria.0.suite_thresholds.pass_rate': file_exists computes no suite metric 'pass_rate'",
        "field 'success_criteria.1.suite_thresholds.f1.macro': classification_match computes no suite metric "
        "'f1.macro' (did you mean 'macro_f1'?)",
        "field 'success_criteria.1.suite_thresholds.recall.bugs': classification_match computes no suite metric "
        "'recall.bugs' (did you mean 'recall.bug'?)",
        # labels from the rows: any label's metric may be computed, the averages never under f1.<label>
        "field 'success_criteria.2.suite_thresholds.f1.weighted': classification_match computes no suite metric "
        "'f1.weighted' (did you mean 'weighted_f1'?)",
    ]
    listed = list(found.values())
    assert listed[0] == "count, mean, median, std, min, max, completion_rate"
    assert "accuracy, macro_f1, weighted_f1, micro_f1, precision.bug, recall.bug, f1.bug" in listed[1]
    assert "recall.(none)" in listed[1] and "recall.(other)" in listed[1]
    assert listed[3].endswith("precision.<label>, recall.<label>, f1.<label>")


def test_outside_the_loader_an_unknown_top_level_key_is_a_python_warning():
    with pytest.warns(CoderEvalWarning, match="field 'max_iterations': unknown top-level field"):
        TaskDefinition.model_validate(task(max_iterations=1))


@pytest.mark.parametrize(("fields", "expected"), [
    ({"sandbox": {"network_enabled": False}}, "field 'sandbox.network_enabled': unknown field"),
    ({"sandbox": {"docker": {"netwrk": "none"}}}, "field 'sandbox.docker.netwrk': unknown field (did you mean 'network'?)"),
    ({"run_limits": {"max_turn": 3}}, "field 'run_limits.max_turn': unknown field (did you mean 'max_turns'?)"),
    ({"dataset": {"path": "rows.jsonl"}}, "field 'dataset.path': unknown field (did you mean 'paths'?)"),
    ({"pre_run": [{"command": "true", "timout": 5}]}, "field 'pre_run.0.timout': unknown field (did you mean 'timeout'?)"),
    ({"post_run": [{"command": "true", "fail_on_error": False}]}, "field 'post_run.0.fail_on_error': unknown field"),
    ({"agent": {"type": "claude-code", "modle": "x"}}, "field 'agent.modle': unknown field (did you mean 'model'?)"),
    ({"agent": {"type": "codex", "thinking_level": "low"}}, "field 'agent.thinking_level': unknown field"),
    ({"agent": {"type": "claude-code", "max_turns": 5}},
     "field 'agent.max_turns': unknown field (run caps live in run_limits: set run_limits.max_turns)"),
    ({"success_criteria": [exists(pth="x")]}, "field 'success_criteria.0.pth': unknown field (did you mean 'path'?)"),
    ({"sandbox": {"template_sources": [{"type": "template_dir", "path": "t", "mount": "x"}]}},
     "field 'sandbox.template_sources.0.mount': unknown field (did you mean 'mount_point'?)"),
])
def test_an_unknown_nested_key_fails_with_its_path(tmp_path, fields, expected):
    assert problem(tmp_path, task(**fields)) == expected


def test_every_problem_of_a_file_is_reported_at_once(tmp_path):
    assert problems(tmp_path, task(
        description=..., agent={"type": "pi", "thinking_level": "extreme"}, run_limits={"task_timeout": 10},
        success_criteria=[exists(), {"type": "file_exists", "description": "no path"}],
    )) == [
        "field 'description': required field is missing",
        "field 'agent.thinking_level': Input should be 'off', 'minimal', 'low', 'medium', 'high', 'xhigh' "
        "or 'max' (got 'extreme')",
        "field 'success_criteria.1.path': required field is missing",
        "field 'run_limits.task_timeout': Input should be greater than or equal to 30 (got 10)",
    ]


# -- the model-level rules of §1.1 -----------------------------------------------------------

NEEDS_A_PROMPT = (
    "field 'initial_prompt': Either 'initial_prompt' or 'initial_prompt_file' must be provided (unless "
    "'simulation.enabled' is true, in which case the simulator generates the opener, or 'agent.type' is "
    "'none', in which case no agent runs)"
)
SIMULATION = {"enabled": True, "persona": "A busy analyst.", "goal": "A dice roller."}


@pytest.mark.parametrize(("fields", "expected"), [
    ({"initial_prompt_file": "p.md"}, "field 'initial_prompt_file': Only one of 'initial_prompt' or "
     "'initial_prompt_file' can be provided, not both"),
    ({"initial_prompt": ...}, NEEDS_A_PROMPT),
    ({"initial_prompt": ..., "simulation": {**SIMULATION, "enabled": False}}, NEEDS_A_PROMPT),
    ({"agent": {"type": "none"}}, "field 'initial_prompt': A 'type: none' task must not set 'initial_prompt' / "
     "'initial_prompt_file' (no agent runs to read it). Remove the prompt or pick a real agent type."),
    ({"agent": {"type": "none"}, "initial_prompt": ..., "simulation": SIMULATION}, "field 'simulation.enabled': "
     "A 'type: none' task cannot enable 'simulation' (no agent for the simulator to talk to). Remove the "
     "simulation block or pick a real agent type."),
    ({"agent": {"type": "none"}, "initial_prompt": ..., "success_criteria": [
        exists(), {"type": "command_executed", "description": "ran", "command_pattern": "x"}]},
     "field 'success_criteria': A 'type: none' task cannot use criteria that require an agent trajectory: "
     "['command_executed']. Use agent-independent criteria (run_command, file_exists, file_contains, "
     "json_check, file_matches_regex, file_check, ...)."),
    ({"success_criteria": [
        {"type": "reference_comparison", "agent_file": "a.py", "reference_file": "a.py", "description": "like"},
        {"type": "llm_judge", "prompt": "Grade.", "files": ["out.md", "$REFERENCE_DIR/rubric.md"], "description": "j"},
        {"type": "run_command", "command": 'diff -r "$REFERENCE_DIR" out/', "description": "same"}]},
     "field 'reference': These criteria consume the reference solution but the task defines no 'reference:' "
     "block: ['reference_comparison (needs a reference to compare against)', 'llm_judge (files: uses "
     "$REFERENCE_DIR)', 'run_command (command: uses $REFERENCE_DIR)']. Add `reference: {directory: <path>}`."),
    ({"success_criteria": [exists(), exists("b.py", suite_thresholds={"mean": 0.5})]},
     "field 'success_criteria.1.suite_thresholds': success_criteria['file_exists'].suite_thresholds requires a "
     "dataset: block (thresholds are evaluated on aggregated across-row metrics)"),
    ({"tags": ["smoke", "Bad_Tag"]}, "field 'tags.1': Tag 'Bad_Tag' must be lowercase kebab-case, optionally "
     "namespaced as 'key:value' (e.g., 'smoke', 'uipath-python', 'lifecycle:generate')"),
    ({"success_criteria": [exists(), {"type": "program_stdout_equals", "description": "old"}]},
     "field 'success_criteria.1.type': Criterion type 'program_stdout_equals' has been removed. Use "
     "'run_command' with 'expected_stdout' and 'stdout_match' instead."),
    ({"success_criteria": [{"type": "code_lints", "description": "old"}]}, "field 'success_criteria.0.type': "
     "Criterion type 'code_lints' has been removed. Use 'run_command' to run your linter directly instead."),
    ({"success_criteria": [{"type": "scored_command", "description": "old"}]}, "field 'success_criteria.0.type': "
     "Criterion type 'scored_command' has been removed. Use 'run_command' with 'score_from_stdout: true' instead."),
    ({"success_criteria": []}, "field 'success_criteria': At least one success criterion must be defined"),
    ({"success_criteria": ...}, "field 'success_criteria': required field is missing"),
])
def test_each_task_rule_has_its_upstream_message(tmp_path, fields, expected):
    assert problem(tmp_path, task(**fields)) == expected


def test_the_first_failing_rule_is_the_one_reported(tmp_path):
    # both prompts AND a none agent: the prompt rule is defined first
    assert problem(tmp_path, task(agent={"type": "none"}, initial_prompt_file="p.md")).startswith(
        "field 'initial_prompt_file': Only one of")


@pytest.mark.parametrize("fields", [
    {"initial_prompt": ..., "simulation": SIMULATION},
    {"initial_prompt": ..., "agent": {"type": "none"}},
    {"reference": {"directory": "ref"}, "success_criteria": [
        {"type": "run_command", "command": "diff -r $REFERENCE_DIR out", "description": "same"}]},
    {"success_criteria": [{"type": "llm_judge", "prompt": "p", "files": ["$REFERENCE_DIRECTORY/x"], "description": "j"}]},
    {"dataset": {"rows": [{"id": "a"}]}, "success_criteria": [exists(suite_thresholds={"mean": 0.5})]},
    {"suite_id": "parent", "success_criteria": [exists(suite_thresholds={"mean": 0.5})]},
    {"tags": ["smoke", "uipath-python", "lifecycle:generate", "t3"]},
], ids=["simulation-opens", "none-agent", "reference-set", "not-the-token", "dataset", "expanded-row", "tags"])
def test_what_the_rules_allow(tmp_path, fields):
    load(tmp_path, task(**fields))


def test_command_not_executed_is_command_executed_that_matches_nothing(tmp_path):
    [criterion] = load(tmp_path, task(success_criteria=[
        {"type": "command_not_executed", "command_pattern": "rm -rf", "description": "no rm"}])).task.success_criteria
    assert (criterion.type, criterion.min_count, criterion.max_count) == ("command_executed", 0, 0)


# -- reference, simulation, pre/post run -----------------------------------------------------


def test_reference_is_a_directory_beside_the_yaml(tmp_path):
    assert load(tmp_path, task(reference={"directory": "  ref  "})).task.reference.directory == str(tmp_path / "ref")


@pytest.mark.parametrize(("reference", "expected"), [
    ({"code": "x = 1"}, "field 'reference.code': reference.code was removed — a reference is now always a "
     "DIRECTORY. Move the solution into a directory and use `reference: {directory: <dir>}` (a single-file "
     "reference is a directory containing one file). See docs/TASK_DEFINITION_GUIDE.md#reference-solutions."),
    ({"directory": "   "}, "field 'reference.directory': reference.directory must be a non-empty path relative "
     "to the task YAML directory."),
])
def test_reference_forms_that_are_refused(tmp_path, reference, expected):
    assert problem(tmp_path, task(reference=reference)) == expected


@pytest.mark.parametrize(("simulation", "expected"), [
    ({**SIMULATION, "persona": "  "}, "field 'simulation.persona': must be a non-empty string"),
    ({**SIMULATION, "stop_on_criteria_pass": True}, "field 'simulation.stop_on_criteria_pass': "
     "simulation.stop_on_criteria_pass=True requires check_criteria='every_turn' or 'both' — set "
     "check_criteria accordingly, or disable stop_on_criteria_pass."),
    ({**SIMULATION, "max_turns": 101}, "field 'simulation.max_turns': Input should be less than or equal to 100 (got 101)"),
    ({"enabled": True, "goal": "g"}, "field 'simulation.persona': required field is missing"),
])
def test_simulation_rules(tmp_path, simulation, expected):
    assert problem(tmp_path, task(simulation=simulation)) == expected


def test_pre_run_and_post_run_defaults_and_bounds(tmp_path):
    t = load(tmp_path, task(pre_run=[{"command": "seed"}], post_run=[{"command": "tar", "timeout": 300}])).task
    assert (t.pre_run[0].timeout, t.pre_run[0].fail_on_error, t.post_run[0].timeout) == (30, True, 300)
    assert problem(tmp_path, task(pre_run=[{"command": "x", "timeout": 301}])) == (
        "field 'pre_run.0.timeout': Input should be less than or equal to 300 (got 301)")


# -- agent configs ---------------------------------------------------------------------------


@pytest.mark.parametrize(("agent", "expected"), [
    ({"permission_mode": "plan"}, {"type": None, "permission_mode": "plan"}),
    ({"type": "claude-code"}, {"permission_mode": "acceptEdits", "system_prompt_mode": "append",
                               "sdk_options": {}, "setting_sources": None, "claude_settings": None}),
    ({"type": "codex", "model": "gpt-5.5"}, {"model": "gpt-5.5"}),
    ({"type": "antigravity"}, {"thinking_level": "medium"}),
    ({"type": "opencode"}, {"variant": None, "pure": True, "require_token_telemetry": True}),
    ({"type": "pi", "thinking_level": "xhigh"}, {"thinking_level": "xhigh"}),
    ({"type": "delegate", "effort": "max"}, {"effort": "max", "project_id": None, "enable_computer_use": False}),
    ({"type": "anthropic", "max_turns": 3, "system_prompt": "Be brief."}, {"model": None, "max_turns": 3}),
    ({"type": "replay", "episodes": [{"match": "(?i)hello", "reply": "Hi.", "actions": [
        {"write_file": "out.txt", "content": "x"}, {"tool": "send", "arguments": {"to": "a"}}, {"sleep": 0.1}]}]},
     {"script": None, "delay_seconds": 0.0}),
    ({"type": "claude-code", "additional_ignore_patterns": [" *.bak ", "!dist"]}, {"ignore_patterns": ["*.bak", "!dist"]}),
    ({"type": "claude-code", "system_prompt": "   "}, {"system_prompt": None}),
])
def test_each_agent_kind_loads_with_its_fields(tmp_path, agent, expected):
    dumped = load(tmp_path, task(agent=agent)).task.model_dump()["agent"]
    assert {key: dumped[key] for key in expected} == expected


@pytest.mark.parametrize(("agent", "expected"), [
    ({"type": "openhands"}, "field 'agent.type': No agent registered for type 'openhands'. Registered kinds: "
     "['anthropic', 'antigravity', 'claude-code', 'codex', 'delegate', 'none', 'opencode', 'pi', 'replay']"),
    ({"type": "claude-code", "system_prompt_mode": "replace"}, "field 'agent.system_prompt_mode': "
     "system_prompt_mode='replace' requires system_prompt (or system_prompt_file) to be set — there is no prompt "
     "to replace the Claude Code default with"),
    ({"type": "claude-code", "sdk_options": {"effort": "high", "hooks": {}}}, "field 'agent.sdk_options.hooks': "
     "sdk_options key 'hooks' is framework-managed; set it as a top-level AgentConfig field instead"),
    ({"type": "codex", "system_prompt": "a", "system_prompt_file": "b.md"}, "field 'agent.system_prompt': "
     "Only one of 'system_prompt' or 'system_prompt_file' can be provided, not both"),
    ({"type": "antigravity", "thinking_level": "xhigh"}, "field 'agent.thinking_level': Input should be "
     "'minimal', 'low', 'medium' or 'high' (got 'xhigh')"),
    ({"type": "claude-code", "plugins": [{"type": "remote", "path": "p"}]},
     "field 'agent.plugins.0.type': Input should be 'local' (got 'remote')"),
    ({"type": "claude-code", "ignore_patterns": ["!"]},
     "field 'agent.ignore_patterns': ignore pattern entry '!' is bare negation with no target"),
    ({"type": "replay"}, "field 'agent.script': a replay agent needs exactly one of 'script' or 'episodes'"),
    ({"type": "replay", "episodes": [{"match": "(", "reply": "r"}]}, "field 'agent.episodes.0.match': 'match' "
     "must be a regular expression (missing ), unterminated subpattern at position 0)"),
    ({"type": "replay", "episodes": [{"match": "x", "reply": "r", "actions": [{"tool": "t", "sleep": 1}]}]},
     "field 'agent.episodes.0.actions.0': each action needs exactly one of ('tool', 'write_file', 'sleep'), "
     "got ['tool', 'sleep']"),
    ({"type": "anthropic", "max_turns": 0}, "field 'agent.max_turns': Input should be greater than 0 (got 0)"),
    ("claude-code", "field 'agent': must be a mapping, got str"),
])
def test_agent_config_rules(tmp_path, agent, expected):
    assert problem(tmp_path, task(agent=agent)) == expected


# -- sandbox and templates -------------------------------------------------------------------


def test_a_docker_sandbox_with_every_knob(tmp_path):
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "Dockerfile").write_text("FROM scratch\n")
    sandbox = load(tmp_path, task(sandbox={
        "driver": "docker", "python": None, "node": {"env_packages": ["@uipath/cli"]},
        "limits": {"timeout": 60, "max_memory_mb": 512, "max_cpus": 1.5, "max_pids": 64},
        "docker": {"dockerfile_path": "env/Dockerfile", "network": "llm_only", "working_dir": "/app",
                   "build": {"args": {"V": "1"}, "secrets": ["id=s,env=S"], "buildkit": True},
                   "env_passthrough_extra": ["MY_TOKEN"], "extra_mounts": ["/data:/data:ro"]},
        "mock_path_dirs": ["mocks"],
        "record_cli": [{"tool": "uip", "stderr": "nope\n", "responses": [{"when": {"verb": "ixp a"}, "stdout": "A\n"}]}],
        "ignore_patterns": ["!node_modules", "*.bak"],
    })).task.sandbox
    assert sandbox.docker.dockerfile_path == str(tmp_path / "env" / "Dockerfile")
    assert (sandbox.python, sandbox.limits.max_cpus, sandbox.docker.build.secrets) == (None, 1.5, ["id=s,env=S"])
    assert (sandbox.record_cli[0].exit_code, sandbox.record_cli[0].responses[0].exit_code) == (1, 0)


def test_ignore_patterns_add_to_and_remove_from_the_defaults():
    patterns = effective_ignore_patterns(["!node_modules", " *.bak ", "!not-a-default"])
    assert patterns == (set(DEFAULT_IGNORE_PATTERNS) - {"node_modules"}) | {"*.bak"}
    assert {".git", "__pycache__", "cli_mocks"} <= patterns
    with pytest.raises(ValueError, match=r"^ignore pattern entry is empty or whitespace-only: '  '$"):
        effective_ignore_patterns(["  "])


@pytest.mark.parametrize(("sandbox", "expected"), [
    ({"driver": "podman"}, "field 'sandbox.driver': Input should be 'tempdir' or 'docker' (got 'podman')"),
    ({"docker": {"working_dir": "app"}}, "field 'sandbox.docker.working_dir': working_dir 'app' must be an "
     "absolute path or the sentinel 'auto'."),
    ({"docker": {"working_dir": "/work/input/"}}, "field 'sandbox.docker.working_dir': working_dir '/work/input/' "
     "collides with a framework-reserved container path (/, /work, /work/*). Choose the task image's own WORKDIR "
     "(e.g. /root, /app)."),
    ({"limits": {"max_cpus": 0}}, "field 'sandbox.limits.max_cpus': Input should be greater than 0 (got 0)"),
    ({"record_cli": [{"tool": "bin/uip"}]}, "field 'sandbox.record_cli.0.tool': tool 'bin/uip' must be a bare "
     "executable name matching [A-Za-z0-9._+-]+"),
    ({"record_cli": [{"tool": "git"}]}, "field 'sandbox.record_cli.0.tool': tool 'git' is reserved: the sandbox "
     "itself runs it (['bash', 'cmd', 'env', 'git', 'node', 'py', 'python', 'python3', 'sh', 'uv', 'zsh'])"),
    ({"record_cli": [{"tool": "uip.cmd"}]}, "field 'sandbox.record_cli.0.tool': tool 'uip.cmd' would collide with "
     "the shim's own files (calls.jsonl, *.cmd, *.bat)"),
    ({"record_cli": [{"tool": "uip", "responses": [{"when": {}}]}]}, "field 'sandbox.record_cli.0.responses.0.when': "
     "Dictionary should have at least 1 item after validation, not 0 (got {})"),
    ({"mock_path_dirs": ["mocks", "../bin"]}, "field 'sandbox.mock_path_dirs.1': mock_path_dirs entry must not "
     "contain '..' segments, got: '../bin'"),
    ({"template_sources": [{"type": "starter_files", "files": [{"path": "/etc/passwd", "content": ""}]}]},
     "field 'sandbox.template_sources.0.files.0.path': path must be a relative path, got: '/etc/passwd'"),
    ({"template_sources": [{"type": "template_dir", "path": "t", "mount_point": "a/../../b"}]},
     "field 'sandbox.template_sources.0.mount_point': mount_point must not contain '..' segments, got: 'a/../../b'"),
    ({"template_sources": [{"type": "template_dir", "path": "t", "mount_point": ""}]},
     "field 'sandbox.template_sources.0.mount_point': mount_point must not be empty"),
    ({"template_sources": [{"type": "zip", "url": "u"}]}, "field 'sandbox.template_sources.0.type': unknown "
     "template source type 'zip' (expected one of: template_dir, starter_files, repo)"),
    ({"template_sources": [{"type": "template_dir", "path": "t"}, {"type": "repo", "url": "u"}]},
     "field 'sandbox.template_sources.1': RepoSource must be the first element in template_sources (git clone "
     "requires an empty directory)."),
    ({"template_sources": [{"type": "repo", "url": "u"}, {"type": "repo", "url": "v"}]},
     "field 'sandbox.template_sources.1': Only one RepoSource is allowed in template_sources."),
])
def test_sandbox_rules(tmp_path, sandbox, expected):
    assert problem(tmp_path, task(sandbox=sandbox)) == expected


def test_template_dirs_resolve_beside_the_yaml_with_env_vars_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPLATES", "/opt/templates")
    sources = load(tmp_path, task(sandbox={"template_sources": [
        {"type": "repo", "url": "https://example.com/r.git", "commit": "abc"},
        {"type": "template_dir", "path": "../starter", "mount_point": "c"},
        {"type": "template_dir", "path": "${TEMPLATES}/py"},
        {"type": "starter_files", "files": [{"path": "src/main.py", "content": "pass\n"}]},
    ]})).task.sandbox.template_sources
    assert [s.type for s in sources] == ["repo", "template_dir", "template_dir", "starter_files"]
    assert (sources[1].path, sources[1].mount_point) == (str(tmp_path.parent / "starter"), "c")
    assert sources[2].path == "/opt/templates/py"


def test_an_undefined_env_var_in_a_template_dir_is_a_load_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_TEMPLATE_ROOT", raising=False)
    assert problem(tmp_path, task(sandbox={"template_sources": [
        {"type": "template_dir", "path": "$NO_SUCH_TEMPLATE_ROOT/x"}]})) == (
        "field 'sandbox.template_sources.0.path': Template path '$NO_SUCH_TEMPLATE_ROOT/x' references undefined "
        "environment variable(s): $NO_SUCH_TEMPLATE_ROOT. Set them before loading the task (e.g. in .env) so the "
        "template directory can be resolved.")


def test_many_template_sources_load_with_a_warning(tmp_path):
    sources = [{"type": "starter_files", "files": [{"path": f"f{i}", "content": ""}]} for i in range(11)]
    assert load(tmp_path, task(sandbox={"template_sources": sources})).warnings == [
        f"{tmp_path / 'task.yaml'}: field 'template_sources': Many template sources (11) - this may be a misconfiguration"]


def test_a_missing_dockerfile_is_a_load_error(tmp_path):
    assert problem(tmp_path, task(sandbox={"docker": {"dockerfile_path": "./environment/Dockerfile"}})) == (
        f"field 'sandbox.docker.dockerfile_path': Dockerfile not found: {tmp_path / 'environment' / 'Dockerfile'}")


def test_run_limits(tmp_path):
    limits = load(tmp_path, task(run_limits={"max_turns": 20, "task_timeout": 600, "max_usd": 2.5,
                                             "max_tool_calls": 5, "stop_early": False})).task.run_limits
    assert (limits.max_turns, limits.turn_timeout, limits.stop_early_gate_threshold) == (20, None, 1.0)
    assert load(tmp_path, task(run_limits={})).task.run_limits.max_turns is None
    assert problem(tmp_path, task(run_limits={"stop_early_gate_threshold": 1.5})) == (
        "field 'run_limits.stop_early_gate_threshold': Input should be less than or equal to 1 (got 1.5)")


# -- prompt files, replay scripts ------------------------------------------------------------


def test_prompt_files_are_read_beside_the_yaml_and_inlined(tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "task.md").write_text("\n  Build it.  \n")
    (tmp_path / "system.md").write_text("You are terse.\n")
    t = load(tmp_path, task(initial_prompt=..., initial_prompt_file="prompts/task.md",
                            agent={"type": "claude-code", "system_prompt_file": "system.md"})).task
    assert (t.initial_prompt, t.initial_prompt_file) == ("Build it.", None)
    assert (t.agent.system_prompt, t.agent.system_prompt_file) == ("You are terse.", None)


def test_missing_or_blank_prompt_files(tmp_path):
    (tmp_path / "blank.md").write_text("  \n")
    assert problems(tmp_path, task(initial_prompt=..., initial_prompt_file="nope.md",
                                   agent={"type": "codex", "system_prompt_file": "gone.md"})) == [
        f"field 'initial_prompt_file': initial_prompt_file not found: {tmp_path / 'nope.md'}",
        f"field 'agent.system_prompt_file': system_prompt_file not found: {tmp_path / 'gone.md'}",
    ]
    assert problem(tmp_path, task(agent={"type": "claude-code", "system_prompt_mode": "replace",
                                         "system_prompt_file": "blank.md"})) == (
        f"field 'agent.system_prompt_file': system_prompt_file {tmp_path / 'blank.md'} is empty; "
        "system_prompt_mode='replace' requires a prompt to replace the Claude Code default with")
    assert load(tmp_path, task(agent={"type": "codex", "system_prompt_file": "blank.md"})).task.agent.system_prompt is None


def test_a_replay_script_is_resolved_and_checked_at_load(tmp_path):
    (tmp_path / "agent.replay.json").write_text('{"episodes": [{"match": "hi", "reply": "Hello."}]}')
    (tmp_path / "broken.json").write_text('{"episodes": [{"match": "hi"}]}')
    agent = load(tmp_path, task(agent={"type": "replay", "script": "agent.replay.json", "delay_seconds": 1})).task.agent
    assert (agent.script, agent.delay_seconds) == (str(tmp_path / "agent.replay.json"), 1.0)
    assert problem(tmp_path, task(agent={"type": "replay", "script": "missing.json"})) == (
        f"field 'agent.script': replay script not found: {tmp_path / 'missing.json'}")
    assert problem(tmp_path, task(agent={"type": "replay", "script": "broken.json"})) == (
        f"field 'agent.script': replay script {tmp_path / 'broken.json'}: episodes.0.reply: required field is missing")


# -- datasets --------------------------------------------------------------------------------


def test_dataset_paths_resolve_beside_the_yaml_and_their_rows_load(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"id": "a", "split": "train"}\n\n{"id": "b.2"}\n')
    dataset = load(tmp_path, task(dataset={"paths": ["rows.jsonl"], "sample_per_stratum": 2})).task.dataset
    assert (dataset.paths, dataset.id_field, dataset.split_field) == ([str(tmp_path / "rows.jsonl")], "id", "split")
    assert [row["id"] for row in load_dataset_rows(dataset, Path("/elsewhere"))] == ["a", "b.2"]


@pytest.mark.parametrize(("dataset", "rows_file", "expected"), [
    ({}, None, "field 'dataset': Dataset must specify either 'paths' or 'rows'"),
    ({"paths": ["r.jsonl"], "rows": []}, None, "field 'dataset': Dataset must specify only one of 'paths' or 'rows'"),
    ({"paths": []}, None, "field 'dataset.paths': Dataset.paths must be a non-empty list"),
    ({"rows": [{"id": "a"}], "sample_per_stratum": 0}, None,
     "field 'dataset.sample_per_stratum': Input should be greater than or equal to 1 (got 0)"),
    ({"paths": ["missing.jsonl"]}, None, "field 'dataset.paths': Dataset file not found: {dir}/missing.jsonl"),
    ({"paths": ["r.jsonl"]}, '{"id": "a"}\n{oops\n', "field 'dataset.paths': Dataset {dir}/r.jsonl: invalid JSON on "
     "line 2: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ({"paths": ["r.jsonl"]}, '[1]\n', "field 'dataset.paths': Dataset {dir}/r.jsonl: row on line 1 is not a JSON "
     "object: [1]"),
    ({"rows": [{"id": "a"}, {"name": "b"}]}, None, "field 'dataset.rows': Dataset row 1 for task 't' missing "
     "id_field 'id': {'name': 'b'}"),
    ({"rows": [{"id": "a"}, {"id": "a"}]}, None, "field 'dataset.rows': Duplicate dataset row id for task 't': 'a'"),
    ({"rows": [{"id": "a/b"}]}, None, "field 'dataset.rows': Dataset row id 'a/b' must match "
     "^[A-Za-z0-9_][A-Za-z0-9_.\\-]*$ (letters, digits, underscore, hyphen, dot)"),
])
def test_dataset_rules(tmp_path, dataset, rows_file, expected):
    if rows_file is not None:
        (tmp_path / "r.jsonl").write_text(rows_file)
    assert problem(tmp_path, task(dataset=dataset)) == expected.replace("{dir}", str(tmp_path))


# -- the file itself -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("task_id: t\ndescription: [unclosed\n", "invalid YAML at line 3 column 1: expected ',' or ']', but got '<stream end>'"),
    ("task_id: t\n  bad: indent\n", "invalid YAML at line 2 column 6: mapping values are not allowed here"),
    ("- a\n- b\n", "a Coder Eval task must be a YAML mapping, got list"),
    ("", "a Coder Eval task must be a YAML mapping, got an empty document"),
])
def test_the_file_must_be_a_yaml_mapping(tmp_path, text, expected):
    assert problems(tmp_path, text) == [expected]


def test_a_misspelled_required_key_is_named_at_its_line_with_the_right_spelling(tmp_path):
    path = write(tmp_path, task(success_criteria=..., sucess_criteria=[exists()]))
    with pytest.raises(TaskLoadError) as info:
        load_coder_eval_task(path)
    assert [str(e) for e in info.value.errors] == [
        f"{path}:4: field 'sucess_criteria': unknown field (did you mean 'success_criteria'? 'success_criteria' is required)"]


@pytest.mark.parametrize(("document", "expected"), [
    ({"experiment_id": "e", "variants": []}, "a Coder Eval experiment, not a task: run a task under it with "
     "`agentenv-dagster run TASK --experiment FILE` (or list it under [experiments])"),
    ({"task_id": "t", "steps": []}, "not a Coder Eval task (a mapping with task_id and success_criteria)"),
])
def test_a_document_that_is_no_task_says_what_it_is(tmp_path, document, expected):
    assert problems(tmp_path, document) == [expected]


def test_a_billion_laughs_task_is_refused_in_one_short_line(tmp_path):
    anchors = ["a0: &a0 [lol]", *(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 7))]
    text = "task_id: t\ninitial_prompt: p\n" + "\n".join(anchors) + "\ndescription: *a6\nsuccess_criteria: []\n"
    assert problems(tmp_path, text) == [
        "YAML aliases would add more than 100,000 nodes to this document (an alias expanding into aliases, "
        "as in a 'billion laughs'); refused"]


def test_a_lone_surrogate_in_the_prompt_is_refused_at_its_line(tmp_path):
    path = write(tmp_path, 'task_id: t\ndescription: d\ninitial_prompt: "Fix \\udc00 it"\nsuccess_criteria: []\n')
    with pytest.raises(TaskLoadError) as info:
        load_coder_eval_task(path)
    assert str(info.value) == (f"{path}:3: field 'initial_prompt': text holds a lone surrogate ('\\udc00' at "
                               "character 5): not valid Unicode")


@pytest.mark.parametrize("weight", [".nan", ".inf", "-.inf"])
def test_a_non_finite_weight_is_refused_at_its_line(tmp_path, weight):
    path = write(tmp_path, f"task_id: t\ndescription: d\ninitial_prompt: p\nsuccess_criteria:\n"
                           f"- {{type: file_exists, path: a.py, description: d, weight: {weight}}}\n")
    with pytest.raises(TaskLoadError) as info:
        load_coder_eval_task(path)
    assert str(info.value) == (f"{path}:5: field 'success_criteria.0.weight': {weight} is not a finite number "
                               "(NaN and infinity are refused)")


def test_an_unreadable_file(tmp_path):
    with pytest.raises(TaskLoadError) as info:
        load_coder_eval_task(tmp_path / "gone.yaml")
    assert str(info.value) == f"{tmp_path / 'gone.yaml'}: cannot read file: No such file or directory"


def test_documents_are_told_apart_by_content(tmp_path):
    assert is_coder_eval_document(write(tmp_path, task(), "task.yml"))
    assert is_coder_eval_document(write(tmp_path, {"experiment_id": "e", "variants": []}, "e.yaml"))
    assert not is_coder_eval_document(write(tmp_path, {"task_id": "t", "steps": []}, "other.yaml"))
    assert not is_coder_eval_document(write(tmp_path, task(), "task.json"))
    assert not is_coder_eval_document(write(tmp_path, "task_id: [", "broken.yaml"))
    assert not is_coder_eval_document(tmp_path / "absent.yaml")


# -- experiments -----------------------------------------------------------------------------


def experiment(**fields: Any) -> dict[str, Any]:
    document = {"experiment_id": "model-comparison", "defaults": {"agent": {"type": "claude-code"}},
                "variants": [{"variant_id": "sonnet", "agent": {"model": "claude-sonnet-4-6"}}]}
    document.update(fields)
    return document


def test_an_experiment_loads_with_prompt_files_and_templates_beside_it(tmp_path):
    (tmp_path / "hint.md").write_text("Use the folder.\n")
    loaded = load_coder_eval_experiment(write(tmp_path, experiment(variants=[
        {"variant_id": "a", "initial_prompt_file": "hint.md", "run_limits": {"max_turns": 1}, "driver": "docker"},
        {"variant_id": "b", "prompt_mutations": [{"type": "prefix", "content": "Think."},
                                                 {"type": "replace", "pattern": "a+", "replacement": "b", "regex": True},
                                                 {"type": "rephrase", "instructions": "Formal."}],
         "template_sources": [{"type": "template_dir", "path": "../overlays/docs"}]},
    ]), "e.yaml"))
    a, b = loaded.experiment.variants
    assert (a.initial_prompt, a.initial_prompt_file, a.run_limits.max_turns) == ("Use the folder.", None, 1)
    assert [m.type for m in b.prompt_mutations] == ["prefix", "replace", "rephrase"]
    assert b.template_sources[0].path == str(tmp_path.parent / "overlays" / "docs")


@pytest.mark.parametrize(("fields", "expected"), [
    ({"experiment_id": "Model_Comparison"}, "field 'experiment_id': experiment_id 'Model_Comparison' must be "
     "kebab-case (e.g., 'model-comparison')"),
    ({"variants": []}, "field 'variants': Experiment must have at least 1 variant"),
    ({"variants": [{"variant_id": "a"}, {"variant_id": "a"}]}, "field 'variants': Variant IDs must be unique, got "
     "duplicates in: ['a', 'a']"),
    ({"variants": [{"variant_id": "a", "initial_prompt": "x", "prompt_mutations": []}]}, "field "
     "'variants.0.initial_prompt': Only one of prompt_mutations, initial_prompt can be provided, not multiple"),
    ({"defaults": {"task_timeout": 600}}, "field 'defaults.task_timeout': unknown field"),
    ({"defaults": {"agent": {"type": "claude-code", "max_turns": 20}}}, "field 'defaults.agent': unknown field "
     "'max_turns' under 'agent'"),
    ({"defaults": {"agent": {"by_type": {}}}}, "field 'defaults.agent': unknown field 'by_type' under 'agent'; "
     "did you mean 'type'?"),
    ({"variants": [{"variant_id": "a", "simulation": {"persona": "p", "parallel_trials": True}}]},
     "field 'variants.0.simulation': unknown field 'parallel_trials' under 'simulation'; did you mean 'n_trials'?"),
    ({"variants": [{"variant_id": "a", "prompt_mutations": [{"type": "shout"}]}]}, "field "
     "'variants.0.prompt_mutations.0.type': unknown prompt mutation type 'shout' (expected one of: prefix, suffix, "
     "replace, template, rephrase)"),
    ({"variants": [{"variant_id": "a", "prompt_mutations": [
        {"type": "replace", "pattern": "(", "replacement": "", "regex": True}]}]},
     "field 'variants.0.prompt_mutations.0.pattern': Invalid regex in prompt_mutations: missing ), unterminated "
     "subpattern at position 0"),
    ({"variants": [{"variant_id": "a", "initial_prompt_file": "nope.md"}]}, "field "
     "'variants.0.initial_prompt_file': variant initial_prompt_file not found: {dir}/nope.md"),
])
def test_experiment_rules(tmp_path, fields, expected):
    found = problems(tmp_path, experiment(**fields), "e.yaml", loader=load_coder_eval_experiment)
    assert found == [expected.replace("{dir}", str(tmp_path))]


# -- -D overrides ----------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "parsed"), [
    ("run_limits.max_turns=30", ("run_limits.max_turns", 30)),
    ("run_limits.max_usd=2.50", ("run_limits.max_usd", 2.5)),
    ("agent.allowed_tools=[Bash, Read]", ("agent.allowed_tools", ["Bash", "Read"])),
    ("agent.claude_settings={a: 1}", ("agent.claude_settings", {"a": 1})),
    ("run_limits.stop_early=false", ("run_limits.stop_early", False)),
    ("agent.model=null", ("agent.model", None)),
    ("agent.model=On", ("agent.model", "On")),
    ("agent.model=yes", ("agent.model", "yes")),
    ("agent.system_prompt=a=b", ("agent.system_prompt", "a=b")),
    (" agent.model =x", ("agent.model", "x")),
])
def test_an_override_value_is_a_yaml_scalar_but_truthy_words_stay_strings(raw, parsed):
    assert parse_override(raw) == parsed


@pytest.mark.parametrize(("raw", "message"), [
    ("agent.model", "override must be PATH=VALUE, got: 'agent.model'"),
    ("=x", "override path cannot be empty: '=x'"),
    ("agent.model=[", "value is not valid YAML: "),
])
def test_malformed_overrides(raw, message):
    with pytest.raises(OverrideError, match=f"^{re.escape(message)}"):
        parse_override(raw)


@pytest.fixture
def claude_task(tmp_path) -> TaskDefinition:
    return load(tmp_path, task(
        agent={"type": "claude-code", "model": "sonnet", "system_prompt_file": None, "sdk_options": {"effort": "low"}},
        run_limits={"max_turns": 10, "task_timeout": 600},
        sandbox={"template_sources": [{"type": "repo", "url": "u"}], "docker": {"env_passthrough_extra": ["A"]}},
    )).task


def test_overrides_merge_per_field(claude_task):
    t = apply_overrides(claude_task, [
        "run_limits.max_turns=30", "agent.sdk_options.max_thinking_tokens=8000", "agent.sdk_options.effort=high",
        "sandbox.template_sources=[{type: starter_files, files: [{path: a, content: b}]}]",
        "sandbox.docker.env_passthrough_extra=[B]", "sandbox.docker.network=none",
    ])
    assert (t.run_limits.max_turns, t.run_limits.task_timeout) == (30, 600)
    assert (t.agent.model, t.agent.sdk_options) == ("sonnet", {"effort": "high", "max_thinking_tokens": 8000})
    assert [s.type for s in t.sandbox.template_sources] == ["repo", "starter_files"]
    assert (t.sandbox.docker.env_passthrough_extra, t.sandbox.docker.network) == (["A", "B"], "none")
    assert claude_task.run_limits.max_turns == 10  # the loaded task is untouched


def test_type_flag_and_explicit_agent_type(claude_task):
    assert apply_overrides(claude_task, [], agent_type="claude-code").agent.sdk_options == {"effort": "low"}
    assert apply_overrides(claude_task, ["agent.type=claude-code"], agent_type="codex").agent.type == "claude-code"
    assert apply_overrides(claude_task, ["agent.system_prompt=Be brief."]).agent.system_prompt == "Be brief."


def test_an_override_of_one_system_prompt_form_clears_the_other():
    unresolved = TaskDefinition.model_validate(task(agent={"type": "codex", "system_prompt_file": "s.md"}))
    agent = apply_overrides(unresolved, ["agent.system_prompt=Be brief."]).agent
    assert (agent.system_prompt, agent.system_prompt_file) == ("Be brief.", None)


@pytest.mark.parametrize(("overrides", "agent_type", "message"), [
    (["retry.max=1"], None, "unknown override root 'retry'; allowed roots: agent, run_limits, sandbox"),
    (["run_limits.max_turn=3"], None, "unknown field 'max_turn' under 'run_limits'; did you mean 'max_turns'?"),
    (["sandbox.docker.netwrk=none"], None, "unknown field 'netwrk' under 'sandbox.docker'; did you mean 'network'?"),
    (["agent.sdk_options.effort=high"], "codex", "sdk_options cannot be used with agent type codex. This option is "
     "only supported for claude-code agents."),
    (["run_limits.max_turns=0"], None, "-D run_limits.max_turns: Input should be greater than 0 (got 0)"),
    (["sandbox.driver=podman"], None, "-D sandbox.driver: Input should be 'tempdir' or 'docker' (got 'podman')"),
    (["agent.permission_mode=yes"], None, "-D agent.permission_mode: Input should be 'default', 'acceptEdits', "
     "'plan' or 'bypassPermissions' (got 'yes')"),
    ([], "codex", "-D agent.sdk_options: unknown field"),
])
def test_refused_overrides(claude_task, overrides, agent_type, message):
    with pytest.raises(OverrideError, match=f"^{re.escape(message)}$"):
        apply_overrides(claude_task, overrides, agent_type=agent_type)


def test_sdk_options_need_an_agent_type(tmp_path):
    with pytest.raises(OverrideError, match="^sdk_options cannot be used with no agent type is set"):
        apply_overrides(load(tmp_path, task()).task, ["agent.sdk_options.effort=high"])


# -- the checked-in corpus -------------------------------------------------------------------


def exact(*messages: str) -> list[str]:
    return [re.escape(message) for message in messages]


def criterion_problem(index: int, detail: str = ".*") -> list[str]:
    """A problem the criteria package reports inside criterion ``index`` (its wording is its own)."""
    return [rf"field 'success_criteria\.{index}(\.[^']*)?': {detail}"]


AGENT_MAX_TURNS = "field 'agent.max_turns': unknown field (run caps live in run_limits: set run_limits.max_turns)"
AGENT_TURN_TIMEOUT = "field 'agent.turn_timeout': unknown field (run caps live in run_limits: set run_limits.turn_timeout)"
PARALLEL_TRIALS = "field 'simulation.parallel_trials': unknown field (did you mean 'n_trials'?)"
DATASET_PATH = "field 'dataset.path': unknown field (did you mean 'paths'?)"


def no_dockerfile(task_dir: str) -> list[str]:
    return exact(f"field 'sandbox.docker.dockerfile_path': Dockerfile not found: {CORPUS / task_dir / 'environment' / 'Dockerfile'}")


# Every corpus file that does not load, with what upstream's models say too: each reported
# problem matches one of the patterns and each pattern is reported. The rest load.
REJECTED: dict[str, list[str]] = {
    "experiments/default.yaml": exact("field 'defaults.task_timeout': unknown field",
                                      "field 'defaults.turn_timeout': unknown field"),
    "experiments/flow-complexity-analysis.yaml": exact("field 'defaults.task_timeout': unknown field"),
    "experiments/flow-e2e.yaml": exact("field 'defaults.max_iterations': unknown field",
                                       "field 'defaults.task_timeout': unknown field"),
    "experiments/plugin-comparison.yaml": exact(
        "field 'defaults.agent': unknown field 'by_type' under 'agent'; did you mean 'type'?"),
    # its criteria are fine (import_check is a registered type); the prompt file was not copied
    "tasks/agents/create/data_transformer.yaml": exact(
        "field 'initial_prompt_file': initial_prompt_file not found: "
        f"{CORPUS / 'tasks' / 'agents' / 'create' / 'prompts' / 'data_transformer.md'}"),
    "tasks/bpmn_vs_case_management/bpmn_vs_case_management.yaml": exact(DATASET_PATH),
    "tasks/sentiment_classification.yaml": exact(DATASET_PATH),
    "tasks/hello_date_multi_agent.yaml": exact("field 'sandbox.network_enabled': unknown field"),
    "tasks/internal/session_resumption.yaml": exact(AGENT_MAX_TURNS),
    "tasks/uipath_flow/calculator/calculator.yaml": exact(AGENT_MAX_TURNS),
    "tasks/uipath_flow/init_validate_pack_simple.yaml": exact(AGENT_MAX_TURNS),
    "tasks/uipath_flow/process_list_simple.yaml": exact(AGENT_MAX_TURNS),
    "tasks/uipath_flow/v2_authoring/calculator_v2.yaml": exact(AGENT_MAX_TURNS, AGENT_TURN_TIMEOUT),
    "tasks/python_cli_simulated_judged/echo_simulated_judged.yaml": exact(AGENT_MAX_TURNS, AGENT_TURN_TIMEOUT,
                                                                          PARALLEL_TRIALS),
    "tasks/uipath_flow/cli_dice_roller_simulated/cli_dice_roller_simulated.yaml": exact(
        AGENT_MAX_TURNS, AGENT_TURN_TIMEOUT, PARALLEL_TRIALS),
    # skill_triggered's old `expected` key (criterion problems), dataset.path / sample
    "tasks/uipath_flow/triggering/triggering.yaml": [
        *exact(AGENT_MAX_TURNS), *criterion_problem(0),
        *exact(DATASET_PATH, "field 'dataset.sample': unknown field (did you mean 'sample_seed'?)")],
    "tasks/dockerfile_build_example/dockerfile_build_example.yaml": no_dockerfile("tasks/dockerfile_build_example"),
    "tasks/samples/skillsbench/dialogue-parser/dialogue-parser.yaml": no_dockerfile(
        "tasks/samples/skillsbench/dialogue-parser"),
    "tests/_fixtures/harbor_export_golden/source_task/task.yaml": no_dockerfile(
        "tests/_fixtures/harbor_export_golden/source_task"),
}
STALE_KEY_WARNING = ("field 'max_iterations': unknown top-level field will be ignored. If this is a typo, fix it; "
                     "if the field is stale from a previous schema, remove it.")
WARNED = {name: [STALE_KEY_WARNING] for name in (
    "tasks/fibonacci_with_template.yaml", "tasks/inline_starter_example.yaml",
    "tests/fixtures/tasks/test_task_pass.yaml", "tests/fixtures/tasks/test_task_multiple_criteria.yaml")}
CORPUS_FILES = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.yaml")) if UPSTREAM else []


@pytest.mark.skipif(not REAL_CRITERIA, reason="the corpus needs the real criterion models: "
                    "agentenv_dagster.criteria (parse_criterion) is not importable yet")
@pytest.mark.parametrize("name", CORPUS_FILES or [pytest.param("", marks=needs_corpus)])
def test_every_corpus_file_loads_or_is_rejected_as_upstream_would(name, monkeypatch):
    path = CORPUS / name
    loader = load_coder_eval_experiment if name.startswith("experiments/") else load_coder_eval_task
    if name not in REJECTED:
        assert [w.removeprefix(f"{path}: ") for w in loader(path).warnings] == WARNED.get(name, [])
        return
    with pytest.raises(TaskLoadError) as info:
        loader(path)
    found = [str(error).removeprefix(f"{path}: ") for error in info.value.errors]
    patterns = REJECTED[name]
    assert [m for m in found if not any(re.fullmatch(p, m) for p in patterns)] == []
    assert [p for p in patterns if not any(re.fullmatch(p, m) for m in found)] == []


@needs_corpus
def test_the_corpus_is_there_and_every_rejection_names_a_real_file():
    assert len(CORPUS_FILES) == 74
    assert set(REJECTED) <= set(CORPUS_FILES)
    assert set(WARNED) <= set(CORPUS_FILES) - set(REJECTED)


@pytest.mark.skipif(not REAL_CRITERIA, reason="the corpus needs agentenv_dagster.criteria")
@needs_corpus
@pytest.mark.parametrize(("name", "rows_file", "count"), [
    ("tasks/skills/ci-outcome.yaml", "ci-outcome-rows.jsonl", 10),
    ("tasks/skills/lint-tasks-activation.yaml", "lint-tasks-activation-rows.jsonl", 28),
])
def test_corpus_dataset_rows_resolve_beside_their_task(name, rows_file, count):
    dataset = load_coder_eval_task(CORPUS / name).task.dataset
    assert dataset.paths == [str(CORPUS / "tasks" / "skills" / rows_file)]
    assert len(load_dataset_rows(dataset, CORPUS)) == count
