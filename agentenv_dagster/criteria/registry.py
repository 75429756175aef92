"""The criterion registry: built-in types register with ``@criterion("<type>")``."""

from __future__ import annotations

import difflib
from typing import Any, Callable, TypeVar

from ..errors import SpecError, clip, excerpt
from .base import Criterion

C = TypeVar("C", bound=type[Criterion])

CRITERION_TYPES: dict[str, type[Criterion]] = {}


def criterion(type_name: str) -> Callable[[C], C]:
    """Register a criterion model under the ``type`` a task file names it by."""

    def decorate(cls: C) -> C:
        existing = CRITERION_TYPES.get(type_name)
        if existing is not None and existing is not cls:
            raise ValueError(
                f"criterion type '{type_name}' of {cls.__module__}.{cls.__name__} collides with "
                f"{existing.__module__}.{existing.__name__}"
            )
        cls.type_name = type_name
        CRITERION_TYPES[type_name] = cls
        return cls

    return decorate


def parse_criterion(data: dict[str, Any]) -> Criterion:
    """Validate one criterion of a task file (pydantic's ``ValidationError`` on bad fields, a
    :class:`SpecError` on field ``type`` for an unknown type)."""
    if not isinstance(data, dict):
        raise ValueError(f"a criterion must be a mapping, got {type(data).__name__}")
    type_name = data.get("type")
    cls = CRITERION_TYPES.get(type_name) if isinstance(type_name, str) else None
    if cls is None:
        shown = clip(type_name) if isinstance(type_name, str) else excerpt(type_name)
        close = difflib.get_close_matches(type_name, CRITERION_TYPES, n=1) if isinstance(type_name, str) else []
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise SpecError(f"unknown criterion type '{shown}' (known: {sorted(CRITERION_TYPES)}){hint}", field="type")
    return cls.model_validate(data)
