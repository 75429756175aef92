"""json_check: syntax, JSON Schema (jsonschema) and JMESPath assertions with every operator."""

from __future__ import annotations

import json
import re

import pytest
from criteria_helpers import context, grade, write
from pydantic import ValidationError

from agentenv_dagster.criteria import parse_criterion

DOC = {
    "status": "success", "count": 3, "ratio": 0.5, "flag": True, "nothing": None,
    "tags": ["alpha-release", "beta-release"], "meta": {"version": "1.2.3", "owner": "team-data"},
    "items": [{"name": "a", "active": True}, {"name": "b", "active": False}],
}
SCHEMA = {"type": "object", "required": ["status", "count"], "properties": {"count": {"type": "integer"}}}


@pytest.fixture
def sandbox(tmp_path):
    return write(tmp_path, {
        "out.json": json.dumps(DOC), "broken.json": "{not json", "schema.json": json.dumps(SCHEMA),
        "strict.json": json.dumps({**SCHEMA, "required": ["missing_key"]}), "schema_text.json": "nope",
        "malformed.json": json.dumps({"type": 12}),
    })


def check(sandbox, **fields):
    return grade({"type": "json_check", "path": "out.json", **fields}, context(sandbox, []))


def one(sandbox, expression, operator, expected=None, **extra):
    assertion = {"expression": expression, "operator": operator, **extra}
    if operator != "exists":
        assertion["expected"] = expected
    return check(sandbox, assertions=[assertion]).score


def test_assertion_model_rules():
    assertions = [{"expression": "a", "expected": 1}, {"expression": "b", "operator": "exists"},
                  {"expression": "c", "expected": None}, {"expression": "d", "operator": "not_equals", "expected": None}]
    model = parse_criterion({"type": "json_check", "description": "d", "path": "a.json", "assertions": assertions})
    assert [a.operator for a in model.assertions] == ["equals", "exists", "equals", "not_equals"]
    for operator in ("equals", "gt", "regex"):
        with pytest.raises(ValidationError, match=f"operator '{operator}' requires 'expected'"):
            parse_criterion({"type": "json_check", "description": "d", "path": "a.json",
                             "assertions": [{"expression": "a", "operator": operator}]})


def test_short_contains_literals_are_rejected_as_brittle():
    with pytest.raises(ValidationError, match=re.escape("'contains' with expected ' ok  ' is brittle")):
        parse_criterion({"type": "json_check", "description": "d", "path": "a.json",
                         "assertions": [{"expression": "a", "operator": "contains", "expected": " ok  "}]})
    parse_criterion({"type": "json_check", "description": "d", "path": "a.json",
                     "assertions": [{"expression": "a", "operator": "contains", "expected": "REFramework"},
                                    {"expression": "a", "operator": "contains", "expected": 7}]})


def test_file_level_outcomes(sandbox):
    missing = check(sandbox, path="nope.json")
    assert (missing.score, missing.error) == (0.0, "File 'nope.json' does not exist")
    broken = check(sandbox, path="broken.json")
    assert broken.score == 0.0 and broken.error.startswith("Invalid JSON in 'broken.json': ")
    valid = check(sandbox)
    assert (valid.score, valid.details) == (1.0, "'out.json' is valid JSON")


def test_half_the_assertions_passing_scores_half(sandbox):
    result = check(sandbox, assertions=[{"expression": "status", "expected": "success"}, {"expression": "count", "expected": 4}])
    assert result.score == 0.5
    assert result.details == "File 'out.json'; Assertions: 1/2 passed ('count' equals: expected 4, got 3); Score: 0.50"


@pytest.mark.parametrize("expression, operator, expected, passes", [
    ("status", "equals", "success", True), ("status", "equals", "failure", False),
    ("nothing", "equals", None, True), ("missing", "equals", None, True),
    ("status", "not_equals", "failure", True), ("status", "not_equals", "success", False),
    ("meta.owner", "contains", "team-data", True), ("meta.owner", "contains", "team-sales", False),
    ("tags", "contains", "alpha-release", True), ("tags", "contains", "gamma-release", False),
    ("count", "contains", 3, False),  # not a container
    ("count", "gt", 2, True), ("count", "gt", 3, False), ("count", "gte", 3, True), ("count", "gte", 4, False),
    ("ratio", "lt", 1, True), ("ratio", "lt", 0.5, False), ("ratio", "lte", 0.5, True), ("ratio", "lte", 0.4, False),
    ("status", "gt", 1, False),  # numeric operator on a string
    ("length(items)", "gte", 2, True),
    ("status", "type", "string", True), ("count", "type", "number", True), ("ratio", "type", "number", True),
    ("flag", "type", "number", False), ("flag", "type", "boolean", True), ("tags", "type", "array", True),
    ("meta", "type", "object", True), ("nothing", "type", "null", True), ("count", "type", "string", False),
    ("count", "type", "integer", False), ("nothing", "type", "integer", False),  # unknown type names never match
    ("meta.version", "regex", r"^\d+\.\d+\.\d+$", True), ("status", "regex", "^fail", False),
    ("count", "regex", r"\d", False),  # regex on a non-string
    ("items[?active].name", "exists", None, True), ("missing", "exists", None, False),
    ("nothing", "exists", None, False),  # JSON null counts as missing
    ("items[?", "equals", 1, False),  # invalid JMESPath expression
])
def test_operators(sandbox, expression, operator, expected, passes):
    assert one(sandbox, expression, operator, expected) == (1.0 if passes else 0.0)


def test_failed_assertion_details_name_the_error(sandbox):
    result = check(sandbox, assertions=[{"expression": "items[?", "expected": 1}])
    assert result.details.startswith("File 'out.json'; Assertions: 0/1 passed ('items[?': error: ")


def test_schema_outcomes(sandbox):
    valid = check(sandbox, json_schema="schema.json")
    assert (valid.score, valid.details) == (1.0, "File 'out.json'; Schema: valid; Score: 1.00")
    invalid = check(sandbox, json_schema="strict.json")
    assert invalid.score == 0.0 and "Schema: invalid: 'missing_key' is a required property" in invalid.details
    missing = check(sandbox, json_schema="none.json")
    assert missing.score == 0.0 and "Schema file 'none.json' not found" in missing.details
    not_json = check(sandbox, json_schema="schema_text.json")
    assert not_json.score == 0.0 and "Invalid JSON in schema file 'schema_text.json'" in not_json.details
    malformed = check(sandbox, json_schema="malformed.json")
    assert malformed.score == 0.0
    assert "Schema: malformed schema: 12 is not valid under any of the given schemas" in malformed.details


def test_schema_and_assertions_average(sandbox):
    result = check(sandbox, json_schema="schema.json",
                   assertions=[{"expression": "status", "expected": "success"}, {"expression": "count", "expected": 0}])
    assert result.score == 0.75


def test_a_failing_schema_skips_the_assertions(sandbox):
    result = check(sandbox, json_schema="strict.json", assertions=[{"expression": "status", "expected": "success"}])
    assert result.score == 0.0
    assert result.details.endswith("Assertions: skipped (schema failed); Score: 0.00")


def test_schema_path_is_sandbox_relative():
    with pytest.raises(ValidationError, match="is absolute"):
        parse_criterion({"type": "json_check", "description": "d", "path": "a.json", "json_schema": "/etc/schema.json"})
