"""Coder Eval tasks end to end: lowered to a Dagster job, run, graded, reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from agentenv_dagster import build_definitions
from projects import FIXTURES as ALL_FIXTURES
from projects import default_steps, leaked_servers, make_project

FIXTURES = ALL_FIXTURES / "coder_eval"


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "project")
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    return subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)


def task_json(out: Path, task_id: str) -> dict:
    return json.loads((out / "default" / task_id / "00" / "task.json").read_text())


@pytest.fixture
def workspace(tmp_path):
    folder = tmp_path / "workspace"
    folder.mkdir()
    (folder / "app.py").write_text("print('hello')\n")
    return folder


@pytest.mark.parametrize("fixture, task_id, expected_rows", [
    ("grade_one_file.yaml", "grade_one_file", [("file_exists", 1.0, True)]),
    ("grade_three_criteria.yaml", "grade_three_criteria",
     [("file_exists", 1.0, True), ("file_contains", 1.0, True), ("run_command", 1.0, True)]),
    ("grade_informational.yaml", "grade_informational",
     [("file_exists", 1.0, True), ("file_exists", 0.0, False)]),
])
def test_the_grade_only_fixtures_run_end_to_end(project, workspace, tmp_path, fixture, task_id, expected_rows):
    out = tmp_path / "out"
    done = cli(project, "run", str(FIXTURES / fixture), "--grade-only", str(workspace), "--output-dir", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"+ {task_id}: SUCCESS (score 1.000)" in done.stdout
    result = task_json(out, task_id)
    rows = [(r["criterion_type"], r["score"], r["gating"]) for r in result["success_criteria_results"]]
    assert rows == expected_rows
    summary = json.loads((out / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"], summary["pass_rate"]) == (1, 1, 1.0)
    assert summary["task_results"][0]["status"] == "SUCCESS" and summary["task_results"][0]["weighted_score"] == 1.0
    assert "| `+` | " + task_id in (out / "run.md").read_text()
    assert task_id in (out / "task.html").read_text()


def test_a_failing_workspace_exits_1_and_a_bad_task_exits_2(project, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    failed = cli(project, "run", str(FIXTURES / "grade_one_file.yaml"), "--grade-only", str(empty), "--output-dir", str(out))
    assert failed.returncode == 1
    assert task_json(out, "grade_one_file")["final_status"] == "FAILURE"
    bad = project / "bad.yaml"
    bad.write_text(textwrap.dedent("""
        task_id: bad
        description: d
        initial_prompt: p
        agent: {type: replay, episodes: []}
        success_criteria:
          - {type: file_exists, path: a.py, description: d, wieght: 2}
    """))
    rejected = cli(project, "run", str(bad))
    assert rejected.returncode == 2
    assert f"{bad}: field 'success_criteria.0.wieght': unknown field" in rejected.stderr


def test_hello_python_runs_the_replay_agent_in_the_sandbox_and_grades_its_telemetry(project, tmp_path):
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/hello_python.yaml", "--output-dir", str(out), "-D", "run_limits.max_turns=5")
    assert done.returncode == 0, done.stdout + done.stderr
    result = task_json(out, "hello-python")
    assert result["final_status"] == "SUCCESS" and result["weighted_score"] == 1.0
    assert [c["tool_name"] for c in result["iterations"][0]["commands"]] == ["Write", "Bash"]
    executed = next(r for r in result["success_criteria_results"] if r["criterion_type"] == "command_executed")
    assert executed["score"] == 1.0
    assert json.loads((out / "run.json").read_text())["task_results"][0]["status"] == "SUCCESS"


def test_a_coder_eval_task_is_a_job_with_a_check_per_gating_criterion(project):
    defs = build_definitions(project / "tasks")
    key = dg.AssetKey(["verifications", "hello_python", "success_criteria"])
    checks = {k.name for k in defs.resolve_asset_graph().asset_check_keys if k.asset_key == key}
    assert checks == {"passed", "criterion_1_file_exists", "criterion_2_run_command", "criterion_3_command_executed",
                      "no_regression"}
    job = defs.resolve_job_def("hello_python")
    assert job.tags["agentenv/format"] == "coder-eval"
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
        assert result.success
        event = instance.get_latest_materialization_event(key)
        metadata = {k: v.value for k, v in event.asset_materialization.metadata.items()}
    assert metadata["score"] == 1.0 and metadata["passed"] is True
    evaluations = {e.event_specific_data.check_name: e.event_specific_data.passed
                   for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert evaluations == dict.fromkeys(checks, True)


@pytest.mark.slow
def test_agent_errors_pre_run_and_datasets(project, tmp_path):
    (project / "tasks" / "rows.yaml").write_text(textwrap.dedent("""
        task_id: rows
        description: one row-task per row
        initial_prompt: "Say ${row.word}"
        agent:
          type: replay
          episodes:
            - {match: "Say hi", reply: "hi", actions: [{tool: Write, arguments: {file_path: out.txt, content: hi}}]}
        pre_run:
          - {command: "echo ready > ready.txt"}
        post_run:
          - {command: "ls"}
        dataset:
          rows: [{id: r1, word: hi}, {id: r2, word: bye}]
        success_criteria:
          - {type: file_contains, path: out.txt, includes: ["${row.word}"], description: the word was written}
    """))
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/rows.yaml", "--output-dir", str(out))
    assert done.returncode == 1, done.stdout + done.stderr  # r2 has no scripted reply: an ERROR
    first, second = task_json(out, "rows/r1"), task_json(out, "rows/r2")
    assert first["final_status"] == "SUCCESS"
    assert first["pre_run_results"][0]["exit_code"] == 0 and first["post_run_results"][0]["stdout"].split() == [
        "out.txt", "ready.txt"]
    assert second["final_status"] == "ERROR" and second["error_message"].startswith("NoScriptedReply")
    summary = json.loads((out / "run.json").read_text())
    assert (summary["tasks_run"], summary["tasks_succeeded"], summary["tasks_error"]) == (2, 1, 1)

    (project / "tasks" / "rows.yaml").write_text((project / "tasks" / "rows.yaml").read_text().replace(
        "echo ready > ready.txt", "exit 4"))
    aborted = cli(project, "run", "tasks/rows.yaml", "--output-dir", str(tmp_path / "out2"))
    result = task_json(tmp_path / "out2", "rows/r1")
    assert aborted.returncode == 1 and result["final_status"] == "ERROR"
    assert "pre_run command 'exit 4' failed: exit code 4" in result["error_message"]


def test_the_sample_seed_picks_the_rows_a_run_takes(project, tmp_path):
    from agentenv_dagster.spec.coder_eval import load_coder_eval_task
    from agentenv_dagster.spec.coder_eval.dataset import select_rows

    task = load_coder_eval_task(project / "tasks" / "triage_tickets.yaml").task
    rows = task.dataset.rows
    picked = {seed: select_rows(rows, task.dataset, sample=1, seed=seed)[0][0]["id"] for seed in range(20)}
    seed = next(s for s, row in picked.items() if row != picked[0])  # a seed whose draw is not seed 0's
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/triage_tickets.yaml", "--sample", "1", "--seed", str(seed), "--output-dir", str(out))
    summary = json.loads((out / "run.json").read_text())
    assert [t["task_id"] for t in summary["task_results"]] == [f"triage-tickets/{picked[seed]}"], done.stdout + done.stderr


def test_a_prompt_step_that_fails_before_the_agent_answers_is_the_row_s_error(project, tmp_path, monkeypatch):
    """The prompt step is tolerated (the criteria still run, as post-failure evidence), but an
    agent never heard is no success: the row is an ERROR naming the step's failure, in its
    task.json, in the run's counts and in the suite asset's rollup, even where the files the
    criteria look at are there (the agent wrote them before its answer was lost)."""
    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
    from agentenv_dagster.steps.prompt import PromptAgentStep

    store = PromptAgentStep._store_trajectory

    async def lost_for_yo(self, rt, url, card, reply):
        if "yo" in self.prompt_text():
            raise RuntimeError("the trajectory store is down")
        return await store(self, rt, url, card, reply)

    monkeypatch.setattr(PromptAgentStep, "_store_trajectory", lost_for_yo)
    path = project / "tasks" / "words.yaml"
    path.write_text(WORDS_TASK.format(extra=""))
    out = tmp_path / "out"
    with dg.instance_for_test() as instance:
        done = run_coder_eval_task(path, load_config(project), output_dir=out, instance=instance)
        suite = instance.get_latest_materialization_event(dg.AssetKey(["suites", "words"])).asset_materialization
    assert [(r.task_id, r.final_status.value) for r in done.results] == [
        ("words/r1", "SUCCESS"), ("words/r2", "ERROR"), ("words/r3", "ERROR")]
    lost = task_json(out, "words/r2")
    assert lost["error_message"] == "step 'prompt' failed: the trajectory store is down"
    assert lost["success_criteria_results"] == [] and lost["post_failure_criteria_results"][0]["score"] == 1.0
    assert (done.summary.tasks_succeeded, done.summary.tasks_error) == (1, 2)
    assert suite.metadata["pass_rate"].value == pytest.approx(1 / 3)


def test_every_loadable_corpus_task_compiles_to_a_job(project, upstream_corpus):
    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config
    from agentenv_dagster.errors import TaskLoadError
    from agentenv_dagster.orchestration.definitions import build_job
    from agentenv_dagster.spec.coder_eval import is_coder_eval_document, load_coder_eval_task

    config = load_config(project)
    compiled = 0
    for path in sorted((upstream_corpus / "coder_eval").rglob("*.yaml")):
        if not is_coder_eval_document(path):
            continue
        try:
            load_coder_eval_task(path)
        except TaskLoadError:
            continue  # rejected as upstream rejects it: pinned in tests/spec
        build_job(load_plan(path, config))
        compiled += 1
    assert compiled >= 45


def test_the_anthropic_agent_on_a_coder_task_and_its_token_budget(tmp_path, fake_messages_api):
    from fakes.messages_api import text_reply, tool_use_reply

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url})
    path = root / "tasks" / "live.yaml"
    path.write_text(textwrap.dedent("""
        task_id: live
        description: the live agent writes a file
        initial_prompt: Write ok.txt containing ok.
        agent: {type: anthropic, model: claude-test, max_turns: 4}
        sandbox: {python: null}
        run_limits: {max_total_tokens: 40}
        success_criteria:
          - {type: file_contains, path: ok.txt, includes: [ok], description: ok.txt says ok}
    """))
    fake_messages_api.enqueue(
        tool_use_reply("Write", {"file_path": "ok.txt", "content": "ok"}, usage=(10, 5)),
        text_reply("Done.", usage=(20, 10)),
    )
    with dg.instance_for_test() as instance:
        run = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance)
    (result,) = run.results
    assert [r.score for r in result.success_criteria_results] == [1.0]  # graded: the file is there
    assert result.final_status.value == "TOKEN_BUDGET_EXCEEDED"
    assert result.error_message == "run_limits.max_total_tokens=40 exceeded: the agent used 45 tokens"
    assert run.exit_code == 1
    assert fake_messages_api.requests[0].body["model"] == "claude-test"
    assert "Write" in {t["name"] for t in fake_messages_api.requests[0].body["tools"]}
    assert leaked_servers(root / ".agentenv" / "state") == []


@pytest.mark.slow
def test_skipped_tasks_are_listed_not_run_and_command_stats_are_reported(project, tmp_path):
    text = (project / "tasks" / "hello_python.yaml").read_text()
    (project / "tasks" / "skipped.yaml").write_text(text.replace("task_id: hello-python", "task_id: skipped\nskip: true"))
    defs = build_definitions(project / "tasks")
    assert defs.resolve_job_def("hello_python") and "skipped" not in {j.name for j in defs.resolve_all_job_defs()}
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/skipped.yaml", "--output-dir", str(out))
    assert done.returncode == 0 and "skipped" in done.stdout
    summary = json.loads((out / "run.json").read_text())
    assert summary["tasks_run"] == 0 and summary["skipped_tasks"][0]["reason"] == "skip: true"
    assert cli(project, "run", "tasks/hello_python.yaml", "--output-dir", str(out)).returncode == 0
    stats = task_json(out, "hello-python")["command_stats"]
    assert (stats["total_commands"], stats["failed_commands"], sorted(stats["by_tool"])) == (2, 0, ["Bash", "Write"])


def test_a_priced_model_is_held_to_max_usd(tmp_path, fake_messages_api):
    from fakes.messages_api import text_reply

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url},
                        extra_config='[model.prices.claude-test]\ninput = 3.0\noutput = 15.0\n')
    path = root / "tasks" / "cost.yaml"
    path.write_text(textwrap.dedent("""
        task_id: cost
        description: d
        initial_prompt: answer
        agent: {type: anthropic, model: claude-test}
        sandbox: {python: null}
        run_limits: {max_usd: 0.01}
        success_criteria: [{type: file_exists, path: missing, description: d}]
    """))
    fake_messages_api.enqueue(text_reply("ok", usage=(1000, 1000)))  # 0.003 + 0.015 USD
    with dg.instance_for_test() as instance:
        (result,) = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "o", instance=instance).results
    assert result.final_status.value == "COST_BUDGET_EXCEEDED"
    assert result.error_message == "run_limits.max_usd=0.01 exceeded: the agent cost $0.0180"
    assert result.iterations[0].token_usage.total_cost_usd == pytest.approx(0.018)


@pytest.mark.slow
def test_the_docker_driver_runs_the_agent_commands_and_criteria_in_a_container(docker_engine, tmp_path):
    import docker as docker_sdk

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={})
    path = root / "tasks" / "boxed.yaml"
    path.write_text(textwrap.dedent("""
        task_id: boxed
        description: the agent works inside a container with the task's limits
        initial_prompt: note where you are
        agent:
          type: replay
          episodes:
            - match: "where"
              reply: noted
              actions: [{tool: Bash, arguments: {command: "pwd > where.txt && cat /proc/1/cgroup > /dev/null"}}]
        sandbox:
          driver: docker
          python: null
          docker: {image: "agentenv-sandbox:busybox", network: none}
          limits: {max_memory_mb: 128, max_pids: 64}
        pre_run:
          - {command: "ls /bin/busybox > tool.txt"}
        success_criteria:
          - {type: file_contains, path: where.txt, includes: [/workspace], description: the Bash call ran in the container}
          - {type: file_contains, path: tool.txt, includes: [/bin/busybox], description: pre_run ran in the container}
          - {type: run_command, command: "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
             expected_stdout: "64", description: the pids limit reached the container}
    """))
    with dg.instance_for_test() as instance:
        run = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance)
    (result,) = run.results
    rows = [(r.description, r.score, r.details) for r in result.success_criteria_results]
    assert result.final_status.value == "SUCCESS", rows
    client = docker_sdk.from_env()
    try:
        assert client.containers.list(all=True, filters={"label": "agentenv.run_id"}) == []  # torn down
    finally:
        client.close()
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_recorded_cli_mocks_answer_the_agent_and_cli_called_grades_the_calls(tmp_path):
    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={})
    (root / "tasks" / "bin").mkdir()
    (root / "tasks" / "bin" / "legacy").write_text("#!/bin/sh\necho legacy tool\n")
    path = root / "tasks" / "cli.yaml"
    path.write_text(textwrap.dedent("""
        task_id: cli
        description: the agent drives a CLI that is recorded, not real
        initial_prompt: deploy the app
        agent:
          type: replay
          episodes:
            - match: deploy
              reply: deployed
              actions:
                - {tool: Bash, arguments: {command: "uipath deploy --env prod app > deploy.out"}}
                - {tool: Bash, arguments: {command: "uipath status"}}
                - {tool: Bash, arguments: {command: "legacy > legacy.out"}}
        sandbox:
          python: null
          mock_path_dirs: [tools]
          template_sources: [{type: template_dir, path: bin, mount_point: tools}]
          record_cli:
            - tool: uipath
              stdout: "unknown command\\n"
              responses:
                - {when: {verb: deploy, flags: {env: prod}}, stdout: "deployed to prod\\n"}
        success_criteria:
          - {type: cli_called, tool: uipath, verb: deploy, flags: {env: prod}, description: deployed to prod}
          - {type: cli_called, tool: uipath, verb: delete, min_count: 0, max_count: 0, description: nothing deleted}
          - {type: file_contains, path: deploy.out, includes: ["deployed to prod"], description: the mock answered}
          - {type: file_contains, path: legacy.out, includes: ["legacy tool"], description: mock_path_dirs are on PATH}
    """))
    with dg.instance_for_test() as instance:
        (result,) = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance).results
    rows = [(r.description, r.score, r.error) for r in result.success_criteria_results]
    assert result.final_status.value == "SUCCESS", rows
    log = Path(result.sandbox_path) / "cli_mocks" / "calls.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["argv"], r["rule"], r["exit"]) for r in records] == [
        (["deploy", "--env", "prod", "app"], 0, 0), (["status"], None, 1)]


WORDS_TASK = textwrap.dedent("""
    task_id: words
    description: one partition per row
    initial_prompt: "Say ${{row.word}}"
    agent:
      type: replay
      episodes:
        - {{match: "Say (hi|yo)", reply: "ok", actions: [{{tool: Write, arguments: {{file_path: out.txt, content: said}}}}]}}
    sandbox: {{python: null}}
    dataset:
      rows: [{{id: r1, word: hi}}, {{id: r2, word: yo}}, {{id: r3, word: bye}}]
    success_criteria:
      - {{type: file_exists, path: out.txt, description: the agent wrote{extra}}}
