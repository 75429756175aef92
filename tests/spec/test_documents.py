"""Bounded reading of untrusted documents (docs/input-limits.md): file size, encoding, nesting,
YAML alias expansion, finite numbers and valid Unicode, each refused with one short, located
message. Every probe is generated here; none is a committed file."""

from __future__ import annotations

import json
import os
import re

import pytest

from agentenv_dagster.errors import EXCERPT_CHARS, SpecError
from agentenv_dagster.spec.documents import (
    MAX_ALIAS_NODES,
    MAX_DOCUMENT_BYTES,
    MAX_NESTING,
    load_json,
    load_yaml,
    parse_json,
    parse_yaml,
)


def refusal(parse, text: str) -> str:
    """The refusal as a user reads it of a file named ``doc`` (with the line, when known)."""
    with pytest.raises(SpecError) as info:
        parse(text)
    return str(info.value.located("doc"))


def laughs(levels: int, width: int = 9) -> str:
    """A "billion laughs": each anchor a list of ``width`` aliases of the one before."""
    lines = ["a0: &a0 [lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join([*lines, f"description: *a{levels}"]) + "\n"


# -- YAML aliases ------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("levels", [6, 9, 30])
def test_a_billion_laughs_is_refused_before_it_is_built(levels):
    message = refusal(parse_yaml, laughs(levels))
    assert message == (f"doc: YAML aliases would add more than {MAX_ALIAS_NODES:,} nodes to this document (an alias "
                       "expanding into aliases, as in a 'billion laughs'); refused")


def test_aliases_within_the_bound_and_merge_keys_load():
    assert parse_yaml(laughs(4))["description"][0][0][0][0] == ["lol"]
    merged = parse_yaml("base: &base {model: m, max_turns: 3}\nvariant: {<<: *base, max_turns: 5}\n")
    assert merged["variant"] == {"model": "m", "max_turns": 5}


def test_an_alias_inside_its_own_anchor_is_refused():
    assert refusal(parse_yaml, "a: &loop [1, *loop]\n") == "doc:1: field 'a.1': a YAML alias refers to a node that contains it"


# -- nesting -----------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 10_000, 100_000])
def test_json_nested_past_the_limit_is_refused_without_a_traceback(depth):
    message = refusal(parse_json, "[" * depth + "]" * depth)
    assert message in (f"doc: invalid JSON: nested deeper than {MAX_NESTING} levels",
                       f"doc: field '0.0.0...': nested deeper than {MAX_NESTING} levels")


@pytest.mark.parametrize("depth", [MAX_NESTING + 1, 10_000])
def test_yaml_nested_past_the_limit_is_refused_at_its_line(depth):
    text = "task_id: t\nsuccess_criteria: " + "[" * depth + "]" * depth + "\n"
    assert refusal(parse_yaml, text) == f"doc:2: field 'success_criteria.0.0...': nested deeper than {MAX_NESTING} levels"


@pytest.mark.parametrize("text", [
    "task_id: t\nsuccess_criteria: " + "[" * 10_000 + "]" * 10_000 + "\n",
    "a:\n  b:\n" + "".join("  " * (i + 2) + f"k{i}:\n" for i in range(120)) + "  " * 122 + "v\n",
    "? [a, b]\n: " + "[" * 200 + "]" * 200 + "\n",
], ids=["flow", "block", "complex-key"])
def test_a_document_too_deep_to_compose_in_python_is_located_as_libyaml_s_composition_is(text):
    """Some libyaml builds refuse deep nesting themselves, and Python's composer recurses past
    its stack on such a document: the refusal is then read from the parser's events, and says
    what the composed check says."""
    from agentenv_dagster.spec.documents import _too_deep

    located = _too_deep(text)
    with pytest.raises(SpecError) as composed:
        parse_yaml(text)
    assert (str(located), located.line) == (str(composed.value), composed.value.line)


def test_nesting_up_to_the_limit_loads():
    assert parse_json("[" * MAX_NESTING + "]" * MAX_NESTING) is not None
    assert parse_yaml("a: " + "[" * (MAX_NESTING - 1) + "]" * (MAX_NESTING - 1)) is not None


# -- numbers and text --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "shown"), [
    ('{"steps": [{"weight": NaN}]}', "nan"), ('{"steps": [{"weight": Infinity}]}', "inf"),
    ('{"steps": [{"weight": -Infinity}]}', "-inf"), ('{"steps": [{"weight": 1e999}]}', "inf"),
])
def test_json_non_finite_numbers_are_refused_where_they_are(text, shown):
    assert refusal(parse_json, text) == f"doc: field 'steps.0.weight': {shown} is not a finite number (NaN and infinity are refused)"


