"""Errors that say where and what: the file (and line, when known), the step id, the field,
then the reason.

Task files are hostile input, so an error never echoes them without bound: a quoted value is
an :func:`excerpt` of at most ``EXCERPT_CHARS`` characters, a message is cut at
``MAX_MESSAGE_CHARS`` and a file reports at most ``MAX_PROBLEMS`` problems.
"""

from __future__ import annotations

import reprlib
from typing import Any

EXCERPT_CHARS = 200
MAX_MESSAGE_CHARS = 2_000
MAX_PROBLEMS = 100

class _ExcerptRepr(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 4 * self.maxother:  # past Python's digit limit repr() itself fails
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _ExcerptRepr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, EXCERPT_CHARS, EXCERPT_CHARS
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 20


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, built without ever rendering the whole
    value (a 20 MB string or a deeply shared structure costs no more than its excerpt)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """A piece of input text quoted as it is (no repr quoting), cut to ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _capped(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    return f"{message[:MAX_MESSAGE_CHARS]}... [{len(message) - MAX_MESSAGE_CHARS} more characters]"


class SpecError(ValueError):
    """One problem in one task document, located as precisely as it is known."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        step_id: str | None = None,
        field: str | None = None,
        line: int | None = None,
    ):
        message = _capped(message)
        super().__init__(message)
        self.message = message
        self.file = file
        self.step_id = step_id
        self.field = _capped(field) if field else field
        self.line = line  # 1-based, when the document's text locates the problem

    def located(self, file: str) -> "SpecError":
        return SpecError(self.message, file=self.file or file, step_id=self.step_id, field=self.field, line=self.line)

    def to_dict(self) -> dict[str, Any]:
        """The problem as ``validate --format json`` lists it."""
        step = clip(str(self.step_id)) if self.step_id is not None else None
        return {"file": self.file, "line": self.line, "step": step, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(f"{self.file}:{self.line}" if self.line else self.file)
        if self.step_id is not None:
            where.append(f"step '{clip(str(self.step_id))}'")
        if self.field:
            where.append(f"field '{self.field}'")
        return ": ".join([*where, self.message])


class TaskLoadError(ValueError):
    """Every problem found in one task document (a file reports all of them at once, up to
    ``MAX_PROBLEMS``; the rest are counted in a last line)."""

    def __init__(self, errors: list[SpecError]):
        if len(errors) > MAX_PROBLEMS:
            first = errors[0]
            errors = [*errors[:MAX_PROBLEMS], SpecError(
                f"... and {len(errors) - MAX_PROBLEMS} more problems", file=first.file)]
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
