"""Redaction: nothing we record carries a secret.

Two rules, applied to what leaves a run's memory (contexts between ops and in context.json,
reports, step failure records, log lines):

- **by key**: a string under a key that names a secret (``key``, ``token``, ``secret``,
  ``password``, ``authorization``, ``credential``, any case) becomes ``"***"``; upstream's own
  secret fields (:data:`SECRET_KEYS`) are dropped, as agent-env drops them. Numbers are kept
  (``input_tokens``), and a dict under such a key is judged by its own keys (``token_usage``).
- **by value**: every occurrence of a secret we know becomes ``"***"`` in any text: the
  configured API keys, the run's server tokens, environment variables whose names look
  secret, and every value found under a secret key (a ``-D metadata.password`` a prompt
  echoed).
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any, Iterable

from pydantic_core import to_json

REDACTED = "***"
# agent-env's secret fields: dropped outright
SECRET_KEYS = frozenset({
    "litellm_api_key", "judge_litellm_api_key", "usersim_api_key", "remote_tokens", "cf_access_client_secret",
    "api_key", "anthropic_api_key",
})
SECRET_NAME = re.compile(r"key|token|secret|passw|authorization|credential", re.IGNORECASE)
# names of ours that match the pattern yet hold identifiers, never secrets
NOT_SECRET_NAMES = frozenset({
    "partition_key", "asset_key", "run_key", "verifier_key", "prompt_key", "artifacts_key", "stop_token",
    "user_stop_token", "env_key", "stop_reason", "step_key", "mapping_key", "cache_key", "sort_key",
})
MIN_SECRET_LENGTH = 6  # shorter values are masked under their key, but not hunted for in all text

_SECRET_WORDS = (b"key", b"token", b"secret", b"passw", b"authorization", b"credential")
_UPSTREAM_NEEDLES = tuple(f'"{key}"'.encode() for key in SECRET_KEYS)


def is_secret_name(name: str) -> bool:
    return name in SECRET_KEYS or (bool(SECRET_NAME.search(name)) and name.lower() not in NOT_SECRET_NAMES)


class _KnownSecrets:
    """The secret values this process knows: remembered as they are met, plus the values of
    its environment variables whose names look secret (as the environment is now) and whose
    values look like credentials (8 characters or more, a digit among them: not a setting
    such as ``disabled``, which would be masked in every text)."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()
        self._environment: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # (names, the secret ones)

    def add(self, value: Any) -> None:
        if isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH and value not in self._values:
            with self._lock:
                self._values.add(value)

    def values(self) -> frozenset[str]:
        names = tuple(os.environ)
        if names != self._environment[0]:  # judge the names again only when they change
            self._environment = (names, tuple(n for n in names if is_secret_name(n)))
        from_environment = {v for n in self._environment[1]
                            if len(v := os.environ.get(n, "")) >= 8 and any(c.isdigit() for c in v)}
        return frozenset(self._values | from_environment)


_KNOWN = _KnownSecrets()
os.register_at_fork(after_in_child=lambda: setattr(_KNOWN, "_lock", threading.Lock()))


def remember_secret(value: str | None) -> None:
    """Add ``value`` to the secrets every later redaction hunts for (a key just resolved, a
    token just made)."""
    _KNOWN.add(value)


def known_secrets() -> frozenset[str]:
    return _KNOWN.values()


def redact_text(text: str, also: Iterable[str] = ()) -> str:
    """``text`` with every known secret value (and those in ``also``) replaced by ``***``."""
    for value in sorted({*known_secrets(), *also}, key=len, reverse=True):
        if value in text:
            text = text.replace(value, REDACTED)
    return text


def needs_redaction(data: bytes) -> bool:
    """Whether JSON text holds anything to redact: a secret-named entry, or a known value."""
    if any(needle in data for needle in _UPSTREAM_NEEDLES) or _has_secret_entry(data):
        return True
    return any(json.dumps(value)[1:-1].encode() in data for value in known_secrets())


