"""The step registry: built-in types register with ``@step``; custom ones come from config."""

from __future__ import annotations

import importlib
from typing import Callable, Iterable, TypeVar

from ..config import ConfigError
from .base import TaskStep

S = TypeVar("S", bound=type[TaskStep])


class StepRegistryError(ConfigError):
    """A custom step impl that cannot be used (agent-env raises ConfigError here)."""


class StepRegistry:
    def __init__(self, types: dict[str, type[TaskStep]] | None = None):
        self._types: dict[str, type[TaskStep]] = dict(types or {})

    def register(self, cls: type[TaskStep]) -> type[TaskStep]:
        name = cls.type_name
        if name == TaskStep.type_name:
            raise StepRegistryError(f"{cls.__module__}:{cls.__name__} must declare its own type_name")
        existing = self._types.get(name)
        if existing is not None and existing is not cls:
            raise StepRegistryError(
                f"{cls.__module__}:{cls.__name__} declares type '{name}', which collides with "
                f"{existing.__module__}:{existing.__name__}"
            )
        self._types[name] = cls
        return cls

    def get(self, type_name: str) -> type[TaskStep] | None:
        return self._types.get(type_name)

    def names(self) -> list[str]:
        return sorted(self._types)

    def with_impls(self, impls: Iterable[str]) -> "StepRegistry":
        """A copy extended with ``module:Class`` pointers (``[task_steps] impls``)."""
        extended = StepRegistry(self._types)
        for pointer in impls:
            extended.register(_import_step_class(pointer))
        return extended


def _import_step_class(pointer: str) -> type[TaskStep]:
    module_name, _, class_name = pointer.partition(":")
    if not module_name or not class_name:
        raise StepRegistryError(f"[task_steps] impls entry {pointer!r} is not 'module.path:ClassName'")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise StepRegistryError(f"[task_steps] impls entry {pointer!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, TaskStep)):
        raise StepRegistryError(f"[task_steps] impls entry {pointer!r} is not a TaskStep subclass")
    return cls


BUILTIN_STEPS = StepRegistry()


def step(type_name: str) -> Callable[[S], S]:
    """Register a built-in step type under ``type_name``."""

    def decorate(cls: S) -> S:
        cls.type_name = type_name
        BUILTIN_STEPS.register(cls)
        return cls

    return decorate
