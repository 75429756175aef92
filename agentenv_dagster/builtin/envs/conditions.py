"""The condition language of env triggers: predicates, check pipelines, paths, placeholders.

Shared by registration (validation, fail-loud with the trigger's id in the message) and firing
(evaluation against tool results and the provoking call), as upstream's gateway spells them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .clock import parse_duration, parse_rfc3339

PREDICATE_KEYS = ("regex", "equals", "exists")
PLACEHOLDER = re.compile(r"\$\{((?:args|result)(?:\.[\w\[\]]+)*)\}")
_ANY_PLACEHOLDER = re.compile(r"\$\{([\w.\[\]]+)\}")


class TriggerError(ValueError):
    """A registration the env refuses (answered as HTTP 400, nothing registered)."""


def time_mark(value: Any) -> tuple[str, Any]:
    """('abs', datetime) for an RFC3339 instant, ('rel', timedelta) for a duration after t0."""
    if isinstance(value, str) and value.startswith("P"):
        return "rel", parse_duration(value)
    return "abs", parse_rfc3339(value, "at")


def check_predicate(predicate: Any, where: str) -> None:
    if not isinstance(predicate, dict) or sum(k in predicate for k in PREDICATE_KEYS) != 1:
        raise TriggerError(f"{where}: predicate must have exactly one of {PREDICATE_KEYS}")
    if "regex" in predicate:
        try:
            re.compile(predicate["regex"])
        except re.error as exc:
            raise TriggerError(f"{where}: invalid regex: {exc}") from None
    if "exists" in predicate and not isinstance(predicate["exists"], bool):
        raise TriggerError(f"{where}: exists must be a boolean")


def check_pipeline(check: Any, where: str) -> dict[str, Any]:
    """``{"steps": [...]}``, or one step given inline (``{"tool", "args", "extract", "predicate"}``)."""
    if not isinstance(check, dict):
        raise TriggerError(f"{where}: check must be an object")
    steps = check.get("steps", [check] if "tool" in check else None)
    if not isinstance(steps, list) or not steps:
        raise TriggerError(f"{where}: check needs 'steps' or a single-step tool/predicate form")
    for i, step in enumerate(steps):
        at = f"{where}.steps[{i}]"
        if not isinstance(step, dict) or not isinstance(step.get("tool"), str) or not step["tool"]:
            raise TriggerError(f"{at}: tool must be a non-empty string")
        if not isinstance(step.get("args", {}), dict):
            raise TriggerError(f"{at}: args must be an object")
        extract = step.get("extract")
        if extract is not None and not isinstance(extract, str) and not (isinstance(extract, dict) and "path" in extract):
            raise TriggerError(f"{at}: extract must be a dot-path string or {{path, match, take}}")
        if "predicate" in step:
            check_predicate(step["predicate"], f"{at}.predicate")
    if "predicate" not in steps[-1]:
        raise TriggerError(f"{where}: the last check step must carry a predicate")
    return {"steps": steps}


def holds(predicate: dict, value: Any) -> bool:
    if "regex" in predicate:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        return re.search(predicate["regex"], text) is not None
    if "equals" in predicate:
        return value == predicate["equals"]
    return (value is not None and value != "" and value != [] and value != {}) == predicate["exists"]


def _path(data: Any, path: str) -> Any:
    """Dot path with ``[n]`` indices (``emails[0].from``); None where it leads nowhere."""
    current = data
    for segment in path.split("."):
        match = re.fullmatch(r"(\w+)((?:\[\d+\])*)", segment)
        if match is None or not isinstance(current, dict) or match.group(1) not in current:
            return None
        current = current[match.group(1)]
        for index in re.findall(r"\[(\d+)\]", match.group(2)):
            if not isinstance(current, list) or int(index) >= len(current):
                return None
            current = current[int(index)]
    return current


def lookup(ctx: dict, field: str) -> Any:
    """A ``where`` key: ``args.<path>`` / ``result.<path>``, or a bare top-level argument."""
    root, _, path = field.partition(".")
    if root in ("args", "result") and path:
        return _path(ctx.get(root), path)
    return (ctx.get("args") or {}).get(field)


def extract(extract: Any, data: Any, text: str) -> Any:
    if extract is None:
        return text
    if isinstance(extract, str):
        return _path(data, extract)
    items = _path(data, extract["path"])
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and all(holds(p, item.get(f)) for f, p in extract.get("match", {}).items()):
            return item.get(extract["take"]) if extract.get("take") else item
    return None


def fill(value: Any, ctx: dict, bindings: dict) -> Any:
    """Substitute ``${args.x}`` / ``${result.x}`` (the provoking call) and ``${name}`` (a check
    binding); a string that is one placeholder becomes the raw value, other names stay literal."""
    if isinstance(value, dict):
        return {k: fill(v, ctx, bindings) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, ctx, bindings) for v in value]
    if not isinstance(value, str):
        return value

    def known(name: str) -> bool:
        return name in bindings or name.split(".")[0] in ("args", "result")

    def resolve(name: str) -> Any:
        if name in bindings:
            return bindings[name]
        root, _, path = name.partition(".")
        found = _path(ctx.get(root), path) if path else ctx.get(root)
        if found is None:
            raise LookupError(f"unresolved placeholder ${{{name}}}")
        return found

    def text(match: re.Match) -> str:
        if not known(match.group(1)):
            return match.group(0)
        found = resolve(match.group(1))
        return found if isinstance(found, str) else json.dumps(found, default=str)

    whole = _ANY_PLACEHOLDER.fullmatch(value)
    if whole is not None and known(whole.group(1)):
        return resolve(whole.group(1))
    return _ANY_PLACEHOLDER.sub(text, value)
