"""reset_env against real env servers: the email env's state cleared through its data plane,
and upstream's tolerance: a missing env or one without ``data/reset`` is skipped, a failed reset
only logged unless ``fail_task_on_error`` (reference agentenv.md §3 "Other steps", §4)."""

from __future__ import annotations

import json
import logging
import re

import pytest
from fakes.messages_api import ThreadedServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentenv_dagster.config import load_config
from agentenv_dagster.errors import TaskLoadError
from agentenv_dagster.runtime.base import artifact_store
from agentenv_dagster.steps import BUILTIN_STEPS
from agentenv_dagster.steps.execution import StepFailed
from projects import leaked_servers, make_project, run_steps

EMAIL = {"id": "email", "type": "deploy_env", "env_id": "email"}
INBOX = {"id": "inbox", "type": "load_artifact", "env_id": "email", "artifact_id": "inbox"}


def snapshot(step_id: str) -> dict:
    return {"id": step_id, "type": "snapshot_env", "env_id": "email", "snapshot_id": step_id}


def snapshotted_state(root, snapshot_id: str) -> dict:
    universe = artifact_store(load_config(root)).get(snapshot_id)
    return json.loads(universe.files["email.json"].read_text())


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p")
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_reset_clears_what_the_env_was_loaded_with(project):
    context = run_steps(project, [
        EMAIL, INBOX, snapshot("before"),
        {"id": "reset", "type": "reset_env", "env_id": "email"},
        snapshot("after"),
    ])
    assert [e["id"] for e in snapshotted_state(project, "before")["inbox"]][:2] == ["e1", "e2"]
    assert snapshotted_state(project, "after") == {"inbox": [], "sent": []}
    assert "failed_steps" not in context.metadata


def test_a_failed_reset_is_logged_and_tolerated_by_default(project, caplog):
    stop = {"id": "stop", "type": "teardown_sandboxes", "env_ids": ["email"]}
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        context = run_steps(project, [EMAIL, stop, {"id": "reset", "type": "reset_env", "env_id": "email"}])
    # upstream swallows it: the step succeeds, nothing lands in failed_steps
    assert "failed_steps" not in context.metadata
    assert any(r.getMessage().startswith("reset_env: reset failed (DataPlaneError('data/reset failed: ")
               and r.getMessage().endswith("; continuing") for r in caplog.records)

    with pytest.raises(StepFailed, match=re.escape("step 'reset' (reset_env) failed: data/reset failed: ")):
        run_steps(project, [EMAIL, stop, {"id": "reset", "type": "reset_env", "env_id": "email",
                                          "fail_task_on_error": True}])


def test_an_env_that_is_not_deployed_is_skipped(project, caplog):
    # the deploy failed (tolerated): the env is declared by an ancestor but absent at run time
    with caplog.at_level(logging.WARNING, logger="agentenv_dagster"):
        context = run_steps(project, [
            {"id": "deploy", "type": "deploy_env", "env_id": "nowhere", "fail_task_on_error": False},
            {"id": "reset", "type": "reset_env", "env_id": "nowhere", "fail_task_on_error": True},
        ])
    assert [f["step_id"] for f in context.metadata["failed_steps"]] == ["deploy"]
    assert "reset_env: no deployed env 'nowhere' in context; skipping" in caplog.messages


def _env_without_reset(calls: list[str]) -> Starlette:
    """A live env whose card offers no data/reset; ``/bare`` serves no card at all."""

    async def card(request: Request) -> JSONResponse:
        return JSONResponse({"name": "frozen", "protocolVersion": "1.0", "url": "/agentenv",
                             "capabilities": {"tools": [], "operations": ["data/get"], "extensions": []}})

    async def rpc(request: Request) -> JSONResponse:
        body = await request.json()
        calls.append(body["method"])
        return JSONResponse({"jsonrpc": "2.0", "id": body["id"], "result": {"parts": []}})

    return Starlette(routes=[Route("/.well-known/agent-env.json", card), Route("/agentenv", rpc, methods=["POST"])])


def test_an_env_without_a_reset_operation_is_skipped(tmp_path):
    calls: list[str] = []
    with ThreadedServer(_env_without_reset(calls)) as server:
        root = make_project(tmp_path / "p", extra_config=(
            f'[envs.registry.frozen]\nmcp_url = "{server.url}/mcp"\n'
            f'[envs.registry.bare]\nmcp_url = "{server.url}/bare/mcp"\n'
        ))
        context = run_steps(root, [
            {"id": "frozen", "type": "deploy_env", "env_id": "frozen"},
            {"id": "bare", "type": "deploy_env", "env_id": "bare"},
            {"id": "reset1", "type": "reset_env", "env_id": "frozen", "fail_task_on_error": True},
            {"id": "reset2", "type": "reset_env", "env_id": "bare", "fail_task_on_error": True},
        ])
    assert calls == []  # never asked to reset
    assert "failed_steps" not in context.metadata
    assert [e.env_provider_type for e in context.deployed_envs] == ["live", "live"]


def test_fields_and_defaults(tmp_path):
    cls = BUILTIN_STEPS.get("reset_env")
    step = cls.model_validate({"id": "r", "type": "reset_env", "env_id": "email"})
    assert step.fail_task_on_error is False
    assert step.to_document() == {"id": "r", "type": "reset_env", "env_id": "email", "version": None,
                                  "fail_task_on_error": False}
    root = make_project(tmp_path / "p", tasks={})
    for bad in ({}, {"env_id": ""}):
        with pytest.raises(TaskLoadError, match=re.escape("step 'r': reset_env step requires 'env_id'")):
            run_steps(root, [{"id": "r", "type": "reset_env", **bad}])
    with pytest.raises(TaskLoadError, match=re.escape("step 'r': field 'env_id': no step it depends on deploys env 'email'")):
        run_steps(root, [{"id": "r", "type": "reset_env", "env_id": "email"}])
