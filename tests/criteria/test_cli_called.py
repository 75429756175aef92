"""cli_called: argv parsing rules, facets, flag predicates, negative guards, log refusals, validation."""

from __future__ import annotations

import json
import re

import pytest
from criteria_helpers import context, grade, write
from pydantic import ValidationError

from agentenv_dagster.criteria import CheckerMisuseError, parse_criterion
from agentenv_dagster.criteria.cli import split_flags

LOG = "cli_mocks/calls.jsonl"


def log_of(sandbox, *argvs, tool="uip", **extra):
    lines = [json.dumps({"ts": 1.0, "tool": tool, "argv": argv, "exit": 0, **extra}) for argv in argvs]
    write(sandbox, {LOG: "\n".join(lines) + "\n"})
    return sandbox


def called(sandbox, **fields):
    return grade({"type": "cli_called", **fields}, context(sandbox, []))


def model(**fields):
    return parse_criterion({"type": "cli_called", "description": "d", **fields})


def split(argv, value_flags=(), known=(), ignore=()):
    return split_flags(argv, value_flags=frozenset(value_flags), known=frozenset(known) | frozenset(value_flags),
                       ignore=frozenset(ignore))


@pytest.mark.parametrize("argv, kwargs, expected", [
    (["ixp", "fields", "delete", "--yes", "proj-1"], {}, (["ixp", "fields", "delete", "proj-1"], {"yes": [""]})),
    (["list", "--folder", "Finance", "p"], {"value_flags": ["folder"]}, (["list", "p"], {"folder": ["Finance"]})),
    (["list", "--folder", "Finance", "p"], {}, (["list", "Finance", "p"], {"folder": [""]})),
    (["get", "--offset=-1", "-n=3"], {}, (["get"], {"offset": ["-1"], "n": ["3"]})),
    (["get", "--limit", "-1"], {"value_flags": ["limit"]}, (["get"], {"limit": ["-1"]})),
    (["seek", "-1", "-"], {}, (["seek", "-1", "-"], {})),
    (["rm", "-rf", "x"], {}, (["rm", "x"], {"r": [""], "f": [""]})),
    (["x", "-fvalue"], {"value_flags": ["f"]}, (["x"], {"f": ["value"]})),
    (["x", "-rf"], {"known": ["rf"]}, (["x"], {"rf": [""]})),
    (["x", "--", "--not-a-flag", "-y"], {}, (["x", "--not-a-flag", "-y"], {})),
    (["x", "--output", "json", "y"], {"value_flags": ["output"], "ignore": ["output"]}, (["x", "y"], {})),
    (["x", "--verbose", "y"], {"ignore": ["verbose"], "known": ["verbose"]}, (["x", "y"], {})),
    (["x", "--fields", "a", "--fields", "b"], {"value_flags": ["fields"]}, (["x"], {"fields": ["a", "b"]})),
    (["x", "--last"], {"value_flags": ["last"]}, (["x"], {"last": [""]})),
])
def test_split_flags(argv, kwargs, expected):
    assert split(argv, **kwargs) == expected


def test_verb_is_a_token_prefix_and_positional_follows_it():
    confirm = model(verb="labellings confirm")
    assert confirm.argv_matches(["labellings", "confirm", "x"])
    assert not confirm.argv_matches(["labellings", "unconfirm", "x"])
    assert not confirm.argv_matches(["labellings"])
    target = model(verb="ixp projects get", positional=["proj-1"])
    assert target.argv_matches(["ixp", "projects", "get", "proj-1", "extra"])
    assert not target.argv_matches(["ixp", "projects", "get", "proj-2"])
    assert model(verb_any_of=["a b", "c"], positional=["p"]).argv_matches(["c", "p"])


