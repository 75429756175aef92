"""reference_comparison: ast, token and complexity similarity, and who is at fault when it cannot run."""

from __future__ import annotations

import os
from difflib import SequenceMatcher

import pytest
from criteria_helpers import context, grade, write
from pydantic import ValidationError

from agentenv_dagster.criteria import CheckerMisuseError, parse_criterion
from agentenv_dagster.criteria.reference import block_complexities, token_kinds

REFERENCE = "def f(x):\n    if x:\n        return 1\n    return 0\n"


@pytest.fixture
def dirs(tmp_path):
    sandbox, reference = tmp_path / "sandbox", tmp_path / "reference"
    write(reference, {"solution.py": REFERENCE, "empty.py": "  \n", "flat.py": "x = 1\n"})
    sandbox.mkdir()
    return sandbox, reference


def compare(dirs, agent_source, method="ast", reference_file="solution.py", **fields):
    sandbox, reference = dirs
    if agent_source is not None:
        write(sandbox, {"agent.py": agent_source})
    criterion = {"type": "reference_comparison", "agent_file": "agent.py", "reference_file": reference_file,
                 "comparison_method": method, **fields}
    return grade(criterion, context(sandbox, [], reference_dir=reference))


def test_similarity_threshold_overrides_pass_threshold():
    base = {"type": "reference_comparison", "description": "d", "agent_file": "a.py", "reference_file": "r.py"}
    assert parse_criterion(base).pass_threshold == 0.8
    assert parse_criterion({**base, "pass_threshold": 0.5, "similarity_threshold": 0.6}).pass_threshold == 0.6
    with pytest.raises(ValidationError, match="reference_file\n  Field required"):
        parse_criterion({"type": "reference_comparison", "description": "d", "agent_file": "a.py"})
    with pytest.raises(ValidationError, match="escapes the sandbox"):
        parse_criterion({**base, "reference_file": "../secrets.py"})


def test_identical_code_is_fully_similar_by_every_method(dirs):
    assert compare(dirs, REFERENCE, "ast").score == 1.0
    assert compare(dirs, REFERENCE, "token").score == 1.0


def test_ast_compares_node_kinds_breadth_first(dirs):
    result = compare(dirs, "x = 1\n", "ast")
    agent = ["Module", "Assign", "Name", "Constant", "Store"]
    reference = ["Module", "FunctionDef", "arguments", "If", "Return", "arg", "Name", "Return", "Constant",
                 "Constant", "Load"]
    assert result.score == pytest.approx(SequenceMatcher(None, agent, reference).ratio())
    assert result.details == f"Comparison method: ast\nSimilarity: {result.score:.3f}\nThreshold: 0.800"


def test_token_similarity_ignores_token_values(dirs):
    renamed = REFERENCE.replace("f(x)", "g(y)").replace("if x", "if y").replace("1", "7")
    assert compare(dirs, renamed, "token").score == 1.0
    assert compare(dirs, renamed, "ast").score == 1.0


def test_token_kinds_keep_what_precedes_incomplete_code():
    assert token_kinds("x = (1,\n")[:6] == ["ENCODING", "NAME", "OP", "OP", "NUMBER", "OP"]


def test_complexity_scores_against_the_reference(dirs):
    result = compare(dirs, REFERENCE, "complexity")
    # cc 2 vs 2: 1 - 2/3; lines 4 vs 4: 1 - 4/6; one block each: 1.0
    assert result.score == pytest.approx(0.5 * (1 / 3) + 0.3 * (1 / 3) + 0.2 * 1.0)
    assert "cyclomatic 2 vs 2 (0.333), lines 4 vs 4 (0.333), blocks 1 vs 1 (1.000)" in result.details


def test_a_reference_without_complexity_fails_the_comparison(dirs):
    result = compare(dirs, REFERENCE, "complexity", reference_file="flat.py")
    assert (result.score, result.error) == (0.0, "Comparison failed: ZeroDivisionError: float division by zero")


@pytest.mark.parametrize("source, blocks", [
    ("def f(a, b, c):\n    return (a and b) or c\n", [3]),
    ("def f():\n    try:\n        pass\n    except KeyError:\n        pass\n    except ValueError:\n        pass\n"
     "    else:\n        pass\n", [4]),
    ("def f(xs):\n    for x in xs:\n        pass\n    else:\n        pass\n    while xs:\n        break\n", [4]),
    ("def f(xs):\n    with open('a'):\n        assert xs\n    return [x for x in xs if x]\n", [5]),
    ("def f(v):\n    match v:\n        case 1:\n            pass\n        case 2:\n            pass\n"
     "        case _:\n            pass\n", [3]),
    ("def f(v):\n    def inner():\n        if v:\n            pass\n    return inner if v else None\n", [2]),
    ("class C:\n    def a(self, x):\n        if x:\n            pass\n"
     "    def b(self, x):\n        if x:\n            pass\n", [3, 2, 2]),
    ("class Empty:\n    x = 1 if True else 2\n", [2]),
    ("x = 1 if True else 2\n", []),
])
def test_block_complexities_count_like_radon(source, blocks):
    assert block_complexities(source) == blocks


def test_a_syntax_error_fails_the_comparison(dirs):
    result = compare(dirs, "def broken(:\n", "ast")
    assert result.score == 0.0 and result.error.startswith("Comparison failed: SyntaxError: ")


def test_missing_pieces(dirs):
    sandbox, _ = dirs
    no_reference = grade({"type": "reference_comparison", "agent_file": "agent.py", "reference_file": "solution.py"},
                         context(sandbox, []))
    assert no_reference.score == 0.0
    assert no_reference.error == "No reference configured for this task (reference.directory is not set)"
    missing_agent = compare(dirs, None)
    assert (missing_agent.score, missing_agent.error) == (0.0, "Agent file not found: agent.py")


@pytest.mark.parametrize("reference_file, message", [
    ("nope.py", "reference_file 'nope.py' does not exist in the reference directory"),
    ("empty.py", "reference_file 'empty.py' is empty"),
])
def test_a_broken_reference_is_the_tasks_fault(dirs, reference_file, message):
    with pytest.raises(CheckerMisuseError, match=message):
        compare(dirs, REFERENCE, reference_file=reference_file)


def test_a_reference_symlinked_out_of_its_directory_is_the_tasks_fault(dirs, tmp_path):
    (tmp_path / "elsewhere.py").write_text(REFERENCE)
    os.symlink(tmp_path / "elsewhere.py", dirs[1] / "linked.py")
    with pytest.raises(CheckerMisuseError, match="reference_file 'linked.py' cannot be read: 'linked.py' resolves outside"):
        compare(dirs, REFERENCE, reference_file="linked.py")
