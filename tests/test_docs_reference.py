"""The docs' generated field references (scripts/docs_reference.py) cover the models."""

from __future__ import annotations

import importlib.util
import re

import pytest

from projects import REPO


def _reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _reference_module()


@pytest.mark.parametrize("name", sorted(reference.REFERENCES))
def test_each_reference_renders_with_unique_anchors(name: str):
    text = reference.REFERENCES[name]()
    anchors = re.findall(r"\{ #([a-z0-9-]+) \}", text)
    assert anchors and len(anchors) == len(set(anchors))
    for link in re.findall(r"\]\(#([a-z0-9-]+)\)", text):
        assert link in anchors or link in ("agents", "criteria"), f"{name}: link to #{link} has no target"


def test_every_setting_has_a_type_default_and_description():
    text = reference.REFERENCES["configuration"]()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    undescribed = [row.split("|")[1].strip() for row in rows if row.rstrip().endswith("| — |")]
    assert rows and undescribed == []


def test_a_field_is_described_where_it_is_declared():
    from pydantic import BaseModel, Field

    class Probe(BaseModel):
        # above the field
        # on two lines
        above: int = 1
        trailing: str = "x"  # after the field
        documented: bool = Field(default=False, description="from Field")
        docstring: int = 0
        """from the attribute docstring"""
        bare: list[str] = []

    ref = reference.Reference("probe")
    ref.table(Probe)
    rows = {line.split("|")[1].strip(): line for line in ref.text().splitlines() if line.startswith("| `")}
    assert rows["`above`"].endswith("| above the field on two lines |")
    assert rows["`trailing`"].endswith("| after the field |")
    assert rows["`documented`"].endswith("| from Field |")
    assert rows["`docstring`"].endswith("| from the attribute docstring |")
    assert rows["`bare`"] == "| `bare` | list[string] | `[]` | — |"
    assert rows["`above`"].startswith("| `above` | integer | `1` |")
