from __future__ import annotations

import pytest
from projects import leaked_servers, make_project


@pytest.fixture
def project(tmp_path):
    """A copy of the checkout's project; fails the test if a run left a server behind."""
    root = make_project(tmp_path / "project")
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []
