"""Shared fixtures."""

from __future__ import annotations

import compileall
import faulthandler
import os
import signal
import subprocess
from pathlib import Path

import pytest
from fakes.messages_api import FakeMessagesAPI
from projects import NO_CORPUS
from projects import upstream_corpus as find_upstream_corpus


@pytest.fixture
def fake_messages_api():
    """A fake Anthropic Messages API on 127.0.0.1; script it with ``enqueue(...)``, point
    clients at ``base_url``, read ``requests`` afterwards."""
    with FakeMessagesAPI() as api:
        yield api


@pytest.fixture(scope="session")
def upstream_corpus() -> Path:
    """The upstream task corpus (``projects.upstream_corpus``); the test skips without it."""
    folder = find_upstream_corpus()
    if folder is None:
        pytest.skip(NO_CORPUS)
    return folder


@pytest.fixture
def anyio_backend():
    """The servers and clients under test run on asyncio only (trio is installed too)."""
    return "asyncio"


DOCKER_ENGINE_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "docker_engine.sh"


def _engine(command: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(DOCKER_ENGINE_SCRIPT), command], capture_output=True, text=True, timeout=timeout, check=False
    )


def _engine_or_skip(command: str, timeout: float, why: str) -> subprocess.CompletedProcess:
    """Run the engine script, or skip saying ``why`` and the script's last word."""
    try:
        done = _engine(command, timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.skip(f"{why}: {exc}")
    if done.returncode != 0:
        pytest.skip(f"{why}: {(done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]}")
    return done


def pytest_configure(config):
    """The package's bytecode, compiled once before the tests: the tests start hundreds of
    subprocesses (CLIs, servers, runs), and where ``PYTHONDONTWRITEBYTECODE`` is set (as on CI
    machines) each of them would otherwise compile the package again. (Once, in the controller
    of an xdist run, not in each worker.)"""
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(Path(__file__).resolve().parents[1] / "agentenv_dagster", quiet=1)
    if stacks := os.environ.get("AGENTENV_STACKS_DIR"):  # scripts/bounded.sh asks a hung run where it stands
        config.stacks_file = open(Path(stacks) / f"{os.getpid()}.txt", "w")  # noqa: SIM115 - open until the process ends
        faulthandler.register(signal.SIGUSR1, file=config.stacks_file, all_threads=True)


def pytest_collection_modifyitems(items):
    """The tests on the private Docker engine share one xdist worker: the engine is one
    machine-wide daemon, and a worker that finished would stop it under the other's feet."""
    for item in items:
        if "docker_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("docker_engine"))


@pytest.fixture(scope="session")
def docker_engine():
    """A private engine with the busybox image, DOCKER_HOST pointing at it; always stopped
    afterwards, even when starting it failed halfway. Skipped, with the script's reason,
    where the engine cannot start or the image cannot be built."""
    try:
        started = _engine_or_skip("start", 600, "no Docker engine on this machine")
        _engine_or_skip("image", 120, "the busybox sandbox image could not be built")
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("DOCKER_HOST", started.stdout.strip())
            yield started.stdout.strip()
    finally:
        stopped = _engine("stop", timeout=120)
        assert stopped.returncode == 0, stopped.stderr


@pytest.fixture
def fake_chat_api():
    """A fake Chat Completions API (OpenAI, LiteLLM, vLLM, Ollama) on 127.0.0.1; script it with
    ``enqueue(...)``, point clients at ``base_url`` (it ends in ``/v1``), read ``requests``."""
    from fakes.chat_completions_api import FakeChatCompletionsAPI

    with FakeChatCompletionsAPI() as api:
        yield api
