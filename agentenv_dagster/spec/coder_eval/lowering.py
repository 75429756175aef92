"""Lower a Coder Eval task to agent-env steps, so one compiler and one back end serve both.

The steps, in the JSON form ``agent-env task create`` reads (validated afterwards by the step
registry like any task file):

    deploy_sandbox -> prepare_workspace -> [run_commands pre_run] -> [deploy_agent ->
    [deploy_agent simulator] -> prompt_agent] -> success_criteria -> [run_commands post_run]

The agent works inside the task's sandbox. A ``simulation`` makes the prompt a dialog: a
second, tool-less agent plays the user (persona, goal and constraints are its system prompt;
it never sees the reference) and answers each reply until its stop token, ``max_turns``,
``max_total_tokens`` or, with ``stop_on_criteria_pass``, criteria that pass after a turn. Its prompt tolerates failure, so the criteria
still grade what it left (the report turns the prompt's error into TIMEOUT / ERROR ...).
Dataset values ``${row.field}`` (in the prompt and the criteria) become seed tokens
``<row.field>``; each row is a partition whose config has its row's values filled in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ...errors import TaskLoadError
from .dataset import RowSampling, check_row_ids, load_dataset_rows, row_sampling
from .early_stop import early_stop_problem, watcher_config
from .limits import DEFAULT_TASK_TIMEOUT
from .loader import LoadedCoderEvalTask
from .task import TaskDefinition

WORKSPACE = "workspace"
AGENT_NAME = "agent"
SIMULATOR_NAME = "simulator"
PROMPT_ID = "task"
VERIFIER_ID = "success_criteria"
AUTO_WORKING_DIR = "/workspace"  # upstream reserves /work for its own mounts
# agent: fields the registry entry takes over (the coding agents' permissions, tools and SDK
# options, the replay script); the system prompt and run_limits go by agent-config instead
AGENT_ENTRY_FIELDS = (
    "script", "episodes", "delay_seconds", "model", "max_turns", "permission_mode", "allowed_tools",
    "disallowed_tools", "sdk_options", "system_prompt_mode", "setting_sources",
)
ROW_TOKEN = re.compile(r"\$\{row\.([A-Za-z_][A-Za-z0-9_]*)\}")


def lower_task(loaded: LoadedCoderEvalTask, *, grade_only_from: Path | None = None) -> list[dict[str, Any]]:
    """The task's steps. ``grade_only_from`` grades a finished workspace: no agent runs.
    A resolved task whose stop_early arming cannot run is a :class:`TaskLoadError`."""
    task = loaded.task
    problem = early_stop_problem(task)
    if problem is not None:
        raise TaskLoadError([problem.located(str(loaded.source))])
    task_dir = loaded.source.parent.resolve()
    steps: list[dict[str, Any]] = [
        {"id": "sandbox", "type": "deploy_sandbox", "sandbox_name": WORKSPACE, "sandbox_mode": "vm",
         "depends_on": [], "env_passthrough": task.sandbox.docker.passthrough_names(), **_container(task)},
        {"id": "workspace", "type": "prepare_workspace", "sandbox_name": WORKSPACE, "task_dir": str(task_dir),
         "sandbox": task.sandbox.model_dump(mode="json", exclude_none=True),
         "reference_directory": task.reference.directory if task.reference else None,
         "grade_only_from": str(grade_only_from.resolve()) if grade_only_from else None},
    ]
    if task.pre_run:
        steps.append(_commands("pre_run", task.pre_run))
    runs_agent = grade_only_from is None and task.agent is not None and not task.is_none_agent
    if runs_agent:
        steps += _agent_steps(task, task_dir)
    steps.append({
        "id": "criteria", "type": "success_criteria", "sandbox_name": WORKSPACE, "verifier_id": VERIFIER_ID,
        "criteria": _row_tokens(criteria_documents(task)),
        "prompt_id": PROMPT_ID if runs_agent else None, "expected_commands": task.expected_commands,
        **({"timeout_seconds": task.run_limits.task_timeout} if task.run_limits and task.run_limits.task_timeout else {}),
    })
    if task.post_run:
        steps.append({**_commands("post_run", task.post_run), "fail_task_on_error": False})
    return steps


def _container(task: TaskDefinition) -> dict[str, Any]:
    """Under ``driver: docker`` the sandbox is a local container with the task's limits."""
    sandbox = task.sandbox
    if sandbox.driver != "docker":
        return {}
    docker, limits = sandbox.docker, sandbox.limits
    working_dir = docker.working_dir if docker.working_dir not in (None, "auto") else AUTO_WORKING_DIR
    settings = {
        # llm_only (egress to the model API only) has nothing to allow here: no network at all
        "image": docker.image, "working_dir": working_dir, "network": "none" if docker.network == "llm_only" else docker.network,
        "memory_mb": limits.max_memory_mb, "cpus": limits.max_cpus, "pids": limits.max_pids,
    }
    return {"sandbox_type": "docker", "container": {k: v for k, v in settings.items() if v is not None}}


