"""How a partial config (an experiment layer, a ``-D`` patch) merges onto a model's values.

Each field declares its strategy, the merge derives the rest: lists *replace* unless marked
:data:`APPEND` (``template_sources``, ``env_passthrough_extra``); nested models and
free-form dicts merge *deep*, key by key; everything else replaces. Walking a patch also
checks its keys, so a typo is an error with a "did you mean" before any value is built.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Mapping, Sequence
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

Strategy = Literal["replace", "append", "deep"]


class _Append:
    """Marker in a field's ``Annotated`` metadata: layers append to this list."""

    def __repr__(self) -> str:
        return "APPEND"


APPEND = _Append()


class MergeError(ValueError):
    """An unknown key in a patch (with the closest known field as ``suggestion``)."""

    def __init__(self, message: str, *, suggestion: str | None = None):
        super().__init__(message)
        self.suggestion = suggestion


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (``X | None``, ``list[X]`` ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in models_in(arg)]


def _alternatives(annotation: Any) -> tuple[Any, ...]:
    """The members of ``X | Y`` (just ``(X,)`` for a plain annotation)."""
    return get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)


def strategy_of(field: FieldInfo) -> Strategy:
    if any(meta is APPEND for meta in field.metadata):
        return "append"
    members = _alternatives(field.annotation)
    if any(get_origin(member) is list for member in members):
        return "replace"
    if models_in(field.annotation) or any(member is dict or get_origin(member) is dict for member in members):
        return "deep"
    return "replace"


def unknown_key(key: str, models: Sequence[type[BaseModel]], context: str) -> MergeError:
    known = sorted({name for model in models for name in model.model_fields})
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return MergeError(f"unknown field {key!r} under {context!r}{hint}", suggestion=close[0] if close else None)


def merge_layers(
    models: Sequence[type[BaseModel]], layers: Sequence[Mapping[str, Any]], *, context: str
) -> dict[str, Any]:
    """Fold ``layers`` (lowest first) into one dict for ``models``' constructor, honouring each
    field's strategy; raises :class:`MergeError` on a key none of ``models`` declares."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for group in _exclusive_groups(models):
            # Setting one member of a group (system_prompt / system_prompt_file) clears the others.
            if any(layer.get(name) is not None for name in group):
                for name in group:
                    if layer.get(name) is None:
                        merged.pop(name, None)
        for key, value in layer.items():
            field = _field(models, key, context)
            merged[key] = _merge_value(field, merged.get(key), value, f"{context}.{key}")
    return merged


def _field(models: Sequence[type[BaseModel]], key: str, context: str) -> FieldInfo:
    for model in models:
        if key in model.model_fields:
            return model.model_fields[key]
    raise unknown_key(key, models, context)


def _exclusive_groups(models: Sequence[type[BaseModel]]) -> list[tuple[str, ...]]:
    return [group for model in models for group in getattr(model, "merge_exclusive_groups", ())]


def _merge_value(field: FieldInfo, base: Any, value: Any, context: str) -> Any:
    strategy = strategy_of(field)
    if strategy == "append":
        if value is None:
            return base
        if not isinstance(value, list):
            raise MergeError(f"expected a list for append-strategy field {context!r}, got {type(value).__name__}")
        return [*(base if isinstance(base, list) else []), *value]
    if strategy == "deep" and isinstance(value, dict):
        children = models_in(field.annotation)
        if children:
            return merge_layers(children, [base if isinstance(base, dict) else {}, value], context=context)
        if isinstance(base, dict):
            return _deep_dict(base, value)
    return copy.deepcopy(value)


def _deep_dict(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in patch.items():
        old = merged.get(key)
        merged[key] = _deep_dict(old, value) if isinstance(old, dict) and isinstance(value, dict) else copy.deepcopy(value)
    return merged
