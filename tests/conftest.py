"""Shared fixtures."""

from __future__ import annotations

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
