"""The criterion registry: the ``type`` names a ``success_criteria`` entry may use.

Built-in types and a project's own (modules listed in ``[criteria] modules``) register the
same way, with ``@criterion("<type>")``; a task names the type and ``parse_criterion``
validates its fields with that class.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, TypeVar

from ..errors import SpecError, clip, excerpt
from .base import Criterion

C = TypeVar("C", bound=type[Criterion])

CRITERION_TYPES: dict[str, type[Criterion]] = {}


def criterion(type_name: str) -> Callable[[C], C]:
    """Register a criterion model under the ``type`` a task file names it by. Two classes
    claiming one name is a ``ValueError`` at import, so a custom type cannot shadow a built-in.

    ```python
    from agentenv_dagster.criteria import Criterion, CriterionContext, CriterionResult, criterion

    @criterion("max_lines")
    class MaxLines(Criterion):
        blocking = True  # reads the sandbox synchronously: runs on a worker thread

        path: str
        max_lines: int

        async def check(self, ctx: CriterionContext) -> CriterionResult:
            lines = len((ctx.sandbox_dir / self.path).read_text().splitlines())
            return self.result(1.0 if lines <= self.max_lines else 0.0, details=f"{lines} line(s)")
    ```
    """

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
    :class:`SpecError` on field ``type`` for an unknown type, with the closest known one).

    ```python
    parse_criterion({"type": "file_exists", "path": "hello.py", "description": "hello.py exists"})
    ```
    """
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
