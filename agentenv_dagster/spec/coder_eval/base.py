"""Shared machinery of the Coder Eval models: the strict base model, located errors raised
from inside validators, dispatch on a ``type`` key, load warnings and sandbox-path checks.

Errors raised by validators carry a field path *relative to the place pydantic reports them*
(:class:`FieldErrors`, or a :class:`SpecError` with ``field``); :func:`describe_errors` joins
the two, so a problem three models deep still reads ``sandbox.template_sources.1.path``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo

from ...errors import SpecError
from ..loader import _describe

WARNINGS_KEY = "warnings"


class Strict(BaseModel):
    """Every nested block of a task is strict: a typo one level down is an error, and a
    number is finite (``"nan"`` given as text is refused too)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CoderEvalWarning(UserWarning):
    """A load-time warning about a task that still loads (unknown top-level key, ...)."""


class FieldErrors(ValueError):
    """Several problems found by one validator, each with a field relative to that validator."""

    def __init__(self, errors: list[SpecError]):
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


def describe_errors(exc: ValidationError, model: type[BaseModel]) -> list[SpecError]:
    """Every error of ``exc`` (raised validating ``model``) as a SpecError located relative to
    ``model``, in the user's words: never a pydantic dump."""
    found: list[SpecError] = []
    for err in exc.errors():
        loc = [str(part) for part in err.get("loc", ())]
        error = err.get("ctx", {}).get("error")
        if isinstance(error, FieldErrors):
            found.extend(_under(loc, inner) for inner in error.errors)
        elif isinstance(error, SpecError):
            found.append(_under(loc, error))
        else:
            field, message = _describe(err, model)
            found.append(SpecError(message, field=field))
    return found


def _under(loc: list[str], error: SpecError) -> SpecError:
    path = ".".join([*loc, *([error.field] if error.field else [])])
    return SpecError(error.message, field=path or None)


def errors_of(exc: ValueError) -> list[SpecError]:
    """The located problems an exception raised by a validator carries."""
    if isinstance(exc, FieldErrors):
        return exc.errors
    if isinstance(exc, SpecError):
        return [exc]
    return [SpecError(str(exc))]


def validate_each(items: list[Any], validate: Callable[[int, Any], Any]) -> list[Any]:
    """``validate(index, item)`` for every item; every failure raised at once, under its index."""
    parsed: list[Any] = []
    problems: list[SpecError] = []
    for index, item in enumerate(items):
        try:
            parsed.append(validate(index, item))
        except ValueError as exc:
            problems.extend(_under([str(index)], error) for error in errors_of(exc))
    if problems:
        raise FieldErrors(problems)
    return parsed


def validate_model(cls: type[BaseModel], data: Any, *, context: Any = None) -> BaseModel:
    """``cls.model_validate`` whose failure is one :class:`FieldErrors` (fields relative to
    ``data``), so a validator that dispatches to a model can re-raise it located."""
    try:
        return cls.model_validate(data, context=context)
    except ValidationError as exc:
        raise FieldErrors(describe_errors(exc, cls)) from None


def validate_kind(
    value: Any,
    kinds: Mapping[str, type[BaseModel]],
    *,
    unknown: Callable[[Any], str],
    untyped: type[BaseModel] | None = None,
    context: Any = None,
) -> BaseModel:
    """Validate a mapping as the model its ``type`` names (``untyped`` when it has none).

    Dispatching by hand instead of a pydantic tagged union keeps the tag out of error paths
    (``agent.max_turns``, not ``agent.claude-code.max_turns``) and lets "did you mean" look at
    the right model.
    """
    if isinstance(value, BaseModel):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"must be a mapping, got {type(value).__name__}")
    kind = value.get("type")
    if kind is None and untyped is not None:
        return validate_model(untyped, value, context=context)
    if kind is None:
        raise SpecError("required field is missing", field="type")
    cls = kinds.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise SpecError(unknown(kind), field="type")
    return validate_model(cls, value, context=context)


def note(info: ValidationInfo | None, message: str, *, field: str | None = None) -> None:
    """Record a load warning: into the loader's list when validation runs under one (the loader
    returns warnings, it never prints them), as a Python warning otherwise."""
    text = str(SpecError(message, field=field))
    context = info.context if info is not None else None
    if isinstance(context, dict) and isinstance(context.get(WARNINGS_KEY), list):
        context[WARNINGS_KEY].append(text)
    else:
        warnings.warn(text, CoderEvalWarning, stacklevel=3)


def inside_sandbox(name: str, value: str) -> str:
    """A sandbox-relative path that cannot escape the sandbox: relative, no ``..`` segment."""
    if not value:
        raise ValueError(f"{name} must not be empty")
    if value.startswith(("/", "\\")) or (len(value) > 1 and value[1] == ":"):
        raise ValueError(f"{name} must be a relative path, got: {value!r}")
    if ".." in value.replace("\\", "/").split("/"):
        raise ValueError(f"{name} must not contain '..' segments, got: {value!r}")
    return value