def _agent_steps(task: TaskDefinition, task_dir: Path) -> list[dict[str, Any]]:
    agent = task.agent
    limits = task.run_limits
    overrides = {
        k: v for k, v in agent.model_dump(mode="json", exclude_none=True).items() if k in AGENT_ENTRY_FIELDS
    }
    if getattr(agent, "plugins", None):  # local plugin folders are relative to the task file
        overrides["plugins"] = [{"type": "local", "path": str(task_dir / p.path)} for p in agent.plugins]
    settings = getattr(agent, "claude_settings", None)
    if settings is not None:  # inline settings as JSON text, a file relative to the task file
        overrides["settings"] = json.dumps(settings) if isinstance(settings, dict) else str(task_dir / settings)
    # the agent's shell finds the recording CLI mocks and mock_path_dirs first
    path_prepend = (["cli_mocks"] if task.sandbox.record_cli else []) + list(task.sandbox.mock_path_dirs or [])
    if path_prepend:
        overrides["path_prepend"] = path_prepend
    deploy = {"id": "agent", "type": "deploy_agent", "a2a_agent_id": agent.type, "agent_name": AGENT_NAME,
              "sandbox_name": WORKSPACE, "agent_config": overrides}
    if getattr(agent, "system_prompt", None):
        deploy["system_prompt"] = agent.system_prompt
    timeouts = [t for t in (limits.task_timeout, limits.turn_timeout) if t] if limits else []
    prompt = {"id": "prompt", "type": "prompt_agent", "agent_name": AGENT_NAME, "prompt_id": PROMPT_ID,
              "prompt": _row_tokens(task.initial_prompt or ""), "fail_task_on_error": False,
              # one prompt is one turn: the tighter of the task and turn timeouts bounds it
              "timeout_seconds": min(timeouts, default=DEFAULT_TASK_TIMEOUT)}
    if limits and limits.max_turns:
        prompt["max_turns"] = limits.max_turns
    armed = watcher_config(task, _row_tokens(criteria_documents(task)))
    if armed is not None:
        prompt["stop_early"] = armed
    if getattr(agent, "model", None):
        prompt["model"] = agent.model  # the task's model wins over the run's default agent model
    if not task.in_simulation:
        return [deploy, prompt]
    dialog = {**prompt, **_dialog(task, prompt["timeout_seconds"])}
    if dialog.get("user_opens_conversation"):
        del dialog["prompt"]
    return [deploy, _simulator(task), dialog]


def _simulator(task: TaskDefinition) -> dict[str, Any]:
    """The simulated user: no env, no sandbox (so no tools, no reference), deployed alongside."""
    simulator = task.simulation.simulator
    overrides = simulator.model_dump(mode="json", exclude_none=True, exclude={"type"}) if simulator else {}
    overrides.pop("system_prompt", None)  # the persona is the system prompt
    return {"id": "simulator", "type": "deploy_agent", "a2a_agent_id": simulator.type if simulator else "anthropic",
            "agent_name": SIMULATOR_NAME, "role": "user", "depends_on": [],
            "system_prompt": _row_tokens(simulator_prompt(task)), "agent_config": overrides}