""")


def test_a_dataset_task_is_a_job_partitioned_by_row(project):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    defs = build_definitions(project / "tasks")
    job = defs.resolve_job_def("words")
    assert job.partitions_def.get_partition_keys() == ["r1", "r2", "r3"]
    # the steps keep their row tokens (each row fills them as it runs); rows are not config
    assert default_steps(job)["prompt"]["prompt"] == "Say <row.word>"
    key = dg.AssetKey(["verifications", "words", "success_criteria"])
    assert defs.resolve_asset_graph().get(key).partitions_def.get_partition_keys() == ["r1", "r2", "r3"]
    with dg.instance_for_test() as instance:
        for row in ("r1", "r3"):
            job.execute_in_process(instance=instance, partition_key=row)
        assert instance.get_materialized_partitions(key) == {"r1", "r3"}
        scores = {
            row: instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=[row]), limit=1
            ).records[0].asset_materialization.metadata["passed"].value
            for row in ("r1", "r3")
        }
    assert scores == {"r1": True, "r3": False}  # r3 has no scripted reply: graded, and fails


def test_a_run_with_nothing_but_a_partition_tag_runs_that_row_with_its_partition_s_steps(project):
    """What `dg launch --job words --partition r2` or `dagster job execute --tags` send: no run
    config, so the steps come from the partition, as the launchpad would have filled them."""
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    job = build_definitions(project / "tasks").resolve_job_def("words")
    with dg.instance_for_test() as instance:
        assert job.execute_in_process(instance=instance, tags={"dagster/partition": "r2"}).success
        assert instance.get_materialized_partitions(dg.AssetKey(["verifications", "words", "success_criteria"])) == {"r2"}


LABELS_TASK = textwrap.dedent("""
        task_id: labels
        description: classify each message
        initial_prompt: "Classify: ${row.text}"
        agent:
          type: replay
          episodes:
            - {match: "refund", reply: done, actions: [{tool: Write, arguments: {file_path: label.txt, content: billing}}]}
            - {match: "crash", reply: done, actions: [{tool: Write, arguments: {file_path: label.txt, content: bug}}]}
            - {match: "hello", reply: done, actions: [{tool: Write, arguments: {file_path: label.txt, content: billing}}]}
        sandbox: {python: null}
        dataset:
          rows:
            - {id: a, text: "I want a refund", label: billing}
            - {id: b, text: "the app crashes", label: bug}
            - {id: c, text: "hello there", label: other}
        success_criteria:
          - type: classification_match
            description: the label
            path: label.txt
            expected_label: "${row.label}"
            allowed_labels: [billing, bug, other]
            suite_thresholds: {accuracy: 0.9, completion_rate: 1.0}
