"""`agentenv-dagster run` over several Coder Eval tasks, as upstream's `coder-eval run` does:
files and folders of them, one run.json for all, an experiment over every task x variant,
`skip: true` tasks left out unless `--include-skipped`, and upstream's exit codes for a path
that names no task (1) and two tasks with one id (2)."""

from __future__ import annotations

import json
import textwrap

import pytest

from test_coder_eval_run import cli

from projects import REPO, leaked_servers, make_project

HELLO = (REPO / "tasks" / "hello_python.yaml").read_text()
TRIAGE = (REPO / "tasks" / "triage_tickets.yaml").read_text()
LATER = HELLO.replace("task_id: hello-python", "task_id: hello-later\nskip: true  # quarantined: not run by default")
AB = textwrap.dedent("""
    experiment_id: ab
    variants:
      - variant_id: a
      - variant_id: b
        run_limits: {max_turns: 5}
""")


@pytest.mark.slow
def test_a_folder_of_tasks_runs_every_task_x_variant_into_one_report(tmp_path):
    root = make_project(tmp_path / "p", tasks={
        "hello.yaml": HELLO, "later.yaml": LATER, "ab.yaml": AB,  # an experiment: not a task
        "reply.json": json.loads((REPO / "tasks" / "reply_to_dana.json").read_text()),  # agent-env: not a Coder Eval task
    })
    (root / "tasks" / "triage").mkdir()
    (root / "tasks" / "triage" / "triage.yaml").write_text(TRIAGE)  # a folder is searched all the way down
    done = cli(root, "run", "tasks", "--experiment", "tasks/ab.yaml", "--output-dir", "o")
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((root / "o" / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"]) == (2 * (1 + 6), 2 * (1 + 6))
    assert [s["path"] for s in summary["skipped_tasks"]] == ["tasks/later.yaml"]
    report = json.loads((root / "o" / "experiment.json").read_text())
    assert {t["task_id"] for t in report["task_summaries"]} == {"hello-python", *(f"triage-tickets/t{i}" for i in range(1, 7))}
    assert all(set(t["variant_results"]) == {"a", "b"} for t in report["task_summaries"])
    assert {v: (a["tasks_run"], a["pass_rate"]) for v, a in report["variant_aggregates"].items()} == {
        "a": (7, 1.0), "b": (7, 1.0)}
    for variant in ("a", "b"):  # the dataset's suite, per variant
        assert json.loads((root / "o" / variant / "triage-tickets" / "suite.json").read_text())["passed"] is True

    # a quoted pattern, and the same file named again: run once
    quarantined = cli(root, "run", "tasks/l*.yaml", "tasks/later.yaml", "--include-skipped", "--output-dir", "q")
    assert quarantined.returncode == 0, quarantined.stdout + quarantined.stderr
    assert quarantined.stdout.count("+ hello-later: SUCCESS") == 1 and "hello-python" not in quarantined.stdout
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.mark.slow
def test_a_path_without_tasks_exits_1_and_a_missing_path_one_id_twice_or_two_agent_env_files_exit_2(tmp_path):
    root = make_project(tmp_path / "p", tasks={"hello.yaml": HELLO, "again.yaml": HELLO})
    (root / "empty").mkdir()
    nothing = cli(root, "run", "tasks/hello.yaml", "empty")
    assert nothing.returncode == 1 and "error: empty: no Coder Eval task under it" in nothing.stderr
    missing = cli(root, "run", "tasks/nope.yaml")
    assert missing.returncode == 2 and "error: tasks/nope.yaml: no such file or folder" in missing.stderr
    unmatched = cli(root, "run", "tasks/nope*.yaml")
    assert unmatched.returncode == 1 and "error: tasks/nope*.yaml: no Coder Eval task there" in unmatched.stderr
    twice = cli(root, "run", "tasks")
    assert twice.returncode == 2
    assert "tasks/hello.yaml: field 'task_id': task id 'hello-python' is also the id of tasks/again.yaml" in twice.stderr
    assert not (root / "out").exists()  # refused before anything ran
    two = cli(root, "run", "a.json", "b.json")
    assert two.returncode == 2 and "an agent-env task document runs alone" in two.stderr
    (root / "tasks" / "again.yaml").unlink()
    (root / "tasks" / "z_triage.yaml").write_text(TRIAGE.replace(", label:", ", split: train, label:"))  # after hello
    no_rows = cli(root, "run", "tasks", "--split", "dev")  # hello has no dataset; triage has no dev rows
    assert no_rows.returncode == 2 and "dev" in no_rows.stderr, no_rows.stdout + no_rows.stderr
    assert not (root / "out").exists() and "hello-python" not in no_rows.stdout  # resolved first: nothing ran
