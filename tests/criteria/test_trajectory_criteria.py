"""command_executed (filters, shell normalization, ranges, live verdict) and commands_efficiency."""

from __future__ import annotations

import pytest
from criteria_helpers import bash, call, context, grade
from pydantic import ValidationError

from agentenv_dagster.criteria import parse_criterion
from agentenv_dagster.criteria.trajectory import normalize_shell


def executed(calls, tmp_path, **fields):
    return grade({"type": "command_executed", **fields}, context(tmp_path, calls))


def test_match_with_tool_pattern_and_success(tmp_path):
    result = executed([bash("curl https://wttr.in/London")], tmp_path,
                      tool_name="Bash", command_pattern=r"curl.*wttr\.in", require_success=True)
    assert (result.score, result.error) == (1.0, None)
    assert result.details == (
        "Matched 1/1 required commands (filters: tool_name=Bash, pattern=/curl.*wttr\\.in/, require_success=True)"
        "\nExamples: ['curl https://wttr.in/London']")


def test_no_match_is_zero_without_error(tmp_path):
    result = executed([bash("ls -la")], tmp_path, tool_name="Bash", command_pattern="curl")
    assert (result.score, result.error) == (0.0, None)


def test_no_telemetry_is_an_error_naming_turn_records(tmp_path):
    result = executed(None, tmp_path, command_pattern="curl")
    assert result.score == 0.0 and "turn_records" in result.error


def test_empty_trajectory_is_scored_not_short_circuited(tmp_path):
    result = executed([], tmp_path)
    assert result.score == 0.0 and "0/1 required" in result.details
    assert executed([], tmp_path, command_pattern="x", min_count=0).score == 1.0
    assert executed([], tmp_path, command_pattern="x", min_count=0, max_count=0).score == 1.0


def test_tool_name_filter(tmp_path):
    calls = [call("Read", file_path="main.py"), bash("python main.py"), call("Read", file_path="test.py")]
    result = executed(calls, tmp_path, tool_name="Read", min_count=2)
    assert result.score == 1.0 and "2/2" in result.details


def test_require_success_drops_failed_calls(tmp_path):
    calls = [bash("curl https://api.example.com", "error"), bash("curl https://api.example.com")]
    assert executed(calls, tmp_path, command_pattern="curl", min_count=2, require_success=True).score == 0.5
    assert executed(calls, tmp_path, command_pattern="curl", min_count=2).score == 1.0


def test_partial_credit(tmp_path):
    calls = [bash("git add ."), bash("git commit -m 'test'")]
    assert executed(calls, tmp_path, command_pattern="git", min_count=3).score == pytest.approx(2 / 3)


def test_patterns_span_continued_lines(tmp_path):
    multiline = 'uip is resources execute create "sf" \\\n  --connection-id "abc" \\\n  --body \'{"a": 1}\''
    assert executed([bash(multiline)], tmp_path, command_pattern=r"uip\s+is\s+resources.*--body").score == 1.0
    calls = [bash("uip foo \\\n  --help"), bash("uip foo \\\n  --bar")]
    result = executed(calls, tmp_path, command_pattern=r"uip\s+foo", exclude_pattern=r"foo.*--help")
    assert result.score == 1.0 and "1/1" in result.details


@pytest.mark.parametrize("field", ["command_pattern", "exclude_pattern"])
def test_invalid_regex(tmp_path, field):
    result = executed([bash("uip run")], tmp_path, **{"command_pattern": "uip", field: "[invalid"})
    assert result.score == 0.0 and result.error.startswith("Invalid regex")


def test_no_filters_count_every_call(tmp_path):
    calls = [call("Read", file_path="a.py"), bash("ls"), call("Write", file_path="b.py")]
    assert executed(calls, tmp_path, min_count=3).score == 1.0


def test_exclude_pattern(tmp_path):
    pattern = r"uip\s+maestro\s+flow\s+process\s+get"
    help_call = bash("uip maestro flow process get --help 2>&1")
    real_call = bash("uip maestro flow process get --process-key pk1")
    assert executed([help_call, real_call], tmp_path, command_pattern=pattern, exclude_pattern="--help").score == 1.0
    assert executed([help_call, help_call], tmp_path, command_pattern=pattern, exclude_pattern="--help").score == 0.0
    assert executed([bash("ls -la")], tmp_path, command_pattern="curl", exclude_pattern="--help").score == 0.0


def test_other_tools_match_their_json_parameters(tmp_path):
    calls = [call("Write", file_path="output.json", content='{"key": "value"}'),
             call("Write", file_path="ignore.json", content='{"key": "value"}')]
    assert executed(calls[:1], tmp_path, tool_name="Write", command_pattern=r"output\.json").score == 1.0
    result = executed(calls, tmp_path, tool_name="Write", command_pattern=r"\.json", exclude_pattern=r"ignore\.json",
                      min_count=2)
    assert result.score == 0.5


def test_an_argv_list_command_falls_back_to_json(tmp_path):
    calls = [bash(["bash", "-lc", "ls"]), bash("echo hi")]
    result = executed(calls, tmp_path, tool_name="Bash")
    assert (result.score, result.error) == (1.0, None) and "2/1" in result.details
    sibling = executed([bash(["bash", "-lc", "ls"]), bash("uip run foo")], tmp_path, tool_name="Bash",
                       command_pattern=r"uip\s+run")
    assert (sibling.score, sibling.error) == (1.0, None)


