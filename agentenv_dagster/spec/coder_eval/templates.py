"""Template sources: what is in the sandbox before the agent starts.

Sources apply in order (last wins): a git ``repo`` (at most one, and first — a clone needs an
empty directory), ``template_dir`` copies (path relative to the task YAML, ``$VAR`` expanded at
load) and inline ``starter_files``. Everything they write stays inside the sandbox.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ValidationInfo, field_validator

from ...errors import SpecError
from .base import Strict, inside_sandbox, note, validate_each, validate_kind

MANY_TEMPLATE_SOURCES = 10


class TemplateDirSource(Strict):
    type: Literal["template_dir"] = "template_dir"
    path: str
    mount_point: str = "."

    @field_validator("mount_point")
    @classmethod
    def _inside_sandbox(cls, value: str) -> str:
        return inside_sandbox("mount_point", value)


class StarterFile(Strict):
    path: str
    content: str

    @field_validator("path")
    @classmethod
    def _inside_sandbox(cls, value: str) -> str:
        return inside_sandbox("path", value)


class StarterFilesSource(Strict):
    type: Literal["starter_files"] = "starter_files"
    files: list[StarterFile]


class RepoSource(Strict):
    type: Literal["repo"] = "repo"
    url: str
    commit: str | None = None


TemplateSource = TemplateDirSource | StarterFilesSource | RepoSource
TEMPLATE_KINDS: dict[str, type[Strict]] = {
    "template_dir": TemplateDirSource,
    "starter_files": StarterFilesSource,
    "repo": RepoSource,
}


def _unknown_kind(kind: Any) -> str:
    return f"unknown template source type {kind!r} (expected one of: {', '.join(TEMPLATE_KINDS)})"


def parse_template_sources(value: Any) -> Any:
    """Each source validated as the model its ``type`` names; every bad source reported."""
    if not isinstance(value, list):
        return value
    return validate_each(value, lambda _, item: validate_kind(item, TEMPLATE_KINDS, unknown=_unknown_kind))


def check_template_sources(sources: list[TemplateSource], info: ValidationInfo | None) -> None:
    """At most one repo source, and first; many sources are probably a mistake (warned)."""
    repos = [index for index, source in enumerate(sources) if isinstance(source, RepoSource)]
    if len(repos) > 1:
        raise SpecError("Only one RepoSource is allowed in template_sources.", field=f"template_sources.{repos[1]}")
    if repos and repos[0] != 0:
        raise SpecError(
            "RepoSource must be the first element in template_sources (git clone requires an empty directory).",
            field=f"template_sources.{repos[0]}",
        )
    if len(sources) > MANY_TEMPLATE_SOURCES:
        note(info, f"Many template sources ({len(sources)}) - this may be a misconfiguration", field="template_sources")


# The annotation of a ``template_sources:`` list (each item dispatched on its type).
TemplateSources = Annotated[list[TemplateSource] | None, BeforeValidator(parse_template_sources)]