""")


def test_a_dataset_suite_is_aggregated_and_its_thresholds_gate_the_exit_code(project, tmp_path):
    (project / "tasks" / "labels.yaml").write_text(LABELS_TASK)
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/labels.yaml", "--output-dir", str(out))
    assert done.returncode == 1, done.stdout + done.stderr  # two of three right: accuracy 0.67 < 0.9
    suite = json.loads((out / "default" / "labels" / "suite.json").read_text())
    (gate,) = suite["criterion_aggregates"]
    assert gate["metrics"]["accuracy"] == pytest.approx(2 / 3)
    assert {(c["metric"], c["passed"]) for c in gate["checks"]} == {("accuracy", False), ("completion_rate", True)}
    assert gate["details"]["confusion"] == [
        {"expected": "billing", "observed": "billing", "count": 1}, {"expected": "bug", "observed": "bug", "count": 1},
        {"expected": "other", "observed": "billing", "count": 1}]
    assert suite["passed"] is False and "accuracy = 0.66" in done.stdout
    # the CLI's run is in the project's instance, and so is the suite asset it materialized
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        key = dg.AssetKey(["suites", "labels"])
        metadata = instance.get_latest_materialization_event(key).asset_materialization.metadata
        assert (metadata["rows_run"].value, metadata["passed"].value) == (3, False)
        checks = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(key, "criterion_1_accuracy"), dg.AssetCheckKey(key, "criterion_1_completion_rate")])
        assert {k.name: c.event.dagster_event.event_specific_data.passed for k, c in checks.items()} == {
            "criterion_1_accuracy": False, "criterion_1_completion_rate": True}


@pytest.mark.slow
def test_a_gate_on_any_label_is_a_check_dagster_can_name_and_a_metric_never_computed_warns(project, tmp_path):
    gates = '{"recall.(other)": 0.5, "f1.bug-fix": 0.5, "f1.bug_fix": 0.5, "f1.macro": 0.5}'
    (project / "tasks" / "labels.yaml").write_text(
        LABELS_TASK.replace("{accuracy: 0.9, completion_rate: 1.0}", gates))
    suite = build_definitions(project / "tasks").get_assets_def(dg.AssetKey(["suites", "labels"]))
    assert sorted(spec.name for spec in suite.check_specs) == [  # labels may hold what Dagster names cannot
        "criterion_1_f1_bug_fix", "criterion_1_f1_bug_fix_", "criterion_1_f1_macro", "criterion_1_recall__other_",
        "no_regression"]
    done = cli(project, "run", "tasks/labels.yaml", "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and ("field 'success_criteria.0.suite_thresholds.f1.macro': classification_match "
                                   "computes no suite metric 'f1.macro' (did you mean 'macro_f1'?)") in warnings[0]
    assert "recall.(other) = None (min 0.5): SHORT" in done.stdout  # no row answered off the labels
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        key = dg.AssetCheckKey(dg.AssetKey(["suites", "labels"]), "criterion_1_recall__other_")
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        assert check.event.dagster_event.event_specific_data.passed is False


def test_a_task_whose_definitions_dagster_refuses_is_a_broken_job_not_a_broken_location(project):
    from agentenv_dagster.errors import TaskLoadError
    from agentenv_dagster.orchestration.translator import TaskTranslator

    class OddGroups(TaskTranslator):
        """A translator override that names one task's group as Dagster cannot."""

        def get_group_name(self, plan):
            return "words and more" if plan.task_id == "words" else super().get_group_name(plan)

    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=""))
    (project / "tasks" / "labels.yaml").write_text(LABELS_TASK)
    defs = build_definitions(project / "tasks", translator=OddGroups())
    assert defs.resolve_job_def("labels").partitions_def.get_partition_keys() == ["a", "b", "c"]
    broken = defs.resolve_job_def("words__invalid")
    assert "words.yaml" in broken.description and "Dagster refuses its definitions" in broken.description
    assert "words and more" in broken.description
    with pytest.raises(TaskLoadError, match="Dagster refuses its definitions"):
        build_definitions(project / "tasks", translator=OddGroups(), strict=True)


