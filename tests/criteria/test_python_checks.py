"""pytest and import_check, run as real subprocesses in a temp sandbox."""

from __future__ import annotations

import pytest
from criteria_helpers import context, grade, write

from agentenv_dagster.criteria.python_checks import absolute_imports, pytest_counts

PASSING = "def test_a():\n    assert True\n"
MIXED = "def test_a():\n    assert True\n\ndef test_b():\n    assert False\n"


def check(sandbox, **fields):
    """Plugin autoload off: the inner pytest starts faster, and it shows ``ctx.env`` reaches it."""
    return grade(fields, context(sandbox, [], env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}))


def test_every_test_passing_scores_one(tmp_path):
    write(tmp_path, {"tests/test_ok.py": PASSING})
    result = check(tmp_path, type="pytest", path="tests/", timeout=60)
    assert result.score == 1.0
    assert result.details.startswith(
        "Exit code: 0, Pytest: 1 passed, 0 failed, 0 errors, 0 skipped out of 1 collected (score: 1.00)")


def test_score_is_the_share_passing_and_args_reach_pytest(tmp_path):
    write(tmp_path, {"test_mixed.py": MIXED, "test_other.py": PASSING})
    assert check(tmp_path, type="pytest").score == pytest.approx(2 / 3)
    assert check(tmp_path, type="pytest", path="test_mixed.py", args=["-k", "test_a"]).score == 1.0


def test_nothing_collected_or_nothing_run_scores_zero(tmp_path):
    write(tmp_path, {"tests/readme.txt": "no tests",
                     "skipping/test_skip.py": "import pytest\n\n@pytest.mark.skip\ndef test_s():\n    pass\n"})
    empty = check(tmp_path, type="pytest", path="tests")
    assert empty.score == 0.0 and "Pytest: no tests collected (score: 0.00)" in empty.details
    skipped = check(tmp_path, type="pytest", path="skipping")
    assert skipped.score == 0.0 and "Pytest: 1 collected, 1 skipped, none ran (score: 0.00)" in skipped.details


def test_a_non_zero_exit_never_scores_perfect(tmp_path):
    failing_exit = "def pytest_sessionfinish(session, exitstatus):\n    session.exitstatus = 3\n"
    write(tmp_path, {"test_ok.py": PASSING, "conftest.py": failing_exit})
    result = check(tmp_path, type="pytest")
    assert result.score == 0.99 and result.details.startswith("Exit code: 3, ")


def test_pytest_timeout(tmp_path):
    write(tmp_path, {"test_slow.py": "import time\n\ndef test_slow():\n    time.sleep(30)\n"})
    result = check(tmp_path, type="pytest", timeout=1.5)
    assert (result.score, result.error) == (0.0, "pytest timed out after 1.5s")


def test_summary_parsing_uses_the_closing_line():
    quiet = "..F\nprinted 9 passed by a test\nFAILED test_x.py::test_c\n2 passed, 1 failed, 1 error in 0.03s\n"
    assert pytest_counts(quiet) == {"passed": 2, "failed": 1, "errors": 1, "skipped": 0, "collected": 4}
    verbose = "collected 5 items\n\n===== 3 passed, 2 skipped in 0.10s =====\n"
    assert pytest_counts(verbose) == {"passed": 3, "failed": 0, "errors": 0, "skipped": 2, "collected": 5}


def test_absolute_imports_walks_every_scope_and_skips_relative_ones():
    source = (
        "import os, json as j\nfrom collections import abc\nfrom . import sibling\nfrom .pkg import x\n"
        "try:\n    import yaml\nexcept ImportError:\n    pass\n\ndef f():\n    import os.path\n    from xml.dom import minidom\n"
    )
    assert absolute_imports(source) == ["os", "json", "collections", "yaml", "os.path", "xml.dom"]


def test_import_check_scores_resolved_share(tmp_path):
    write(tmp_path, {
        "app/main.py": "import json\nimport helpers\nimport definitely_not_a_module_xyz\n\ndef f():\n    from os import path\n",
        "app/helpers.py": "VALUE = 1\n",
    })
    result = check(tmp_path, type="import_check", path="app/main.py")
    assert result.score == pytest.approx(3 / 4)
    assert result.details == "Checked: 4, resolved: 3/4; Failed: definitely_not_a_module_xyz"


def test_import_check_edge_cases(tmp_path):
    write(tmp_path, {"ok.py": "import os\n", "plain.py": "x = 1\n", "bad.py": "def broken(:\n"})
    assert check(tmp_path, type="import_check", path="ok.py").score == 1.0
    plain = check(tmp_path, type="import_check", path="plain.py")
    assert (plain.score, plain.details) == (1.0, "No imports to check")
    bad = check(tmp_path, type="import_check", path="bad.py")
    assert bad.score == 0.0 and bad.error.startswith("SyntaxError: ") and bad.details.startswith("Syntax error in 'bad.py': ")
    missing = check(tmp_path, type="import_check", path="nope.py")
    assert (missing.score, missing.error) == (0.0, "File 'nope.py' does not exist")
