"""``json_check``: a sandbox JSON file's syntax, JSON Schema conformance and JMESPath assertions."""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Literal

import jmespath
import jsonschema
from pydantic import BaseModel, ConfigDict, model_validator

from . import paths
from .base import CriterionContext, CriterionResult
from .files import FileCriterion, mean_of_categories
from .paths import SandboxPath
from .registry import criterion

Operator = Literal["equals", "not_equals", "contains", "gt", "gte", "lt", "lte", "type", "regex", "exists"]

# JSON type names; bool is checked apart because Python counts it as an int.
JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str, "number": (int, float), "boolean": bool, "array": list, "object": dict, "null": type(None),
}

# A short literal under ``contains`` matches by accident far too easily (e.g. "ok" in "token").
MIN_CONTAINS_LITERAL = 8


def _is_json_type(actual: Any, name: Any) -> bool:
    if name not in JSON_TYPES:
        return False
    if isinstance(actual, bool):
        return name == "boolean"
    return isinstance(actual, JSON_TYPES[name])


# Each operator raises on a type mismatch; the caller counts that as a failed assertion.
OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "equals": lambda actual, expected: actual == expected,
    "not_equals": lambda actual, expected: actual != expected,
    "contains": lambda actual, expected: expected in actual,
    "gt": lambda actual, expected: actual > expected,
    "gte": lambda actual, expected: actual >= expected,
    "lt": lambda actual, expected: actual < expected,
    "lte": lambda actual, expected: actual <= expected,
    "type": _is_json_type,
    "regex": lambda actual, expected: re.search(expected, actual) is not None,
    "exists": lambda actual, _: actual is not None,
}


class Assertion(BaseModel):
    """``jmespath.search(expression, data)`` compared to ``expected`` by ``operator``."""

    model_config = ConfigDict(extra="forbid")

    # a JMESPath expression into the document
    expression: str
    # how the value is compared
    operator: Operator = "equals"
    # the value compared with (write `null` explicitly)
    expected: Any = None

    @model_validator(mode="after")
    def _expected_is_meant(self) -> Assertion:
        """``expected: null`` must be written out: a forgotten value must not compare to None."""
        if self.operator != "exists" and "expected" not in self.model_fields_set:
            raise ValueError(f"operator '{self.operator}' requires 'expected' (null must be written explicitly)")
        short = isinstance(self.expected, str) and len(self.expected.strip()) < MIN_CONTAINS_LITERAL
        if self.operator == "contains" and short:
            raise ValueError(
                f"'contains' with expected {self.expected!r} is brittle: a string literal needs at least "
                f"{MIN_CONTAINS_LITERAL} characters (use 'equals' or 'regex')"
            )
        return self

    def verdict(self, data: Any) -> tuple[bool, str]:
        try:
            actual = jmespath.search(self.expression, data)
            if OPERATORS[self.operator](actual, self.expected):
                return True, ""
            return False, f"'{self.expression}' {self.operator}: expected {self.expected!r}, got {actual!r}"
        except Exception as exc:  # noqa: BLE001 - a bad expression or a type mismatch fails the assertion
            return False, f"'{self.expression}': error: {type(exc).__name__}: {exc}"


@criterion("json_check")
class JsonCheck(FileCriterion):
    """Fractional: valid JSON, then the mean of schema (binary) and assertions (passed/total).

    A failing schema zeroes the criterion even when assertions would pass: values of a document
    of the wrong shape are not worth checking."""

    # a JSON Schema file in the sandbox the document must conform to
    json_schema: SandboxPath | None = None
    # JMESPath assertions on the document
    assertions: list[Assertion] = []

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = self.read(ctx)
        if found is None:
            return self.missing()
        text, name = found
        try:
            data = json.loads(text)
        except ValueError as exc:
            return self.result(0.0, error=f"Invalid JSON in {name}: {exc}")
        if self.json_schema is None and not self.assertions:
            return self.result(1.0, details=f"{name} is valid JSON")
        parts = []
        if self.json_schema is not None:
            schema_score, schema_detail = self._schema(ctx, data)
            if schema_score == 0.0 and self.assertions:
                skipped = f"File {name}; {schema_detail}; Assertions: skipped (schema failed); Score: 0.00"
                return self.result(0.0, details=skipped)
            parts.append((schema_score, schema_detail))
        if self.assertions:
            parts.append(self._assertions(data))
        score, details = mean_of_categories(parts, f"File {name}")
        return self.result(score, details=details)

    def _schema(self, ctx: CriterionContext, data: Any) -> tuple[float, str]:
        assert self.json_schema is not None
        found = paths.resolve_one(ctx.sandbox_dir, self.json_schema)
        if found is None:
            return 0.0, f"Schema file '{self.json_schema}' not found"
        try:
            schema = json.loads(paths.read_text(found))
        except ValueError as exc:
            return 0.0, f"Invalid JSON in schema file '{self.json_schema}': {exc}"
        try:
            jsonschema.validate(instance=data, schema=schema)
        except jsonschema.ValidationError as exc:
            return 0.0, f"Schema: invalid: {exc.message}"
        except jsonschema.SchemaError as exc:
            return 0.0, f"Schema: malformed schema: {exc.message}"
        return 1.0, "Schema: valid"

    def _assertions(self, data: Any) -> tuple[float, str]:
        verdicts = [a.verdict(data) for a in self.assertions]
        passed = sum(1 for ok, _ in verdicts if ok)
        failures = [why for ok, why in verdicts if not ok]
        detail = f"Assertions: {passed}/{len(verdicts)} passed"
        return passed / len(verdicts), detail + (f" ({'; '.join(failures)})" if failures else "")
