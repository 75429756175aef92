"""MkDocs hooks of the docs site (``hooks:`` in mkdocs.yml).

A page line that is exactly ``<!-- reference: NAME -->`` becomes the generated field reference
``NAME`` of ``scripts/docs_reference.py`` (from the pydantic models), so the configuration and
task-format references cannot drift from the code. An unknown NAME fails the build.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- reference: ([a-z0-9-]+) -->$", re.MULTILINE)


def _references():
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.REFERENCES


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not MARKER.search(markdown):
        return markdown
    references = _references()

    def generated(match: re.Match) -> str:
        name = match.group(1)
        if name not in references:
            raise ValueError(f"{page.file.src_path}: unknown reference '{name}' (known: {', '.join(references)})")
        return references[name]()

    return MARKER.sub(generated, markdown)
