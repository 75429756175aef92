"""Every command the README and the docs mark as runnable offline runs, as written.

A page marks a block with an HTML comment on the line right before its opening fence:

- ``<!-- offline -->``: a shell block that runs in a few seconds;
- ``<!-- offline: slow -->``: a shell block that takes longer (a task run): run with ``-m slow``;
- ``<!-- offline: file PATH -->`` / ``<!-- offline: append PATH -->``: the block is written to
  (appended to) ``PATH`` in the project, for the shell blocks after it.

Each page's blocks run in document order in a fresh copy of the project (``make_project``),
with ``DAGSTER_HOME`` inside it and no model API key; every shell block must exit 0 and leave
no server running.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from projects import REPO, leaked_servers, make_project

MARKER = re.compile(r"^<!-- offline(?:: (?P<what>.*?))? -->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
SHELLS = ("bash", "sh", "shell", "console")
KEYS_LEFT_OUT = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL",
                 "LITELLM_API_KEY", "LITELLM_BASE_URL", "AGENT_ENV_CONFIG", "AGENTENV_DAGSTER_EXECUTOR")
BLOCK_TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str  # "shell" | "file" | "append"
    text: str
    slow: bool = False
    path: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def marked_blocks(path: Path, root: Path = REPO) -> list[Block]:
    """The marked blocks of a page, in order. A marker not followed by a fence, or one with an
    unknown instruction, is an error: a typo must not silently drop a command from the test."""
    page = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for index, line in enumerate(lines):
        marker = MARKER.match(line)
        if not marker:
            continue
        what = (marker.group("what") or "").strip()
        fence = FENCE.match(lines[index + 1]) if index + 1 < len(lines) else None
        if fence is None:
            raise ValueError(f"{page}:{index + 1}: an offline marker must be right before a fenced block")
        end = next((j for j in range(index + 2, len(lines)) if lines[j].strip() == fence.group("fence")), None)
        if end is None:
            raise ValueError(f"{page}:{index + 2}: the fenced block never closes")
        text = "\n".join(lines[index + 2:end]) + "\n"
        kind, _, target = what.partition(" ")
        if what in ("", "slow"):
            if fence.group("lang") not in SHELLS:
                raise ValueError(f"{page}:{index + 2}: an offline command block must be a shell block "
                                 f"(```bash), not '{fence.group('lang')}'")
            blocks.append(Block(page, index + 3, "shell", text, slow=what == "slow"))
        elif kind in ("file", "append") and target:
            blocks.append(Block(page, index + 3, kind, text, path=target))
        else:
            raise ValueError(f"{page}:{index + 1}: unknown offline marker '{what}' "
                             "(expected: nothing, 'slow', 'file PATH' or 'append PATH')")
    return blocks


def _cases():
    for path in pages():
        blocks = marked_blocks(path)
        page = path.relative_to(REPO).as_posix()
        if any(b.kind == "shell" and not b.slow for b in blocks):
            yield pytest.param(page, False, id=f"{page}-fast")
        if any(b.kind == "shell" and b.slow for b in blocks):
            yield pytest.param(page, True, id=f"{page}-slow", marks=pytest.mark.slow)


def _project(root: Path) -> Path:
    """A copy of this checkout's project: tasks, artifacts, agents, config, the code location."""
    project = make_project(root)
    for name in ("definitions.py", "workspace.yaml", "pyproject.toml"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "experiments", project / "experiments")
    return project


def _environment(project: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEYS_LEFT_OUT}
    env["DAGSTER_HOME"] = str(project / ".dagster_home")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.mark.parametrize(("page", "slow"), list(_cases()))
def test_marked_commands_run_offline(page: str, slow: bool, tmp_path: Path):
    project = _project(tmp_path / "project")
    (project / ".dagster_home").mkdir()
    env = _environment(project)
    for block in marked_blocks(REPO / page):
        if block.kind != "shell":
            target = project / block.path
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a" if block.kind == "append" else "w", encoding="utf-8") as out:
                out.write(("\n" if block.kind == "append" else "") + block.text)
            continue
        if block.slow and not slow:
            continue
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.text], cwd=project, env=env,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n$ {block.text}\n--- stdout\n{done.stdout[-3000:]}"
            f"\n--- stderr\n{done.stderr[-3000:]}")
    assert leaked_servers(project / ".agentenv" / "state") == []


def test_every_marker_is_well_formed():
    """Parsing every page raises on a misplaced or misspelled marker (see ``marked_blocks``)."""
    found = [block for path in pages() for block in marked_blocks(path)]
    assert any(b.kind == "shell" and not b.slow for b in found)


def test_a_misplaced_or_misspelled_marker_is_an_error(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("<!-- offline: slwo -->\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match=r"^page.md:1: unknown offline marker 'slwo'"):
        marked_blocks(page, tmp_path)
    page.write_text("<!-- offline -->\n```python\nprint()\n```\n")
    with pytest.raises(ValueError, match=r"^page.md:2: an offline command block must be a shell block"):
        marked_blocks(page, tmp_path)
    page.write_text("<!-- offline -->\n\n```bash\ntrue\n```\n")
    with pytest.raises(ValueError, match=r"^page.md:1: an offline marker must be right before a fenced block"):
        marked_blocks(page, tmp_path)


def test_a_marked_page_yields_its_blocks_in_order(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("<!-- offline: file a.txt -->\n```text\nA\n```\n\n<!-- offline: slow -->\n"
                    "```bash\ncat a.txt\n```\n<!-- offline -->\n```bash\ntrue\n```\n")
    blocks = marked_blocks(page, tmp_path)
    assert [(b.kind, b.path, b.slow, b.text) for b in blocks] == [
        ("file", "a.txt", False, "A\n"), ("shell", None, True, "cat a.txt\n"), ("shell", None, False, "true\n")]
