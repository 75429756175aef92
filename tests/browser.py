"""Headless Chromium for tests that look at pages the way a person would (Debian's package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium binary not found (Debian: apt-get install -y chromium)"
)
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"  # screenshots CI can keep


def chromium(profile: Path, url: str, *args: str, timeout: float = 60) -> str:
    """One isolated headless run of ``url`` (a page's URI or an http URL); returns stdout."""
    completed = subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", *args, url,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return completed.stdout
