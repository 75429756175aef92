"""Shared fixtures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fakes.messages_api import FakeMessagesAPI


@pytest.fixture
def fake_messages_api():
    """A fake Anthropic Messages API on 127.0.0.1; script it with ``enqueue(...)``, point
    clients at ``base_url``, read ``requests`` afterwards."""
    with FakeMessagesAPI() as api:
        yield api


@pytest.fixture
def anyio_backend():
    """The servers and clients under test run on asyncio only (trio is installed too)."""
    return "asyncio"


DOCKER_ENGINE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docker_engine.sh"


def _engine(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DOCKER_ENGINE_SCRIPT), command], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="session")
def docker_engine():
    """A private engine with the busybox image, DOCKER_HOST pointing at it; always stopped
    afterwards, even when starting it failed halfway."""
    try:
        try:
            started = _engine("start", timeout=600)
        except subprocess.TimeoutExpired as exc:
            pytest.skip(f"no Docker engine on this machine: {exc}")
        if started.returncode != 0:
            reason = (started.stderr.strip().splitlines() or [f"exit {started.returncode}"])[-1]
            pytest.skip(f"no Docker engine on this machine: {reason}")
        built = _engine("image", timeout=120)
        assert built.returncode == 0, built.stderr
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DOCKER_HOST", started.stdout.strip())
            yield started.stdout.strip()
    finally:
        stopped = _engine("stop", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