@pytest.mark.slow
def test_the_suite_asset_rolls_up_the_row_partitions_with_blocking_threshold_checks(project):
    (project / "tasks" / "words.yaml").write_text(WORDS_TASK.format(extra=", suite_thresholds: {mean: 0.5}"))
    defs = build_definitions(project / "tasks")
    suite_key = dg.AssetKey(["suites", "words"])
    with dg.instance_for_test() as instance:
        for row in ("r1", "r2", "r3"):
            defs.resolve_job_def("words").execute_in_process(instance=instance, partition_key=row)
        result = dg.materialize([defs.get_assets_def(suite_key)], instance=instance, resources={})
        assert result.success
        metadata = {k: v.value for k, v in instance.get_latest_materialization_event(suite_key)
                    .asset_materialization.metadata.items()}
        checks = {c.check_name: c.passed for c in result.get_asset_check_evaluations()}
    assert metadata["rows_run"] == 3 and metadata["pass_rate"] == pytest.approx(2 / 3)
    assert checks == {"criterion_1_mean": True, "no_regression": True}  # a first roll-up: no baseline yet


def test_an_agent_out_of_turns_is_max_turns_exhausted(tmp_path, fake_messages_api):
    from fakes.messages_api import tool_use_reply

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={}, model={"api_key": "sk-test", "base_url": fake_messages_api.base_url})
    path = root / "tasks" / "turns.yaml"
    path.write_text(textwrap.dedent("""
        task_id: turns
        description: d
        initial_prompt: keep going
        agent: {type: anthropic, model: claude-test}
        sandbox: {python: null}
        run_limits: {max_turns: 2}
        success_criteria: [{type: file_exists, path: a.txt, description: d}]
    """))
    fake_messages_api.enqueue(*[tool_use_reply("Write", {"file_path": "a.txt", "content": "x"})] * 3)
    with dg.instance_for_test() as instance:
        (result,) = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "o", instance=instance).results
    assert result.final_status.value == "MAX_TURNS_EXHAUSTED" and result.max_turns_exhausted
    assert [r.score for r in result.post_failure_criteria_results] == [1.0]  # graded for diagnosis only
    assert len(fake_messages_api.requests) == 2


