"""Nothing outlives a killed run: ``kill -9`` of the CLI mid-prompt ends the run's servers
within seconds (they watch the run's owner), leaves no seed file, and the next reaping
ends what the run's ledger lists and marks the Dagster run failed; old run folders are pruned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import httpx
import pytest

from agentenv_dagster.config import load_config
from agentenv_dagster.orchestration.reaper import prune_old_runs, reap_dead_runs
from agentenv_dagster.runtime.local import Ledger
from agentenv_dagster.runtime.processes import ProcessIdentity, is_running
from projects import make_project

SLOW_AGENT = """
[agents.registry.slow]
kind = "replay"
episodes = [{match = ".", reply = "late", actions = [{write_file = "/app/started.txt", content = "yes"}, {sleep = 300}]}]
"""
TASK = [
    {"id": "env", "type": "deploy_env", "env_id": "email", "depends_on": []},
    {"id": "agent", "type": "deploy_agent", "a2a_agent_id": "slow", "agent_name": "a", "env_ids": ["email"]},
    {"id": "ask", "type": "prompt_agent", "agent_name": "a", "prompt_id": "p", "prompt": "take your time",
     "timeout_seconds": 600},
]


def wait_for(predicate, what: str, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {what} within {seconds}s")


@pytest.mark.slow
def test_kill_9_of_the_cli_mid_prompt_ends_its_servers_and_the_reaping_fails_the_run(tmp_path):
    project = make_project(tmp_path / "p", tasks={"slow.json": TASK}, extra_config=SLOW_AGENT)
    state = project / ".agentenv" / "state"
    env = {**os.environ, "DAGSTER_HOME": str(project / ".dagster_home")}
    cli = subprocess.Popen([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/slow.json"], cwd=project,
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        started = wait_for(lambda: next(iter(state.glob("runs/*/sandboxes/*/app/started.txt")), None),
                           "prompt under way", 180)
        run_dir = started.parents[3]
        ledger = Ledger.of_run(run_dir)
        servers = {iid: e for iid, e in ledger.entries().items() if e.get("pid")}
        assert len(servers) == 2  # the env and the agent host
        assert ledger.owner().pid == cli.pid  # the run's owner: the CLI itself
        # another process, with no token, gets nowhere
        for entry in servers.values():
            for method, path in (("POST", "/agents"), ("POST", "/agentenv"), ("GET", "/.well-known/agent-env.json")):
                assert httpx.request(method, entry["url"] + path, json={}).status_code == 401
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        killed = time.monotonic()
        wait_for(lambda: not any(is_running(e["pid"]) for e in servers.values()), "end of the run's servers", 5)
        assert time.monotonic() - killed < 5
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert not list(state.glob("tmp*.json"))  # the seed context was never a file on disk

    config = load_config(project)
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        run = instance.get_run_by_id(run_dir.name)
        assert run.status == dg.DagsterRunStatus.STARTED  # what the kill left
    # the next run of the CLI reaps it
    (project / "tasks" / "quick.json").write_text(json.dumps([{"id": "env", "type": "deploy_env", "env_id": "email"}]))
    after = subprocess.run([sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/quick.json"], cwd=project,
                           env=env, capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stdout + after.stderr
    with dg.DagsterInstance.from_config(str(project / ".dagster_home")) as instance:
        run = instance.get_run_by_id(run_dir.name)
        assert run.status == dg.DagsterRunStatus.FAILURE
        failure = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)[-1]
        assert failure.message.startswith(f"agentenv: the process that ran this run (pid {cli.pid}) ended before "
                                          "the run did (killed?); ended what it left running:")
        assert ledger.closed
        assert reap_dead_runs(instance, config) == []  # once


def test_a_run_whose_owner_lives_is_left_alone_and_old_finished_runs_are_pruned(tmp_path):
    runs = tmp_path / "runs"
    live, old, recent = (Ledger.of_run(runs / name) for name in ("live", "old", "recent"))
    live.claim_owner(ProcessIdentity.of(os.getpid()))
    for ledger in (old, recent):
        ledger.claim_owner(ProcessIdentity.of(os.getpid()))
        ledger.close()
    long_ago = time.time() - 3 * 86400
    for folder in (runs / "old", runs / "old" / "deployments", runs / "live", runs / "live" / "deployments"):
        os.utime(folder, (long_ago, long_ago))
    assert prune_old_runs(runs, keep_days=2) == ["old"]
    assert sorted(p.name for p in runs.iterdir()) == ["live", "recent"]  # a live run is never pruned
    assert prune_old_runs(runs, keep_days=0) == []  # 0 keeps them all


def test_the_retention_setting_is_read_from_the_config(tmp_path):
    assert load_config(tmp_path).stores.keep_runs_days == 30  # the default
    project = make_project(tmp_path / "p", tasks={})
    config_file = project / ".agentenv" / "config.toml"
    config_file.write_text(config_file.read_text().replace("[stores]\n", "[stores]\nkeep_runs_days = 7\n", 1))
    assert load_config(project).stores.keep_runs_days == 7
