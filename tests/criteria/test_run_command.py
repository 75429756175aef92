"""run_command through real bash subprocesses: exit codes, stdout modes, self-scoring, env, timeouts."""

from __future__ import annotations

import time

import pytest
from criteria_helpers import context, grade
from pydantic import ValidationError

from agentenv_dagster.criteria import parse_criterion


def run(sandbox, command, **fields):
    ctx_fields = {k: fields.pop(k) for k in ("reference_dir", "task_dir", "env") if k in fields}
    return grade({"type": "run_command", "command": command, **fields}, context(sandbox, [], **ctx_fields))


def test_exit_code_decides_and_details_show_both_streams(tmp_path):
    ok = run(tmp_path, "echo out; echo err >&2")
    assert (ok.score, ok.error) == (1.0, None)
    assert ok.details == "Command: echo out; echo err >&2\nExit code: 0 (expected 0)\nStdout: out\n\nStderr: err\n"
    assert run(tmp_path, "exit 3").score == 0.0
    assert run(tmp_path, "exit 3", expected_exit_code=3).score == 1.0
    assert run(tmp_path, "true").details.endswith("Stdout: (empty)\nStderr: (empty)")


def test_runs_in_the_sandbox_with_pipes(tmp_path):
    (tmp_path / "data.txt").write_text("b\na\nc\n")
    assert run(tmp_path, "sort data.txt | head -1", expected_stdout="a").score == 1.0


@pytest.mark.parametrize("mode, expected, stdout_cmd, score", [
    ("exact", "Hello, World!", "printf '  Hello, World!\\n\\n'", 1.0),
    ("exact", "Hello", "echo Hello World", 0.0),
    ("contains", "  World  ", "echo Hello World", 1.0),
    ("contains", "world", "echo Hello World", 0.0),
    ("regex", r"^\d+ items$", "echo 42 items", 1.0),
    ("regex", " 42", "echo 42 items", 0.0),  # the pattern is not stripped
    ("regex", "(", "echo (", 0.0),  # an invalid pattern is a mismatch
])
def test_stdout_match_modes(tmp_path, mode, expected, stdout_cmd, score):
    result = run(tmp_path, stdout_cmd, expected_stdout=expected, stdout_match=mode)
    assert result.score == score
    assert result.details.endswith(f"Stdout ({mode}) {'matches' if score else 'does not match'} {expected!r}")


def test_stdout_match_needs_the_exit_code_too(tmp_path):
    assert run(tmp_path, "echo done; exit 1", expected_stdout="done").score == 0.0


def test_score_from_stdout_excludes_expected_stdout():
    with pytest.raises(ValidationError, match="'score_from_stdout' and 'expected_stdout' are mutually exclusive"):
        parse_criterion({"type": "run_command", "description": "d", "command": "x", "score_from_stdout": True,
                         "expected_stdout": "1"})


def test_score_from_stdout_reads_the_first_line(tmp_path):
    result = run(tmp_path, "printf '0.75\\n3 of 4 checks\\n'", score_from_stdout=True)
    assert (result.score, result.error) == (0.75, None)
    assert result.details.startswith("Score from stdout: 0.75\n3 of 4 checks\nCommand: ")


@pytest.mark.parametrize("printed, score, note", [("1.5", 1.0, "(clamped from 1.5)"), ("-2", 0.0, "(clamped from -2)")])
def test_score_from_stdout_clamps(tmp_path, printed, score, note):
    result = run(tmp_path, f"echo {printed}", score_from_stdout=True)
    assert result.score == score and note in result.details and result.error is None


@pytest.mark.parametrize("command, error", [
    ("echo 0.9; exit 2", "Exit code 2 != expected 0"),
    ("true", "score_from_stdout: the first stdout line is empty"),
    ("printf '\\n0.5\\n'", "score_from_stdout: the first stdout line is empty"),
    ("echo high", "score_from_stdout: first line 'high' is not a number"),
    ("echo nan", "score_from_stdout: nan is not a finite score"),
    ("echo -inf", "score_from_stdout: -inf is not a finite score"),
])
def test_score_from_stdout_failures(tmp_path, command, error):
    result = run(tmp_path, command, score_from_stdout=True)
    assert (result.score, result.error) == (0.0, error)


def test_environment_names_the_task_and_reference_dirs(tmp_path):
    sandbox, task, reference = (tmp_path / name for name in ("sandbox", "task", "ref"))
    for folder in (sandbox, task, reference):
        folder.mkdir()
    with_ref = run(sandbox, 'echo "$TASK_DIR|$REFERENCE_DIR|$EXTRA"', task_dir=task, reference_dir=reference,
                   env={"EXTRA": "from-run"}, expected_stdout=f"{task}|{reference}|from-run")
    assert with_ref.score == 1.0
    without_ref = run(sandbox, 'echo "${REFERENCE_DIR-unset}"', task_dir=task, expected_stdout="unset")
    assert without_ref.score == 1.0


def test_timeout_kills_the_command_and_its_children(tmp_path):
    started = time.monotonic()
    result = run(tmp_path, "sleep 30 & sleep 30; echo never", timeout=0.5)
    assert time.monotonic() - started < 5
    assert (result.score, result.error) == (0.0, "Command timed out after 0.5s")
    assert "Exit code: timed out (expected 0)" in result.details


def test_long_streams_are_truncated_with_a_count(tmp_path):
    result = run(tmp_path, "python3 -c \"print('y' * 4500, end='')\"")
    assert f"Stdout: {'y' * 4000}… (500 more chars truncated)\nStderr: (empty)" in result.details


def test_timeout_must_be_positive():
    with pytest.raises(ValidationError, match="greater than 0"):
        parse_criterion({"type": "run_command", "description": "d", "command": "x", "timeout": 0})


def test_a_command_never_sees_our_keys_only_what_the_task_passes(tmp_path, monkeypatch):
    secret = "sk-ant-api03-CRITERIA-2b7c4e"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    result = run(tmp_path, "env", env={"PASSED": "yes"})
    assert secret not in result.details and "PASSED=yes" in result.details and "TASK_DIR=" in result.details