def test_row_values_fill_only_the_prompt_and_criteria_and_must_exist(project):
    from agentenv_dagster.compiler import load_plan
    from agentenv_dagster.config import load_config
    from agentenv_dagster.errors import TaskLoadError

    text = textwrap.dedent("""
        task_id: rows
        description: d
        initial_prompt: "Say ${row.word}"
        agent: {type: replay, episodes: []}
        sandbox:
          python: null
          template_sources: [{type: starter_files, files: [{path: note.txt, content: "${row.word}"}]}]
        dataset:
          rows: [{id: r1, word: hi, empty: null}]
        success_criteria:
          - {type: file_contains, path: out.txt, includes: ["${row.word}${row.empty}"], description: d}
    """)
    path = project / "tasks" / "rows.yaml"
    path.write_text(text)
    plan = load_plan(path, load_config(project))
    assert plan.document.partitions == {"r1": {"row.empty": "", "row.word": "hi"}}
    workspace = next(s for s in plan.steps if s.id == "workspace")
    assert "${row.word}" in json.dumps(workspace.sandbox)  # never in sandbox/templates
    path.write_text(text.replace("${row.word}${row.empty}", "${row.missing}"))
    with pytest.raises(TaskLoadError, match=r"field 'dataset': row 'r1': \$\{row.missing\} names no field of the row"):
        load_plan(path, load_config(project))