@pytest.mark.parametrize("predicate, argv, matches", [
    ("gemini_2_5_pro", ["--model", "gemini_2_5_pro"], True),
    ({"equals": "gemini"}, ["--model", "gpt"], False),
    ({"contains": "mini"}, ["--model", "gemini"], True),
    ({"matches_regex": "^GEM", "flags": 2}, ["--model", "gemini"], True),
    ({"matches_regex": "^GEM"}, ["--model", "gemini"], False),
    ({"any_of": ["a", "gemini"]}, ["--model", "gemini"], True),
    ({"any_of": ["a", "b"]}, ["--model", "gemini"], False),
    ({"present": True}, ["--model"], True),
    ({"present": True}, [], False),
    ({"absent": True}, [], True),
    ({"absent": True}, ["--model=x"], False),
    ({"equals": "b"}, ["--model", "a", "--model", "b"], True),  # any repeated value may satisfy it
    ({"equals": "x"}, [], False),
])
def test_flag_predicates(predicate, argv, matches):
    assert model(verb="run", flags={"model": predicate}).argv_matches(["run", *argv]) is matches


def test_aliases_gather_values_and_presence_never_takes_a_value():
    yes = model(verb="delete", positional=["proj-1"], flags={"yes": {"present": True, "aliases": ["y"]}})
    assert yes.argv_matches(["delete", "-y", "proj-1"])
    assert yes.argv_matches(["delete", "--yes", "proj-1"])
    assert yes.argv_matches(["delete", "-yf", "proj-1"])  # bundled switches are split
    fields = model(verb="get", flags={"fields": {"equals": "f-002", "aliases": ["f"]}})
    assert fields.argv_matches(["get", "-f", "f-002"])
    assert not model(verb="get", flags={"yes": {"absent": True, "aliases": ["y"]}}).argv_matches(["get", "-y"])


def test_positive_match_and_details(tmp_path):
    log_of(tmp_path, ["ixp", "projects", "configure-model", "my-ixp", "--model", "gemini_2_5_pro", "--output", "json"])
    result = called(tmp_path, verb="ixp projects configure-model", positional=["my-ixp"],
                    flags={"model": "gemini_2_5_pro"}, tool="uip")
    assert (result.score, result.error) == (1.0, None)
    assert result.details == ("1 invocation(s) matched (tool='uip', verb='ixp projects configure-model', "
                              "positional=['my-ixp'], flags=['model']); satisfies min_count=1")


def test_too_few_matches_shows_what_was_recorded(tmp_path):
    log_of(tmp_path, *[["ixp", "projects", "get", f"p{i}"] for i in range(4)])
    result = called(tmp_path, verb="ixp projects list")
    assert result.score == 0.0
    assert result.details == (
        f"0 invocation(s) matched (verb='ixp projects list'); needs min_count=1. 4 invocation(s) recorded in '{LOG}'. "
        "Recorded: ixp projects get p0; ixp projects get p1; ixp projects get p2 (+1 more)")


def test_tool_facet_matches_the_record(tmp_path):
    log_of(tmp_path, ["ixp", "dummy1"], tool="other")
    assert called(tmp_path, verb="ixp dummy1", tool="uip").score == 0.0
    assert called(tmp_path, verb="ixp dummy1").score == 1.0


def test_negative_guard_fails_on_the_forbidden_call(tmp_path):
    log_of(tmp_path, ["ixp", "fields", "delete", "--yes", "proj-1"])
    guard = called(tmp_path, verb="ixp fields delete", positional=["proj-1"], min_count=0, max_count=0)
    assert guard.score == 0.0
    assert guard.details == ("1 invocation(s) matched (verb='ixp fields delete', positional=['proj-1']) "
                             "but min_count=0, max_count=0 forbids it")
    assert called(tmp_path, verb="ixp fields delete", positional=["proj-2"], min_count=0, max_count=0).score == 1.0


def test_binary_range(tmp_path):
    log_of(tmp_path, ["a"], ["a"], ["a"])
    assert called(tmp_path, verb="a", min_count=2, max_count=3).score == 1.0
    assert called(tmp_path, verb="a", min_count=1, max_count=2).score == 0.0
    assert called(tmp_path, verb="a", min_count=4).score == 0.0