@pytest.mark.parametrize("value", [".nan", ".NaN", ".inf", "-.inf", "1.0e+999"])
def test_yaml_non_finite_numbers_are_refused_at_their_line(value):
    text = f"task_id: t\nsuccess_criteria:\n- type: file_exists\n  weight: {value}\n"
    assert refusal(parse_yaml, text) == (
        f"doc:4: field 'success_criteria.0.weight': {value} is not a finite number (NaN and infinity are refused)")


def test_lone_surrogates_are_refused_in_values_and_keys():
    assert refusal(parse_json, '{"prompt": "hi \\ud800 there"}') == (
        "doc: field 'prompt': text holds a lone surrogate ('\\ud800' at character 4): not valid Unicode")
    assert refusal(parse_json, '{"a": {"\\udfff": 1}}') == (
        "doc: field 'a': key '\\udfff': text holds a lone surrogate ('\\udfff' at character 1): not valid Unicode")
    assert refusal(parse_yaml, 'task_id: t\ninitial_prompt: "hi \\ud800"\n') == (
        "doc:2: field 'initial_prompt': text holds a lone surrogate ('\\ud800' at character 4): not valid Unicode")
    assert parse_json('{"prompt": "caf\\u00e9 \\ud83d\\ude00"}') == {"prompt": "café 😀"}  # a pair is fine


def test_integers_past_the_conversion_limit_are_refused():
    assert refusal(parse_json, "1" * 5000) == "doc: invalid JSON: an integer of 5000 digits (at most 4300)"
    assert refusal(parse_yaml, "seed: " + "1" * 5000) == "doc:1: field 'seed': an integer of 5000 digits (at most 4300)"


def test_syntax_errors_keep_their_line_and_column():
    assert refusal(parse_json, '{"a": 1,\n  "b": }') == "doc: invalid JSON at line 2 column 8: Expecting value"
    assert refusal(parse_yaml, "a: {x: 1\nb: 2\n") == "doc: invalid YAML at line 2 column 2: expected ',' or '}', but got ':'"
    assert refusal(parse_yaml, "a: *missing\n") == "doc: invalid YAML at line 1 column 4: found undefined alias 'missing'"


# -- files -------------------------------------------------------------------------------------


def test_binary_and_non_utf8_files_are_named_as_such(tmp_path):
    binary = tmp_path / "task.json"
    binary.write_bytes(b'[{"id": "a"}]\n\x00\x01\xff' + os.urandom(64))
    with pytest.raises(SpecError, match=re.escape(f"{binary}: binary data, not a text document (a NUL byte at line 2 column 1)")):
        load_json(binary)
    latin1 = tmp_path / "task.yaml"
    latin1.write_bytes("task_id: t\ndescription: café\n".encode("latin-1"))
    with pytest.raises(SpecError, match=re.escape(
            f"{latin1}: not UTF-8 text: byte 0xe9 at line 2 column 17 (save the file as UTF-8)")):
        load_yaml(latin1)


def test_a_byte_order_mark_is_dropped(tmp_path):
    path = tmp_path / "task.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "t"}).encode())
    assert load_json(path) == {"id": "t"}


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as handle:
        handle.truncate(MAX_DOCUMENT_BYTES + 1)  # sparse: nothing is written
    with pytest.raises(SpecError) as info:
        load_json(path)
    assert str(info.value) == f"{path}: the file is larger than 16 MiB, the limit for a document (see docs/input-limits.md)"


def test_a_pipe_or_a_device_is_not_read(tmp_path):
    fifo = tmp_path / "task.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match=re.escape(f"{fifo}: not a regular file (a device, pipe or socket)")):
        load_json(fifo)  # opening a pipe with no writer would block forever


def test_a_missing_file_and_a_folder(tmp_path):
    with pytest.raises(SpecError, match=re.escape(f"{tmp_path / 'gone.json'}: cannot read file: No such file or directory")):
        load_json(tmp_path / "gone.json")
    with pytest.raises(SpecError, match="cannot read file: Is a directory"):
        load_json(tmp_path)


def test_errors_quote_an_excerpt_of_a_value_never_all_of_it():
    """The pinned size of what reaches the user (EXCERPT_CHARS), not of the input."""
    message = refusal(parse_json, '{"a": "' + "x" * 2_000_000 + '\\ud800"}')
    assert len(message) < 2 * EXCERPT_CHARS