def _has_secret_entry(data: bytes) -> bool:
    """Whether JSON text has a secret-named key holding a string or a list: each place a
    secret word occurs is judged, as a key, by the name around it (a plain search runs at C
    speed; a regular expression over the whole text cost ~50x more)."""
    lowered = data.lower()
    for word in _SECRET_WORDS:
        at = lowered.find(word)
        while at != -1:
            end, begin = data.find(b'"', at), data.rfind(b'"', 0, at)
            rest = data[end + 1:end + 16].lstrip() if end != -1 else b""
            if begin != -1 and rest[:1] == b":" and rest[1:].lstrip()[:1] in (b'"', b"["):
                if is_secret_name(data[begin + 1:end].decode("utf-8", errors="replace")):
                    return True
            at = lowered.find(word, at + 1)
    return False


def redact(value: Any, *, keep_secret_keys: bool = False) -> Any:
    """A copy of JSON-like ``value`` with both rules applied; with ``keep_secret_keys`` the
    values under secret keys stay (and are remembered) while their copies elsewhere go."""
    found: set[str] = set()
    _collect(value, found)
    for secret in found:
        remember_secret(secret)
    needles = sorted({*known_secrets(), *(s for s in found if s)}, key=len, reverse=True)
    return _walk(value, needles, keep_secret_keys)


def redacted_json(value: Any) -> bytes:
    """``value`` (dicts, lists, and contexts or their records as ``TaskStepContext.to_dict``
    has them) as one line of UTF-8 JSON, redacted.

    pydantic's serializer writes a dataset op's 500 rows (~2.8 MB) in a third of the time of
    ``json.dumps``, and a context straight from its fields. Most documents hold nothing to
    redact: the walk of :func:`redact` runs only for those :func:`needs_redaction` flags."""
    data = to_json(value, exclude_none=True, fallback=str)
    return to_json(redact(json.loads(data)), fallback=str) if needs_redaction(data) else data


def redact_bytes(data: bytes) -> bytes:
    """A stored object (a trajectory, a transcript) redacted: as JSON (both rules) when it is
    JSON, else as text (by value)."""
    if not needs_redaction(data):
        return data
    try:
        value = json.loads(data)
    except ValueError:
        return redact_text(data.decode("utf-8", errors="replace")).encode()
    return json.dumps(redact(value), indent=1, ensure_ascii=False).encode()


def _collect(value: Any, found: set[str]) -> None:
    """The strings under secret-named keys, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and is_secret_name(key):
                if isinstance(item, str):
                    found.add(item)
                elif isinstance(item, list):
                    found.update(i for i in item if isinstance(i, str))
                elif isinstance(item, dict) and key in SECRET_KEYS:
                    found.update(i for i in item.values() if isinstance(i, str))
            _collect(item, found)
    elif isinstance(value, list):
        for item in value:
            _collect(item, found)


def _walk(value: Any, needles: list[str], keep_secret_keys: bool) -> Any:
    if isinstance(value, str):
        for needle in needles:
            if needle in value:
                value = value.replace(needle, REDACTED)
        return value
    if isinstance(value, list):
        return [_walk(item, needles, keep_secret_keys) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not keep_secret_keys and isinstance(key, str) and is_secret_name(key):
            if key in SECRET_KEYS:
                continue
            if isinstance(item, str):
                item = REDACTED
            elif isinstance(item, list):
                item = [REDACTED if isinstance(i, str) else _walk(i, needles, keep_secret_keys) for i in item]
            else:
                item = _walk(item, needles, keep_secret_keys)
        elif keep_secret_keys and isinstance(key, str) and is_secret_name(key) and not isinstance(item, dict):
            pass  # the run still needs it; only its copies elsewhere go
        else:
            item = _walk(item, needles, keep_secret_keys)
        out[key] = item
    return out
