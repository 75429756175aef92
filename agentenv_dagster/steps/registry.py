"""The step registry: which step types a task document may name, and the class of each.

Built-in types register with ``@step``; a project adds its own with ``[task_steps] impls``
in ``.agentenv/config.toml``, so each code location chooses its custom types without the
package knowing them.
"""

from __future__ import annotations

import importlib
from typing import Callable, Iterable, TypeVar

from ..config import ConfigError
from .base import TaskStep

S = TypeVar("S", bound=type[TaskStep])


class StepRegistryError(ConfigError):
    """A custom step impl that cannot be used (agent-env raises ConfigError here)."""


class StepRegistry:
    """Step type name -> ``TaskStep`` subclass. Immutable in use: ``with_impls`` returns an
    extended copy, so a project's custom types never leak into another project's registry.

    ```python
    registry = BUILTIN_STEPS.with_impls(["my_steps:ReplyLengthVerifier"])
    registry.get("reply_length_verifier")  # <class 'my_steps.ReplyLengthVerifier'>
    ```
    """

    def __init__(self, types: dict[str, type[TaskStep]] | None = None):
        self._types: dict[str, type[TaskStep]] = dict(types or {})

    def register(self, cls: type[TaskStep]) -> type[TaskStep]:
        """Add ``cls`` under its ``type_name``. A class without a ``type_name`` of its own, or
        one whose name another class already holds, is a :class:`StepRegistryError`.

        ```python
        registry = StepRegistry()
        registry.register(ReplyLengthVerifier)  # type_name = "reply_length_verifier"
        ```
        """
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
        """The class of a step type, or None (the loader reports an unknown type with the
        closest known names).

        ```python
        BUILTIN_STEPS.get("deploy_env")  # DeployEnvStep
        ```
        """
        return self._types.get(type_name)

    def names(self) -> list[str]:
        """Every registered type name, sorted: what an unknown-type error lists.

        ```python
        "prompt_agent" in BUILTIN_STEPS.names()  # True
        ```
        """
        return sorted(self._types)

    def with_impls(self, impls: Iterable[str]) -> "StepRegistry":
        """A copy extended with ``module:Class`` pointers (``[task_steps] impls``); a pointer
        that does not import, or names no ``TaskStep`` subclass, is a :class:`StepRegistryError`.

        ```python
        BUILTIN_STEPS.with_impls(["my_steps:ReplyLengthVerifier"])
        ```
        """
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
    """Register a built-in step type under ``type_name`` (the ``type`` a task document names
    it by), setting the class's ``type_name``. The package's own step modules use it; a
    project's custom types set ``type_name`` themselves and are listed in
    ``[task_steps] impls`` instead, so they stay the project's.

    ```python
    @step("reset_env")
    class ResetEnvStep(TaskStep):
        reads = {"env_id": ENV}

        env_id: str

        async def execute(self, ctx, rt):
            ...
    ```
    """

    def decorate(cls: S) -> S:
        cls.type_name = type_name
        BUILTIN_STEPS.register(cls)
        return cls

    return decorate
