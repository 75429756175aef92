"""Bounded reading of untrusted documents: task files (JSON and YAML), experiments, dataset
files, replay scripts, saved contexts and ``-D`` values.

A document is hostile until it has been parsed and checked, and a refusal is one clear
:class:`SpecError` (never a hang, a traceback or a flood of text):

- a file over ``MAX_DOCUMENT_BYTES`` is refused before it is parsed;
- text is UTF-8; binary data or another encoding is named as such, with the place;
- JSON and YAML nest at most ``MAX_NESTING`` levels;
- YAML aliases may add at most ``MAX_ALIAS_NODES`` nodes to a document (a "billion laughs"
  is refused before anything is built from it) and may not contain themselves;
- numbers are finite (no NaN, no infinity) and strings valid Unicode (no lone surrogates).

The YAML checks run on the composed node graph, where aliases are still shared nodes and
every node knows its line, so a problem is reported at ``<file>:<line>``.
``docs/input-limits.md`` describes the limits for users.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError, clip, excerpt

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
MAX_NESTING = 100
MAX_ALIAS_NODES = 100_000

_UTF8_BOM = b"\xef\xbb\xbf"
_FLOAT_TAG, _INT_TAG, _STR_TAG = (f"tag:yaml.org,2002:{kind}" for kind in ("float", "int", "str"))
# libyaml when PyYAML has it (several times faster); its messages are replaced by PyYAML's own
# (see _python_yaml_problem), so a message never depends on how PyYAML was built.
_FastLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_text(path: str | Path) -> str:
    """The UTF-8 text of a regular file of at most ``MAX_DOCUMENT_BYTES``; any other file is a
    :class:`SpecError` located at it."""
    source = str(path)
    try:
        mode = os.stat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise SpecError("not a regular file (a device, pipe or socket)", file=source)
        with open(path, "rb") as handle:  # a folder fails here, with the system's reason
            raw = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read file: {exc.strerror}", file=source) from None
    if len(raw) > MAX_DOCUMENT_BYTES:
        raise SpecError(f"the file is larger than {MAX_DOCUMENT_BYTES // (1024 * 1024)} MiB, the limit for a "
                        "document (see docs/input-limits.md)", file=source)
    return decode(raw, source)


def decode(raw: bytes, source: str | None = None) -> str:
    """UTF-8 text (a leading byte-order mark dropped); binary data and other encodings are
    refused with where the first offending byte is."""
    raw = raw.removeprefix(_UTF8_BOM)
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise SpecError(f"binary data, not a text document (a NUL byte at {_place(raw, nul)})", file=source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at {_place(raw, exc.start)} "
                        "(save the file as UTF-8)", file=source) from None


def _place(raw: bytes, offset: int) -> str:
    before = raw[:offset]
    line = before.count(b"\n") + 1
    column = len(before[before.rfind(b"\n") + 1:].decode("utf-8", errors="replace")) + 1
    return f"line {line} column {column}"


# -- JSON ---------------------------------------------------------------------------------------


class ValueProblem(SpecError):
    """A parsed value outside the limits; ``path`` is where it is (keys and list indexes)."""

    def __init__(self, message: str, path: tuple[str, ...], *, field: str | None = None):
        super().__init__(message, field=field if field is not None else _dotted(path) or None)
        self.path = path


def parse_json(text: str, *, check: bool = True) -> Any:
    """JSON within the limits; a problem is an unlocated :class:`SpecError` (the caller names
    the file). ``check=False`` leaves :func:`check_values` to a caller that locates its
    :class:`ValueProblem` itself."""
    try:
        data = json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise SpecError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise SpecError(f"invalid JSON: nested deeper than {MAX_NESTING} levels") from None
    if check:
        check_values(data)
    return data


def load_json(path: str | Path) -> Any:
    """A JSON file read and parsed within the limits; problems are located at the file."""
    text = read_text(path)
    try:
        return parse_json(text)
    except SpecError as exc:
        raise exc.located(str(path)) from None


def _json_int(digits: str) -> int:
    limit = sys.get_int_max_str_digits()
    if limit and len(digits) > limit:
        raise SpecError(f"invalid JSON: an integer of {len(digits)} digits (at most {limit})")
    return int(digits)


def check_values(data: Any) -> None:
    """Nesting, finite numbers and valid Unicode over parsed data, or :class:`ValueProblem`
    (iteratively: a deep value cannot exhaust the stack). A first pass only looks; where a
    problem is, a second one that keeps the path says."""
    if _within_limits(data):
        return
    _locate_problem(data)


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _within_limits(data: Any) -> bool:
    """Whether nothing in ``data`` breaks a limit (a non-text key sends it to the locating
    pass, which judges it)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and _surrogate_problem(value):
                return False
        elif isinstance(value, float):
            if not math.isfinite(value):
                return False
        elif isinstance(value, _CONTAINERS):
            if depth >= MAX_NESTING:
                return False
            if isinstance(value, dict):
                if not all(isinstance(key, str) and (key.isascii() or not _surrogate_problem(key)) for key in value):
                    return False
                stack.extend((item, depth + 1) for item in value.values())
            else:
                stack.extend((item, depth + 1) for item in value)
    return True


