"""``-D PATH=VALUE`` (``--set``): the CLI layer, the last and highest of the config merge.

Values are YAML scalars (numbers, lists, ``true``/``null``...), except that the YAML 1.1
truthy words (``on``, ``yes``, ``n``...) stay strings, so ``-D agent.model=on`` is not
``True``. Paths under one root merge into one nested patch, applied with the same per-field
strategies as an experiment variant (append fields append).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from ...errors import SpecError
from ..documents import parse_yaml
from .agents import ALL_AGENT_MODELS, parse_agent_config
from .base import errors_of, validate_model
from .limits import RunLimits
from .merge import MergeError, merge_layers
from .sandbox import SandboxConfig
from .task import TaskDefinition

ALLOWED_ROOTS = ("agent", "run_limits", "sandbox")
YAML_TRUTHY_WORDS = frozenset({"y", "n", "yes", "no", "on", "off"})


class OverrideError(ValueError):
    """A malformed ``-D`` override, an unknown path in one, or a value its field refuses."""


def parse_scalar(value: str) -> Any:
    """The value as YAML, within the input limits (no NaN, no alias bombs)."""
    try:
        parsed = parse_yaml(value)
    except SpecError as exc:
        raise OverrideError(f"value is not valid YAML: {exc}") from None
    if isinstance(parsed, bool) and value.strip().lower() in YAML_TRUTHY_WORDS:
        return value
    return parsed


def parse_override(raw: str) -> tuple[str, Any]:
    """``PATH=VALUE`` split on the first ``=``, the value parsed."""
    if "=" not in raw:
        raise OverrideError(f"override must be PATH=VALUE, got: {raw!r}")
    path, _, value = raw.partition("=")
    path = path.strip()
    if not path:
        raise OverrideError(f"override path cannot be empty: {raw!r}")
    return path, parse_scalar(value)


def apply_overrides(
    task: TaskDefinition, overrides: Sequence[str], *, agent_type: str | None = None
) -> TaskDefinition:
    """``task`` with every ``-D`` override applied; ``agent_type`` (``--type``) sets
    ``agent.type`` unless a ``-D agent.type`` is given."""
    patches: dict[str, dict[str, Any]] = {root: {} for root in ALLOWED_ROOTS}
    for raw in overrides:
        path, value = parse_override(raw)
        root, _, rest = path.partition(".")
        if root not in patches:
            raise OverrideError(f"unknown override root {root!r}; allowed roots: {', '.join(ALLOWED_ROOTS)}")
        _assign(patches[root], rest.split("."), value)
    if agent_type is not None:
        patches["agent"].setdefault("type", agent_type)

    update: dict[str, Any] = {}
    if patches["agent"]:
        seed = task.agent.model_dump(exclude_unset=True) if task.agent else {}
        kind = patches["agent"].get("type", seed.get("type"))
        if "sdk_options" in patches["agent"] and kind != "claude-code":
            where = "no agent type is set" if kind is None else f"agent type {kind}"
            raise OverrideError(
                f"sdk_options cannot be used with {where}. This option is only supported for claude-code agents."
            )
        merged = _merge("agent", ALL_AGENT_MODELS, seed, patches["agent"])
        update["agent"] = _build("agent", parse_agent_config, merged)
    for root, model in (("run_limits", RunLimits), ("sandbox", SandboxConfig)):
        if patches[root]:
            # The whole current value is the base, so append fields extend what it already has.
            current = getattr(task, root)
            merged = _merge(root, (model,), current.model_dump() if current else {}, patches[root])
            update[root] = _build(root, validate_model, model, merged)
    return task.model_copy(update=update)


def _assign(patch: dict[str, Any], segments: list[str], value: Any) -> None:
    """Nested assignment, so ``a.b.c`` and ``a.b.d`` share one ``a.b`` dict."""
    for segment in segments[:-1]:
        if not isinstance(patch.get(segment), dict):
            patch[segment] = {}
        patch = patch[segment]
    patch[segments[-1]] = value


def _merge(root: str, models: Sequence[type[BaseModel]], seed: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    try:
        return merge_layers(models, [seed, patch], context=root)
    except MergeError as exc:
        raise OverrideError(str(exc)) from None


def _build(root: str, build: Callable[..., BaseModel | None], *args: Any) -> BaseModel | None:
    """Construct the root's model; a refused value reads ``-D <root>.<path>: <reason>``."""
    try:
        return build(*args)
    except ValueError as exc:
        raise OverrideError("; ".join(
            f"-D {root}.{problem.field}: {problem.message}" if problem.field else f"-D {root}: {problem.message}"
            for problem in errors_of(exc)
        )) from None