def _dialog(task: TaskDefinition, timeout_seconds: float) -> dict[str, Any]:
    """prompt_agent as a dialog with the simulator; without an initial prompt it opens."""
    sim = task.simulation
    dialog: dict[str, Any] = {
        "max_conversation_turns": sim.max_turns, "user_agent_name": SIMULATOR_NAME,
        "user_agent_timeout_seconds": timeout_seconds, "user_stop_token": sim.stop_token,
    }
    if sim.max_total_tokens is not None:
        dialog["max_total_tokens"] = sim.max_total_tokens
    if task.initial_prompt is None:
        dialog["user_opens_conversation"] = True
    if sim.check_criteria in ("every_turn", "both"):
        dialog["turn_criteria"] = {"sandbox_name": WORKSPACE, "criteria": _row_tokens(criteria_documents(task)),
                                   "stop_on_pass": sim.stop_on_criteria_pass}
    return dialog


def simulator_prompt(task: TaskDefinition) -> str:
    """The simulated user's system prompt: who it is, what it wants, how to end the dialog.
    Built from the simulation block, the description and the opener only — never the reference."""
    sim = task.simulation
    lines = [
        "You play a human user talking to an AI coding assistant. Everything you write is sent to "
        "the assistant as your next chat message.",
        "", "Who you are:", sim.persona.strip(),
        "", "What you want in the end (you need not say it all at once):", sim.goal.strip(),
    ]
    if sim.constraints:
        lines += ["", "How you behave:", *(f"- {c}" for c in sim.constraints)]
    lines += [
        "", "Rules:",
        "- Stay in character; never mention these instructions or that you are simulated.",
        "- Write like a person in a chat: plain language, short messages.",
        "- You only see what the assistant writes, not its files or commands.",
        "- Answer its questions, and say so when its work misses what you want.",
        f"- Once you are satisfied the task is done, include {sim.stop_token} in your message; it "
        "ends the conversation, so do not use it earlier.",
        "", f"The task, as the evaluator describes it: {task.description.strip()}",
    ]
    if task.initial_prompt is not None:
        lines += ["", "You opened the conversation with this message:", task.initial_prompt.strip(),
                  "Everything the user says after it comes from you."]
    else:
        lines += ["", "You open the conversation: when asked to start, write your first message the way "
                      "your persona would, without listing every requirement up front."]
    return "\n".join(lines)


def _commands(phase: str, commands: list) -> dict[str, Any]:
    return {"id": phase, "type": "run_commands", "sandbox_name": WORKSPACE, "phase": phase,
            "commands": [c.model_dump(mode="json") for c in commands]}


def _row_tokens(value: Any) -> Any:
    if isinstance(value, str):
        return ROW_TOKEN.sub(lambda m: f"<row.{m.group(1)}>", value)
    if isinstance(value, list):
        return [_row_tokens(v) for v in value]
    if isinstance(value, dict):
        return {k: _row_tokens(v) for k, v in value.items()}
    return value


def criteria_documents(task: TaskDefinition) -> list[dict[str, Any]]:
    return [c.model_dump(mode="json", exclude_none=True, by_alias=True) for c in task.success_criteria]


def dataset_partitions(
    loaded: LoadedCoderEvalTask,
) -> tuple[dict[str, dict[str, Any]] | None, RowSampling | None]:
    """Row id -> seed, in dataset order: a dataset task's partitions (None without one), and
    its ``sample_per_stratum`` draw over them.
    ``${row.f}`` is filled in the prompt and the criteria only, as upstream: a field the row
    lacks or a dict/list value is an error, null is the empty string."""
    task = loaded.task
    if task.dataset is None:
        return None, None
    rows = load_dataset_rows(task.dataset, loaded.source.parent.resolve())
    check_row_ids(rows, task.dataset, task.task_id)
    used = sorted(set(ROW_TOKEN.findall(json.dumps([task.initial_prompt, criteria_documents(task)]))))
    partitions = {str(row[task.dataset.id_field]): _seed(row, used, task.dataset.id_field) for row in rows}
    return partitions, row_sampling(rows, task.dataset)


def _seed(row: dict[str, Any], fields: list[str], id_field: str) -> dict[str, Any]:
    seed = {}
    for name in fields:
        if name not in row:
            raise ValueError(f"row '{row[id_field]}': ${{row.{name}}} names no field of the row "
                           f"(fields: {sorted(row)})")
        value = row[name]
        if isinstance(value, (dict, list)):
            raise ValueError(f"row '{row[id_field]}': ${{row.{name}}} is a {type(value).__name__}; only scalars substitute")
        seed[f"row.{name}"] = "" if value is None else str(value)
    return seed
