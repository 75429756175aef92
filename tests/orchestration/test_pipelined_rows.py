"""A dataset's rows do not wait for each other: each row goes through the steps as soon as its
own steps before are done, and at most ``max_sandboxes`` rows hold their deployments at once."""

from __future__ import annotations

import json
import textwrap
from datetime import datetime

import dagster as dg
import pytest

from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
from projects import leaked_servers, make_project


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project", tasks={})
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def spans(contexts: dict, start: str, end: str) -> list[tuple[float, float]]:
    """Each row's span from its step ``start`` starting to its step ``end`` starting."""
    found = []
    for context in contexts.values():
        timings = context["metadata"]["step_timings"]
        found.append(tuple(datetime.fromisoformat(timings[step]["started_at_utc"]).timestamp() for step in (start, end)))
    return found


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])  # an end first at a tie
    running = peak = 0
    for _, change in edges:
        running += change
        peak = max(peak, running)
    return peak


def test_a_row_is_graded_as_soon_as_its_own_agent_answers(project, tmp_path):
    """Row ``slow``'s agent waits for a file that only row ``fast``'s grading writes: rows that
    went through each step together (every grading after every agent) would never finish."""
    gate = tmp_path / "fast-was-graded"
    (project / "tasks" / "rows.yaml").write_text(textwrap.dedent(f"""
        task_id: rows
        description: one row's agent waits for another row's grading
        initial_prompt: "Answer ${{row.id}}"
        agent:
          type: replay
          episodes:
            - match: "Answer slow"
              reply: done
              actions:
                - {{tool: Bash, arguments: {{command: "for i in $(seq 600); do test -f {gate} && break; sleep 0.05; done; test -f {gate} && echo ok > answer.txt"}}}}
            - {{match: "Answer fast", reply: done, actions: [{{write_file: answer.txt, content: ok}}]}}
        sandbox: {{python: null}}
        run_limits: {{task_timeout: 120}}
        dataset:
          rows: [{{id: slow}}, {{id: fast}}]
        success_criteria:
          - type: run_command
            command: "test -s answer.txt && touch {gate}"
            description: the answer is there
        """))
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "rows.yaml", load_config(project), output_dir=tmp_path / "out",
                                   instance=instance)
    assert [(r.task_id, r.final_status.value) for r in done.results] == [("rows/slow", "SUCCESS"), ("rows/fast", "SUCCESS")]


@pytest.mark.slow
def test_at_most_max_sandboxes_rows_hold_their_deployments_at_once(project, tmp_path):
    rows = ", ".join(f"{{id: r{i}}}" for i in range(8))
    (project / "tasks" / "rows.yaml").write_text(textwrap.dedent(f"""
        task_id: rows
        description: eight rows, two at a time
        initial_prompt: "Answer ${{row.id}}"
        agent:
          type: replay
          episodes:
            - {{match: "Answer", reply: done, actions: [{{sleep: 0.1}}, {{write_file: answer.txt, content: ok}}]}}
        sandbox: {{python: null}}
        dataset:
          rows: [{rows}]
          max_sandboxes: 2
        success_criteria:
          - {{type: file_exists, path: answer.txt, description: answered}}
        """))
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(project / "tasks" / "rows.yaml", load_config(project), output_dir=tmp_path / "out",
                                   instance=instance, rows_in_flight=4)
        more = run_coder_eval_task(project / "tasks" / "rows.yaml", load_config(project), output_dir=tmp_path / "more",
                                   instance=instance, rows_in_flight=4, max_sandboxes=3)  # the flag wins
    assert [r.final_status.value for r in done.results] == ["SUCCESS"] * 8
    contexts = json.loads((tmp_path / "out" / "contexts" / "rows" / "task" / "context.json").read_text())
    # a row holds its sandbox and agent from its first step until it leaves the run
    assert most_at_once(spans(contexts, "sandbox", "teardown_run")) == 2
    contexts = json.loads((tmp_path / "more" / "contexts" / "rows" / "task" / "context.json").read_text())
    assert most_at_once(spans(contexts, "sandbox", "teardown_run")) == 3
    assert [r.final_status.value for r in more.results] == ["SUCCESS"] * 8