@pytest.mark.slow
def test_an_experiment_runs_every_variant_and_replicate_with_the_layered_merge(project, tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (experiments / "default.yaml").write_text(textwrap.dedent("""
        experiment_id: default
        defaults:
          run_limits: {max_turns: 7}
          pre_run: [{command: "echo default > layer.txt"}]
        variants: [{variant_id: default}]
    """))
    (experiments / "ab.yaml").write_text(textwrap.dedent("""
        experiment_id: ab
        defaults:
          repeats: 2
          prompt_mutations: [{type: prefix, content: "Please:"}]
        variants:
          - variant_id: plain
          - variant_id: shouty
            prompt_mutations: [{type: replace, pattern: "hello.py", replacement: "the script"}]
            run_limits: {max_turns: 3}
    """))
    out = tmp_path / "out"
    done = cli(project, "run", "tasks/hello_python.yaml", "--experiment", str(experiments / "ab.yaml"),
               "--output-dir", str(out))
    assert done.returncode == 1, done.stdout + done.stderr  # the shouty prompt has no scripted reply
    summary = json.loads((out / "run.json").read_text())
    rows = sorted((r["variant_id"], r["replicate_index"], r["status"]) for r in summary["task_results"])
    assert rows == [("plain", 0, "SUCCESS"), ("plain", 1, "SUCCESS"), ("shouty", 0, "ERROR"), ("shouty", 1, "ERROR")]
    plain = json.loads((out / "plain" / "hello-python" / "01" / "task.json").read_text())
    resolved = plain["task_config"]["resolved"]
    assert resolved["initial_prompt"].startswith("Please:\n\nCreate hello.py")
    assert resolved["run_limits"]["max_turns"] == 10  # the task's own value beats the defaults
    assert [c["command"] for c in resolved["pre_run"]] == ["echo default > layer.txt"]
    shouty = json.loads((out / "shouty" / "hello-python" / "00" / "task.json").read_text())
    assert shouty["task_config"]["resolved"]["run_limits"]["max_turns"] == 3  # the variant beats the task
    report = json.loads((out / "experiment.json").read_text())
    assert report["variant_ids"] == ["plain", "shouty"]
    (summary_row,) = report["task_summaries"]
    assert (summary_row["best_variant"], summary_row["is_tie"], summary_row["replicate_count"]) == ("plain", False, 2)
    assert report["variant_aggregates"]["shouty"]["tasks_error"] == 2
    assert json.loads((out / "plain" / "variant.json").read_text())["pass_rate"] == 1.0


@pytest.mark.slow
def test_a_docker_dataset_never_holds_more_containers_than_max_sandboxes(docker_engine, tmp_path):
    """60 rows in containers, 4 in flight: `docker ps`, polled throughout the run, never shows
    more than max_sandboxes (twice rows_in_flight by default) of the run's containers, each row
    releasing its own as it leaves the run; none is left afterwards."""
    import threading

    import docker as docker_sdk

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task

    root = make_project(tmp_path / "p", tasks={})
    (root / "tasks" / "rows.jsonl").write_text("".join(json.dumps({"id": f"r{i:02d}"}) + "\n" for i in range(60)))
    path = root / "tasks" / "boxed_rows.yaml"
    path.write_text(textwrap.dedent("""
        task_id: boxed-rows
        description: every row's agent works in its own container
        initial_prompt: "Row ${row.id}: note it"
        agent:
          type: replay
          episodes:
            - match: "Row"
              reply: noted
              actions: [{sleep: 0.2}, {tool: Bash, arguments: {command: "echo done > note.txt"}}]
        sandbox:
          driver: docker
          python: null
          docker: {image: "agentenv-sandbox:busybox", network: none}
        dataset:
          paths: [rows.jsonl]
        success_criteria:
          - {type: file_contains, path: note.txt, includes: [done], description: the row's note}
    """))
    client = docker_sdk.from_env()
    seen: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(len(client.containers.list(filters={"label": "agentenv.run_id"}, sparse=True)))
            done.wait(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with dg.instance_for_test() as instance:
            run = run_coder_eval_task(path, load_config(root), output_dir=tmp_path / "out", instance=instance,
                                      rows_in_flight=4)
    finally:
        done.set()
        poller.join()
    try:
        assert len(run.results) == 60 and all(r.final_status.value == "SUCCESS" for r in run.results)
        print(f"containers alive at once: at most {max(seen)} of 60 rows")
        assert 0 < max(seen) <= 8, max(seen)  # 4 agents working, at most 4 rows being graded
        assert client.containers.list(all=True, filters={"label": "agentenv.run_id"}) == []
    finally:
        client.close()