def _locate_problem(data: Any) -> None:
    """The first problem in ``data`` as a :class:`ValueProblem` at its path."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        problem = _scalar_problem(value)
        if problem:
            raise ValueProblem(problem, path)
        if len(path) >= MAX_NESTING and isinstance(value, _CONTAINERS):
            raise ValueProblem(f"nested deeper than {MAX_NESTING} levels", path, field=_dotted_start(path))
        if isinstance(value, dict):
            for key, item in value.items():
                problem = _scalar_problem(key)
                if problem:
                    raise ValueProblem(f"key {excerpt(key, 60)}: {problem}", path)
                stack.append((item, (*path, _segment(key))))
        elif isinstance(value, _CONTAINERS):
            stack.extend((item, (*path, str(index))) for index, item in enumerate(value))


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (NaN and infinity are refused)"
    if isinstance(value, str):
        return _surrogate_problem(value)
    return None


def _surrogate_problem(text: str) -> str | None:
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"text holds a lone surrogate ({excerpt(text[exc.start])} at character {exc.start + 1}): not valid Unicode"
    return None


def _segment(key: Any) -> str:
    return clip(key if isinstance(key, str) else excerpt(key), 60)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _dotted_start(path: tuple[str, ...], shown: int = 3) -> str:
    """Where a too-deep value starts: its first segments (the rest is just more nesting)."""
    return _dotted(path[:shown]) + ("..." if len(path) > shown else "")


# -- YAML ---------------------------------------------------------------------------------------


def parse_yaml(text: str) -> Any:
    """YAML within the limits (the first document); a problem is an unlocated
    :class:`SpecError` with the line it is on (syntax errors say line and column)."""
    loader = _FastLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise _python_yaml_problem(text) or _yaml_error(exc) from None
        if node is None:
            return None
        _check_nodes(node, loader)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc) from None
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML: {clip(str(exc))}") from None
    except RecursionError:
        raise SpecError(f"invalid YAML: nested deeper than {MAX_NESTING} levels") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """A YAML file read and parsed within the limits; problems are located at the file."""
    text = read_text(path)
    try:
        return parse_yaml(text)
    except SpecError as exc:
        raise exc.located(str(path)) from None


def mapping_key_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each top-level key of a YAML mapping document already known to
    parse within the limits: for messages that point at a key."""
    loader = _FastLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError:
        return {}
    finally:
        loader.dispose()
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {key.value: key.start_mark.line + 1 for key, _ in node.value if isinstance(key, yaml.ScalarNode)}


def _yaml_error(exc: yaml.MarkedYAMLError) -> SpecError:
    mark = exc.problem_mark or exc.context_mark
    where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
    return SpecError(f"invalid YAML{where}: {clip(exc.problem or exc.context or '')}")


def _python_yaml_problem(text: str) -> SpecError | None:
    """PyYAML's own account of a document libyaml refused: its syntax error, or the limit
    its parse breaks (libyaml refuses a lone surrogate escape that PyYAML reads). Composed
    only: aliases stay shared and nothing is built."""
    if _FastLoader is yaml.SafeLoader:
        return None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_nodes(node, loader)
    except yaml.MarkedYAMLError as exc:
        return _yaml_error(exc)
    except SpecError as exc:
        return exc
    except RecursionError:  # composing recurses; some libyaml builds refuse deep nesting first
        return _too_deep(text)
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()
    return None