def test_calls_closed_by_a_crash_count(tmp_path):
    calls = [bash(f"curl http://{host}", "unknown") for host in "abc"] + [bash(f"curl http://{host}") for host in "de"]
    result = executed(calls, tmp_path, tool_name="Bash", command_pattern="curl", min_count=4)
    assert result.score == 1.0 and "5/4" in result.details


def test_negative_guard_and_bounded_ranges(tmp_path):
    guard = {"tool_name": "Bash", "command_pattern": r"uip\s+or\s+users\s+list", "min_count": 0, "max_count": 0}
    passed = executed([bash("uip admin users list --search alice")], tmp_path, **guard)
    assert passed.score == 1.0 and "allowed range 0..0" in passed.details
    failed = executed([bash("uip or users list")], tmp_path, **guard)
    assert failed.score == 0.0 and "allowed range 0..0" in failed.details
    bounded = {"command_pattern": "curl", "min_count": 2, "max_count": 4}
    inside = executed([bash("curl x")] * 3, tmp_path, **bounded)
    assert inside.score == 1.0 and "3 matches (allowed range 2..4)" in inside.details
    assert executed([bash("curl x")] * 5, tmp_path, **bounded).score == 0.0
    assert executed([bash("curl x")], tmp_path, **bounded).score == 0.0


def test_range_validation():
    with pytest.raises(ValidationError, match=r"max_count \(2\) must be >= min_count \(5\)"):
        parse_criterion({"type": "command_executed", "description": "d", "min_count": 5, "max_count": 2})
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        parse_criterion({"type": "command_executed", "description": "d", "min_count": -1})


@pytest.mark.parametrize("raw, normalized", [
    ('/bin/bash -lc "uip is resources run list slack \'curated_channels?types=public\' --output json"',
     "uip is resources run list slack curated_channels?types=public --output json"),
    ('/bin/bash -lc "uip is resources run list \\"slack\\" \\"curated_channels\\""',
     "uip is resources run list slack curated_channels"),
    ("uip is resources run list slack 'curated_channels'", "uip is resources run list slack curated_channels"),
    ("uip flow validate X.flow --output json && uip flow format X.flow",
     "uip flow validate X.flow --output json && uip flow format X.flow"),
    ("bash -lc uip is resources run list slack --output json", "uip is resources run list slack --output json"),
    ("bash -c echo hi there", "echo hi there"),
    ("sh --norc -c 'echo a'", "echo a"),
    ("bash script.sh -c x", "bash script.sh -c x"),  # scanning stops at the first non-flag token
    ("echo 'unterminated", None),
    ("cat > f.txt <<EOF\nhello\nEOF", None),
])
def test_normalize_shell(raw, normalized):
    assert normalize_shell(raw) == normalized


def test_a_double_quote_only_pattern_now_matches_single_quoted_calls(tmp_path):
    pattern = r'uip\s+is\s+resources\s+run\s+list\s+\\?"?uipath-salesforce-slack\\?"?\s+\\?"?curated_channels'
    calls = [bash('/bin/bash -lc "uip is resources run list uipath-salesforce-slack '
                  "'curated_channels?types=public_channel' --output json\""),
             bash('/bin/bash -lc "uip is resources run list uipath-salesforce-slack '
                  "'curated_channels?types=public_channel' --query 'nextPage=abc' --output json\"")]
    assert executed(calls, tmp_path, tool_name="Bash", command_pattern=pattern, min_count=2).score == 1.0


def test_normalization_also_feeds_exclusions_and_is_skipped_for_huge_commands(tmp_path):
    quoted = bash("""bash -lc "curl 'https://example.com' --help" """)
    assert executed([quoted], tmp_path, command_pattern="curl", exclude_pattern="curl https://example.com --help").score == 0.0
    huge = bash("echo 'x' " + "y" * 20001)
    assert executed([huge], tmp_path, command_pattern="echo x").score == 0.0
    late = bash("echo " + "z" * 2100 + " needle")
    assert executed([late], tmp_path, command_pattern="needle").score == 0.0  # searched text is capped at 2000 chars


def test_live_verdict_polarities():
    def model(**fields):
        return parse_criterion({"type": "command_executed", "description": "d", "command_pattern": "curl", **fields})
    positive, guard, bounded = model(), model(min_count=0, max_count=0), model(min_count=1, max_count=2)
    assert (positive.live_verdict([]), positive.live_verdict([bash("curl a")])) == (None, True)
    assert (guard.live_verdict([bash("ls")]), guard.live_verdict([bash("curl a")])) == (None, False)
    assert (bounded.live_verdict([bash("curl a")]), bounded.live_verdict([bash("curl a")] * 3)) == (None, False)
    assert model(min_count=0).live_verdict([bash("curl a")]) is None
    assert model(command_pattern="[bad").live_verdict([bash("curl a")]) is None


@pytest.mark.parametrize("actual, score", [(4, 1.0), (8, 1.0), (16, 0.5), (10, 0.8)])
def test_commands_efficiency(tmp_path, actual, score):
    result = grade({"type": "commands_efficiency", "expected_commands": 8}, context(tmp_path, [bash("ls")] * actual))
    assert result.score == pytest.approx(score)
    assert result.details == f"{actual} tool calls for a budget of 8 (score: {score:.2f})"


def test_commands_efficiency_edges(tmp_path):
    criterion = {"type": "commands_efficiency", "expected_commands": 3}
    idle = grade(criterion, context(tmp_path, []))
    assert (idle.score, idle.details) == (0.0, "0 tool calls recorded (the agent may not have run)")
    assert "turn_records" in grade(criterion, context(tmp_path, None)).error
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        parse_criterion({**criterion, "description": "d", "expected_commands": 0})
