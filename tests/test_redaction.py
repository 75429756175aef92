"""Redaction: a secret-named key's string becomes ``***`` at any depth and in any case; every
known secret value becomes ``***`` wherever it is echoed; a step's context is scrubbed as the
step ends; a step's log lines are scrubbed too."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from agentenv_dagster.context import TaskStepContext
from agentenv_dagster.redaction import redact, redact_text, redacted_json, remember_secret
from agentenv_dagster.runtime.base import RedactingLogger
from agentenv_dagster.steps.base import TaskStep
from agentenv_dagster.steps.execution import StepFailed, run_step

KEY = "sk-ant-api03-REDACTION-7f3a9c"


def test_secret_named_keys_are_masked_in_any_case_at_any_depth():
    data = {"metadata": {
        "ANTHROPIC_API_KEY": "sk-1-abcdef", "password": "hunter2", "seed": {"token": "tok-abcdef", "name": "acme"},
        "Client_Secret": ["s-1", "s-2"], "headers": {"Authorization": "Bearer abc"},
        "usage": {"input_tokens": 12, "output_tokens": 3}, "token_usage": {"model": "claude", "calls": 1},
        "partition_key": "row-1", "stop_token": "###STOP###",
    }}
    assert redact(data) == {"metadata": {
        "ANTHROPIC_API_KEY": "***", "password": "***", "seed": {"token": "***", "name": "acme"},
        "Client_Secret": ["***", "***"], "headers": {"Authorization": "***"},
        "usage": {"input_tokens": 12, "output_tokens": 3}, "token_usage": {"model": "claude", "calls": 1},
        "partition_key": "row-1", "stop_token": "###STOP###",
    }}


def test_a_value_found_under_a_secret_key_is_scrubbed_wherever_it_is_echoed():
    data = {"metadata": {"password": "hunter2-horse"},
            "prompt_responses": [{"prompt_id": "p", "response": "your password is hunter2-horse!"}]}
    safe = redact(data)
    assert safe["prompt_responses"][0]["response"] == "your password is ***!"
    assert "hunter2-horse" not in redacted_json(data).decode()


def test_known_secrets_are_scrubbed_from_any_text(monkeypatch):
    monkeypatch.setenv("SOME_SERVICE_TOKEN", "tok-from-the-environment-1234")
    remember_secret(KEY)
    text = f"ANTHROPIC_API_KEY={KEY}\nSOME_SERVICE_TOKEN=tok-from-the-environment-1234\nHOME=/root"
    assert redact_text(text) == "ANTHROPIC_API_KEY=***\nSOME_SERVICE_TOKEN=***\nHOME=/root"
    assert json.loads(redacted_json({"details": text})) == {"details": redact_text(text)}


def test_the_live_context_keeps_what_the_run_needs_and_loses_the_copies():
    remember_secret(KEY)
    ctx = TaskStepContext.from_dict({
        "metadata": {"seed": {"token": "tok-keep-me-123"}, "notes": f"leaked {KEY} and tok-keep-me-123"}})
    ctx.scrub_secret_values()
    assert ctx.metadata["seed"]["token"] == "tok-keep-me-123"  # later steps fill <token> from it
    assert ctx.metadata["notes"] == "leaked *** and ***"
    assert "tok-keep-me-123" not in json.dumps(ctx.to_safe_dict())


class EchoStep(TaskStep):
    """Records what an agent printed, then fails saying it again."""

    fail_with: bool = False

    async def execute(self, ctx, rt) -> None:
        ctx.metadata["bash_output"] = f"ANTHROPIC_API_KEY={KEY}"
        if self.fail_with:
            raise RuntimeError(f"command printed {KEY}")


def test_a_step_leaves_its_context_and_failure_scrubbed():
    remember_secret(KEY)
    ctx = TaskStepContext()
    asyncio.run(run_step(EchoStep(id="echo", type="echo"), ctx, rt=None))
    assert ctx.metadata["bash_output"] == "ANTHROPIC_API_KEY=***"
    with pytest.raises(StepFailed) as failed:
        asyncio.run(run_step(EchoStep(id="echo", type="echo", fail_with=True), ctx, rt=None))
    assert failed.value.record["error"] == "command printed ***"
    assert KEY not in json.dumps(ctx.to_dict())


def test_a_step_log_line_is_scrubbed(caplog):
    remember_secret(KEY)
    log = RedactingLogger(logging.getLogger("agentenv_dagster.test"))
    with caplog.at_level(logging.INFO, "agentenv_dagster.test"):
        log.info("the agent said %s", f"key={KEY}")
        log.warning(f"again {KEY}")
    assert [r.getMessage() for r in caplog.records] == ["the agent said key=***", "again ***"]