@pytest.mark.parametrize("content, error", [
    (None, f"Invocation log '{LOG}' does not exist"),
    ('{"argv": ["a"]}\nnot json\n', "has 1 unusable record(s)"),
    ('{"argv": ["a"]}\n[1, 2]\n{"argv": "a b"}\n{"argv": ["a", 1]}\n{"tool": "uip"}\n', "has 4 unusable record(s)"),
    ('{"argv": ["a"], "sidecar_error": "ImportError: no matcher"}\n',
     "Recorder could not import its matcher on 1 invocation(s)"),
])
def test_logs_that_cannot_be_trusted_fail(tmp_path, content, error):
    if content is not None:
        write(tmp_path, {LOG: content})
    result = called(tmp_path, verb="a", min_count=0, max_count=0)
    assert result.score == 0.0 and error in result.error


def test_a_write_sentinel_fails_the_criterion(tmp_path):
    log_of(tmp_path, ["a"])
    write(tmp_path, {LOG + ".error": "disk full: record 7\ndisk full: record 8\n"})
    result = called(tmp_path, verb="a")
    assert result.score == 0.0 and "(2 dropped record(s))" in result.error
    assert result.error.endswith("First: disk full: record 7")


def test_a_rule_error_is_the_tasks_fault(tmp_path):
    log_of(tmp_path, ["a"], rule_error="re.error: bad pattern")
    with pytest.raises(CheckerMisuseError, match="could not evaluate its response rules on 1 invocation"):
        called(tmp_path, verb="a")


def test_custom_log_path_and_blank_lines(tmp_path):
    write(tmp_path, {"mocks/calls.jsonl": '\n{"argv": ["ixp", "dummy2"]}\n\n'})
    assert called(tmp_path, log="mocks/calls.jsonl", verb="ixp dummy2").score == 1.0


@pytest.mark.parametrize("fields, message", [
    ({"verb": "a", "min_count": 0}, "min_count 0 without max_count can never fail"),
    ({"verb": "a", "min_count": 3, "max_count": 1}, "max_count (1) must be >= min_count (3)"),
    ({"verb": "   "}, "a verb must not be blank"),
    ({}, "needs at least one of verb, verb_any_of, positional, flags or tool"),
    ({"verb": "a", "verb_any_of": ["b"]}, "'verb' and 'verb_any_of' are mutually exclusive"),
    ({"verb": "a --force"}, "verb 'a --force' contains a flag"),
    ({"verb": "a", "positional": []}, "'positional' must not be empty"),
    ({"verb_any_of": ["a b", "a"]}, "verb_any_of entries 'a b' and 'a' overlap"),
    ({"verb_any_of": ["a", "a"]}, "overlap"),
    ({"verb": "a", "flags": {"yes": {"present": True, "aliases": ["yes"]}}}, "flag 'yes' lists itself as an alias"),
    ({"verb": "a", "flags": {"yes": {"present": True, "aliases": ["y"]}, "y": {"absent": True}}},
     "flag name 'y' is claimed by both 'yes' and 'y'"),
    ({"verb": "a", "flags": {"output": "json"}}, "flag 'output' has a predicate but is in ignore_flags"),
    ({"verb": "a", "flags": {"m": {"equals": "x", "contains": "y"}}}, "needs exactly one of"),
    ({"verb": "a", "flags": {"m": {}}}, "needs exactly one of"),
    ({"verb": "a", "flags": {"m": {"equals": "x", "flags": 2}}}, "'flags' applies only to 'matches_regex'"),
    ({"verb": "a", "flags": {"m": {"matches_regex": "("}}}, "matches_regex '(' does not compile"),
    ({"verb": "a", "flags": {"m": {"any_of": []}}}, "at least 1 item"),
    ({"verb": "a", "flags": {"m": True}}, "a bare boolean is not a flag predicate"),
])
def test_validation(fields, message):
    with pytest.raises(ValidationError, match=re.escape(message)):
        model(**fields)


def test_corpus_shape_loads_with_defaults():
    loaded = model(verb="ixp dummy1", min_count=1, weight=1.0)
    assert (loaded.log, loaded.value_flags, loaded.ignore_flags, loaded.max_count) == (LOG, ["output"], ["output"], None)
    assert model(tool="uip", flags={"n": 5}).flags["n"].equals == "5"
