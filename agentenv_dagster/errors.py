"""Errors that say where and what: the file, the step id, the field, then the reason."""

from __future__ import annotations


class SpecError(ValueError):
    """One problem in one task document, located as precisely as it is known."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        step_id: str | None = None,
        field: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.file = file
        self.step_id = step_id
        self.field = field

    def located(self, file: str) -> "SpecError":
        return SpecError(self.message, file=self.file or file, step_id=self.step_id, field=self.field)

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(self.file)
        if self.step_id is not None:
            where.append(f"step '{self.step_id}'")
        if self.field:
            where.append(f"field '{self.field}'")
        return ": ".join([*where, self.message])


class TaskLoadError(ValueError):
    """Every problem found in one task document (a file reports all of them at once)."""

    def __init__(self, errors: list[SpecError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
