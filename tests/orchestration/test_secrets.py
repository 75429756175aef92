"""No secret reaches the IO manager's files, the event log, or context.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fakes.messages_api import tool_use_reply

from projects import REPO, leaked_servers, make_project

JUDGE_KEY = "sk-ant-judge-SECRET-4f1c"
OVERRIDE_KEY = "sk-litellm-SECRET-9b2e"


def test_secrets_never_reach_run_storage_event_log_or_context(tmp_path, fake_messages_api):
    steps = json.loads((REPO / "tasks" / "reply_to_dana.json").read_text())
    next(s for s in steps if s["id"] == "tone")["use_agent_judge"] = False
    project = make_project(tmp_path / "p", tasks={"reply_to_dana.json": steps}, model={
        "api_key": "env:JUDGE_KEY", "base_url": fake_messages_api.base_url,
    })
    fake_messages_api.enqueue(tool_use_reply("submit_verdict", {"results": [
        {"id": "c1", "score": 1, "justification": "polite"}, {"id": "c2", "score": 1, "justification": "explains"},
    ]}))
    out = tmp_path / "out"
    env = {**os.environ, "JUDGE_KEY": JUDGE_KEY, "DAGSTER_HOME": str(project / ".dagster_home")}
    done = subprocess.run(
        [sys.executable, "-m", "agentenv_dagster.cli", "run", "tasks/reply_to_dana.json", "--output-dir", str(out),
         "-D", f"metadata.user_overrides.litellm_api_key={OVERRIDE_KEY}",
         "-D", f'metadata.remote_tokens={{"github": "{OVERRIDE_KEY}"}}'],
        cwd=project, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verification tone: 1.000" in done.stdout  # the judge really ran, with the key
    assert fake_messages_api.requests[0].headers["authorization"] == f"Bearer {JUDGE_KEY}"

    scanned = 0
    for folder in (project / ".agentenv" / "state", project / ".dagster_home", out):
        for path in folder.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                scanned += 1
                assert JUDGE_KEY.encode() not in data, path
                assert OVERRIDE_KEY.encode() not in data, path
    assert scanned > 10
    assert list((project / ".dagster_home").rglob("*.db")), "the event log was not scanned"
    context = json.loads((out / "context.json").read_text())
    assert "remote_tokens" not in context["metadata"]
    assert leaked_servers(project / ".agentenv" / "state") == []
