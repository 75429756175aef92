"""file_exists, file_contains, file_check and file_matches_regex over real files."""

from __future__ import annotations

import pytest
from criteria_helpers import context, grade, write

IGNORECASE, MULTILINE, DOTALL = 2, 8, 16


@pytest.fixture
def sandbox(tmp_path):
    return write(tmp_path, {
        "app.py": "import datetime\nprint('Hello')\n# TODO: tidy\n",
        "config.py": "DEBUG = True\nAPI_KEY = 'abc123'\n",
        "long.txt": "x" * 300,
    })


def check(sandbox, **criterion):
    return grade(criterion, context(sandbox, []))


def test_file_exists(sandbox):
    (sandbox / "pkg").mkdir()
    assert check(sandbox, type="file_exists", path="app.py").score == 1.0
    assert check(sandbox, type="file_exists", path="pkg").score == 1.0
    missing = check(sandbox, type="file_exists", path="nope.py")
    assert (missing.score, missing.details, missing.error) == (0.0, "File 'nope.py' does not exist", None)


@pytest.mark.parametrize("includes, excludes, score", [
    (["Hello", "import datetime", "Goodbye"], None, 2 / 3),
    ([], ["TODO", "FIXME"], 0.5),
    (["Hello", "Goodbye"], ["TODO", "FIXME"], 0.5),
    (["Hello"], [], 1.0),
    ([], None, 1.0),
    (["hello"], None, 0.0),  # case-sensitive substrings
])
def test_file_contains_scores(sandbox, includes, excludes, score):
    result = check(sandbox, type="file_contains", path="app.py", includes=includes, excludes=excludes)
    assert result.score == pytest.approx(score)


def test_file_contains_details_and_missing_file(sandbox):
    result = check(sandbox, type="file_contains", path="app.py", includes=["Hello", "Goodbye"], excludes=["TODO"])
    assert result.details == ("File 'app.py'; Includes: 1/2 found (missing: ['Goodbye']); "
                              "Excludes: 0/1 absent (present: ['TODO']); Score: 0.25")
    missing = check(sandbox, type="file_contains", path="gone.py", includes=["x"])
    assert (missing.score, missing.error) == (0.0, "File 'gone.py' does not exist")


def test_file_contains_requires_includes(sandbox):
    with pytest.raises(Exception, match="includes\n  Field required"):
        check(sandbox, type="file_contains", path="app.py")


def test_file_check_without_sub_checks_is_existence(sandbox):
    result = check(sandbox, type="file_check", path="app.py")
    assert (result.score, result.details) == (1.0, "File 'app.py' exists")
    missing = check(sandbox, type="file_check", path="nope.py", includes=["x"])
    assert (missing.score, missing.error) == (0.0, "File 'nope.py' does not exist")


def test_file_check_averages_only_active_categories(sandbox):
    only_includes = check(sandbox, type="file_check", path="app.py", includes=["Hello", "Bye"])
    assert only_includes.score == 0.5
    all_three = check(sandbox, type="file_check", path="app.py", includes=["Hello", "Bye"], excludes=["TODO"],
                      patterns=[{"pattern": r"^print\(", "flags": MULTILINE}, {"pattern": "import os", "must_match": False}])
    assert all_three.score == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert all_three.details.endswith(
        "Patterns: 2/2 satisfied (/^print\\(/ must match: matched 'print(', /import os/ must not match: no match); Score: 0.50")


def test_file_check_patterns_invert_flag_and_report_invalid_regex(sandbox):
    result = check(sandbox, type="file_check", path="config.py", patterns=[
        {"pattern": "debug = true", "flags": IGNORECASE},
        {"pattern": "API_KEY", "must_match": False},
        {"pattern": "([unclosed"},
    ])
    assert result.score == pytest.approx(1 / 3)
    assert "/([unclosed/ invalid regex: unterminated character set at position 1" in result.details
    assert result.error is None


def test_file_check_rejects_unknown_pattern_keys(sandbox):
    with pytest.raises(Exception, match="musst_match\n  Extra inputs are not permitted"):
        check(sandbox, type="file_check", path="app.py", patterns=[{"pattern": "x", "musst_match": True}])


def test_file_matches_regex(sandbox):
    hit = check(sandbox, type="file_matches_regex", path="config.py", pattern=r"^API_KEY = '\w+'$", flags=MULTILINE)
    assert (hit.score, hit.details) == (1.0, "File 'config.py': /^API_KEY = '\\w+'$/ must match: matched \"API_KEY = 'abc123'\"")
    assert check(sandbox, type="file_matches_regex", path="config.py", pattern=r"^API_KEY = '\w+'$").score == 0.0
    assert check(sandbox, type="file_matches_regex", path="config.py", pattern="debug", must_match=False).score == 1.0
    assert check(sandbox, type="file_matches_regex", path="config.py", pattern="debug", flags=IGNORECASE,
                 must_match=False).score == 0.0
    assert check(sandbox, type="file_matches_regex", path="app.py", pattern="datetime.*Hello",
                 flags=DOTALL).score == 1.0


def test_file_matches_regex_quotes_at_most_100_chars(sandbox):
    result = check(sandbox, type="file_matches_regex", path="long.txt", pattern="x+")
    assert result.details == f"File 'long.txt': /x+/ must match: matched '{'x' * 100}'"


def test_file_matches_regex_errors(sandbox):
    bad = check(sandbox, type="file_matches_regex", path="app.py", pattern="(")
    assert (bad.score, bad.error) == (0.0, "Invalid regex /(/: missing ), unterminated subpattern at position 0")
    missing = check(sandbox, type="file_matches_regex", path="nope.py", pattern="x")
    assert (missing.score, missing.error) == (0.0, "File 'nope.py' does not exist")