def _too_deep(text: str) -> SpecError | None:
    """Where a document nests past the limit, read from the parser's events (parsing, unlike
    composing, does not recurse): the same error ``_check_nodes`` gives."""
    path: list[str] = []
    open_collections: list[list] = []  # per open collection: [is a mapping, next key or index, awaiting a key]
    loader = yaml.SafeLoader(text)
    try:
        while (event := loader.get_event()) is not None and not isinstance(event, yaml.StreamEndEvent):
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                open_collections.pop()
                if path:
                    path.pop()
                continue
            if not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
                continue
            parent = open_collections[-1] if open_collections else None
            segment = None
            if parent is not None and parent[0] and parent[2]:  # a mapping's key
                parent[1], parent[2] = getattr(event, "value", "?"), False
                if not isinstance(event, yaml.CollectionStartEvent):
                    continue
                segment = "?"  # a collection as a key
            elif parent is not None:
                segment = _segment(parent[1]) if parent[0] else str(parent[1])
                parent[1], parent[2] = (None, True) if parent[0] else (parent[1] + 1, False)
            if isinstance(event, yaml.CollectionStartEvent):
                if segment is not None:
                    path.append(segment)
                if len(path) >= MAX_NESTING:
                    return SpecError(f"nested deeper than {MAX_NESTING} levels", field=_dotted_start(tuple(path)),
                                     line=event.start_mark.line + 1)
                is_mapping = isinstance(event, yaml.MappingStartEvent)
                open_collections.append([is_mapping, None if is_mapping else 0, is_mapping])
    except yaml.YAMLError:
        return None
    finally:
        loader.dispose()
    return None


def _check_nodes(root: yaml.Node, loader: yaml.BaseLoader) -> None:
    """Nesting, self-containing aliases, alias expansion and scalar values over the composed
    graph, in one depth-first pass; each shared node is checked once."""
    sizes: dict[int, int] = {}  # a finished node -> its size with every alias expanded
    open_nodes: set[int] = set()  # the nodes on the current path (a cycle returns to one)
    written = 0
    stack: list[tuple[yaml.Node, tuple[str, ...], bool]] = [(root, (), False)]
    while stack:
        node, path, finished = stack.pop()
        key = id(node)
        if finished:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(child)] for _, child in _children(node))
            continue
        if key in sizes:
            continue
        line = node.start_mark.line + 1
        if key in open_nodes:
            raise SpecError("a YAML alias refers to a node that contains it", field=_dotted(path) or None, line=line)
        if len(path) >= MAX_NESTING and not isinstance(node, yaml.ScalarNode):
            raise SpecError(f"nested deeper than {MAX_NESTING} levels", field=_dotted_start(path), line=line)
        written += 1
        problem = _yaml_scalar_problem(node, loader)
        if problem:
            raise SpecError(problem, field=_dotted(path) or None, line=line)
        open_nodes.add(key)
        stack.append((node, path, True))
        stack.extend((child, (*path, name), False) for name, child in reversed(_children(node)))
    if sizes[id(root)] - written > MAX_ALIAS_NODES:
        raise SpecError(f"YAML aliases would add more than {MAX_ALIAS_NODES:,} nodes to this document "
                        "(an alias expanding into aliases, as in a 'billion laughs'); refused")


def _children(node: yaml.Node) -> list[tuple[str, yaml.Node]]:
    """(path segment, node) of each child: a sequence's items, a mapping's keys and values."""
    if isinstance(node, yaml.SequenceNode):
        return [(str(index), item) for index, item in enumerate(node.value)]
    if isinstance(node, yaml.MappingNode):
        found = []
        for key, value in node.value:
            name = _segment(key.value) if isinstance(key, yaml.ScalarNode) else "?"
            found += [(name, key), (name, value)]
        return found
    return []


def _yaml_scalar_problem(node: yaml.Node, loader: yaml.BaseLoader) -> str | None:
    if not isinstance(node, yaml.ScalarNode):
        return None
    if node.tag == _FLOAT_TAG:
        if not math.isfinite(loader.construct_yaml_float(node)):
            return f"{clip(node.value, 40)} is not a finite number (NaN and infinity are refused)"
    elif node.tag == _INT_TAG:
        limit = sys.get_int_max_str_digits()
        if limit and len(node.value) > limit:
            return f"an integer of {len(node.value)} digits (at most {limit})"
    elif node.tag == _STR_TAG:
        return _surrogate_problem(node.value)
    return None
