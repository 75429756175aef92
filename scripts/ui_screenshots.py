"""Take the docs' screenshots of the Dagster UI: run ``reply_to_dana`` in a copy of the example
project, change its judge model (which makes the rubric's score stale), start ``dagster dev`` and
photograph pages with headless Chromium into ``docs/images/``.

    python scripts/ui_screenshots.py [--keep]   # needs chromium (Debian: apt-get install chromium)
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
PAGES = {  # image name -> UI path
    "ui-asset-graph.png": "/locations/agentenv_tasks/asset-groups/reply_to_dana/lineage",
    "ui-asset-checks.png": "/assets/verifications/reply_to_dana/sent?view=checks",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def project_copy(root: Path) -> Path:
    for name in ("tasks", "agents", "artifacts", "definitions.py", "workspace.yaml", ".agentenv"):
        source = REPO / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, root / name)
    shutil.rmtree(root / ".agentenv" / "state", ignore_errors=True)
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the temporary project (its path is printed)")
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        sys.exit("chromium not found (Debian: apt-get install -y chromium)")
    root = project_copy(Path(tempfile.mkdtemp(prefix="agentenv-ui-")))
    env = {**os.environ, "DAGSTER_HOME": str(root / ".dagster_home")}
    (root / ".dagster_home").mkdir()
    subprocess.run([shutil.which("agentenv-dagster") or "agentenv-dagster", "run", "--quiet", "tasks/reply_to_dana.json"],
                   cwd=root, env=env, check=False)
    config = root / ".agentenv" / "config.toml"
    config.write_text(config.read_text() + '\n[model.roles]\njudge = "claude-opus-4-1"\n')  # the rubric goes stale
    port = free_port()
    ui = subprocess.Popen(["dagster", "dev", "-w", "workspace.yaml", "-p", str(port)], cwd=root, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        time.sleep(10)  # the code location loads after the webserver answers
        IMAGES.mkdir(exist_ok=True)
        for image, path in PAGES.items():
            subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                            f"--user-data-dir={root / '.chromium'}", "--window-size=1440,1060",
                            "--virtual-time-budget=30000", f"--screenshot={IMAGES / image}",
                            f"http://127.0.0.1:{port}{path}"], check=True, capture_output=True, timeout=120)
            print(f"wrote {IMAGES / image}")
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(ui.pid, signal.SIGKILL)
        if args.keep:
            print(f"project: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
