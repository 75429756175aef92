"""``cli_called``: structured matching over the JSON Lines log a recording CLI mock wrote.

Matching is argv element-wise (verb prefix, positionals, flag predicates), never a regex over a
flattened line. Ambiguity always resolves toward keeping a token positional: a flag takes a
value only when declared to, since guessing is how a ``max_count: 0`` guard ends up passing on
the very call it forbids.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from . import paths
from .base import CheckerMisuseError, Criterion, CriterionContext, CriterionResult
from .paths import SandboxPath
from .registry import criterion

VALUE_PREDICATES = ("equals", "contains", "matches_regex", "any_of")


class FlagMatch(BaseModel):
    """Exactly one predicate on a flag's values, gathered across the flag's name and aliases."""

    model_config = ConfigDict(extra="forbid")

    equals: str | None = None
    contains: str | None = None
    matches_regex: str | None = None
    flags: int | None = None
    any_of: list[str] | None = Field(default=None, min_length=1)
    present: bool = False
    absent: bool = False
    aliases: list[str] = []

    @model_validator(mode="before")
    @classmethod
    def _bare_scalar(cls, data: Any) -> Any:
        """``model: gemini`` is shorthand for ``model: {equals: gemini}``."""
        if isinstance(data, bool):
            raise ValueError("a bare boolean is not a flag predicate: use {present: true} or {absent: true}")
        if isinstance(data, (str, int, float)):
            return {"equals": str(data)}
        return data

    @model_validator(mode="after")
    def _one_predicate(self) -> FlagMatch:
        chosen = [name for name in VALUE_PREDICATES if getattr(self, name) is not None]
        chosen += [name for name in ("present", "absent") if getattr(self, name)]
        if len(chosen) != 1:
            names = [*VALUE_PREDICATES, "present", "absent"]
            raise ValueError(f"a flag predicate needs exactly one of {names}, got {chosen}")
        if self.flags is not None and self.matches_regex is None:
            raise ValueError("'flags' applies only to 'matches_regex'")
        if self.matches_regex is not None:
            try:
                re.compile(self.matches_regex, self.flags or 0)
            except (re.error, ValueError) as exc:
                raise ValueError(f"matches_regex {self.matches_regex!r} does not compile: {exc}") from exc
        return self

    @property
    def needs_value(self) -> bool:
        """Presence predicates never make a flag consume the next token."""
        return not (self.present or self.absent)

    def holds(self, values: list[str]) -> bool:
        """``values`` is empty when the flag was not passed; any one value may satisfy it."""
        if self.absent:
            return not values
        if self.present:
            return bool(values)
        if self.equals is not None:
            return self.equals in values
        if self.contains is not None:
            return any(self.contains in v for v in values)
        if self.any_of is not None:
            return any(v in self.any_of for v in values)
        regex = re.compile(self.matches_regex or "", self.flags or 0)
        return any(regex.search(v) for v in values)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def split_flags(argv: list[str], *, value_flags: frozenset[str], known: frozenset[str],
                ignore: frozenset[str]) -> tuple[list[str], dict[str, list[str]]]:
    """argv as positionals and ``{flag: [values]}``; a switch's value is ``""``."""
    positional: list[str] = []
    flags: dict[str, list[str]] = {}

    def record(name: str, value: str) -> None:
        if name not in ignore:
            flags.setdefault(name, []).append(value)

    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            positional.extend(tokens)
            break
        if not token.startswith("-") or token == "-":
            positional.append(token)
        elif "=" in token:
            name, _, value = token.partition("=")
            record(name.lstrip("-"), value)
        else:
            name = token.lstrip("-")
            declared = name in value_flags or name in known
            if not declared and _is_number(name):
                positional.append(token)
            elif not declared and not token.startswith("--") and len(name) > 1:
                if name[0] in value_flags:  # -fVALUE
                    record(name[0], name[1:])
                else:  # -rf is -r -f
                    for char in name:
                        record(char, "")
            elif name in value_flags:
                record(name, next(tokens, ""))
            else:
                record(name, "")
    return positional, flags


@criterion("cli_called")
class CliCalled(Criterion):
    """Binary: the number of logged invocations matching every facet is within ``min..max``."""

    blocking = True

    log: SandboxPath = "cli_mocks/calls.jsonl"
    verb: str | None = None
    verb_any_of: list[str] | None = None
    tool: str | None = None
    positional: list[str] | None = None
    flags: dict[str, FlagMatch] | None = None
    value_flags: list[str] = ["output"]
    ignore_flags: list[str] = ["output"]
    min_count: int = Field(default=1, ge=0)
    max_count: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _meaningful(self) -> CliCalled:
        if self.max_count is None and self.min_count == 0:
            raise ValueError("min_count 0 without max_count can never fail: set max_count (0 forbids the call)")
        if self.max_count is not None and self.max_count < self.min_count:
            raise ValueError(f"max_count ({self.max_count}) must be >= min_count ({self.min_count})")
        if self.verb is not None and self.verb_any_of is not None:
            raise ValueError("'verb' and 'verb_any_of' are mutually exclusive")
        if not (self.verb_spellings or self.positional is not None or self.flags or self.tool is not None):
            raise ValueError("cli_called needs at least one of verb, verb_any_of, positional, flags or tool")
        if self.positional is not None and not self.positional:
            raise ValueError("'positional' must not be empty (omit it to leave positionals unconstrained)")
        self._check_verbs()
        self._check_flag_names()
        return self

    def _check_verbs(self) -> None:
        spellings = [self.verb] if self.verb is not None else self.verb_any_of
        if spellings is None:
            return
        if not spellings:
            raise ValueError("'verb_any_of' must list at least one verb")
        for verb in spellings:
            if not verb.split():
                raise ValueError("a verb must not be blank")
            if any(token.startswith("-") for token in verb.split()):
                raise ValueError(f"verb '{verb}' contains a flag; put flags under 'flags'")
        split = [tuple(v.split()) for v in spellings]
        for i, a in enumerate(split):
            for b in split[i + 1:]:
                if a[:len(b)] == b or b[:len(a)] == a:
                    raise ValueError(f"verb_any_of entries '{' '.join(a)}' and '{' '.join(b)}' overlap "
                                     "(one is a prefix of the other)")

    def _check_flag_names(self) -> None:
        owner: dict[str, str] = {}
        for key, predicate in (self.flags or {}).items():
            if key in predicate.aliases:
                raise ValueError(f"flag '{key}' lists itself as an alias")
            for name in (key, *predicate.aliases):
                if name in owner:
                    raise ValueError(f"flag name '{name}' is claimed by both '{owner[name]}' and '{key}'")
                if name in self.ignore_flags:
                    raise ValueError(f"flag '{name}' has a predicate but is in ignore_flags, "
                                     "so it is dropped before matching")
                owner[name] = key

    @property
    def verb_spellings(self) -> list[list[str]]:
        spellings = [self.verb] if self.verb is not None else (self.verb_any_of or [])
        return [v.split() for v in spellings]

    def argv_matches(self, argv: list[str]) -> bool:
        predicates = self.flags or {}
        names = {key: (key, *p.aliases) for key, p in predicates.items()}
        value_flags = frozenset(self.value_flags).union(
            *(names[key] for key, p in predicates.items() if p.needs_value))
        known = frozenset(self.ignore_flags).union(*names.values())
        positional, flags = split_flags(argv, value_flags=value_flags, known=known, ignore=frozenset(self.ignore_flags))
        offset = 0
        if self.verb_spellings:
            verb = next((v for v in self.verb_spellings if positional[:len(v)] == v), None)
            if verb is None:
                return False
            offset = len(verb)
        if self.positional is not None and positional[offset:offset + len(self.positional)] != self.positional:
            return False
        return all(p.holds([v for n in names[key] for v in flags.get(n, [])]) for key, p in predicates.items())

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        log = paths.resolve_one(ctx.sandbox_dir, self.log)
        if log is None:
            return self.result(0.0, error=f"Invocation log '{self.log}' does not exist")
        sentinel = log.with_name(log.name + ".error")
        if sentinel.exists():
            dropped = sentinel.read_text(errors="replace").strip().splitlines()
            return self.result(0.0, error=(
                f"Recorder could not write to '{self.log}' ({len(dropped)} dropped record(s)); the log is "
                f"incomplete so the verdict cannot be trusted. First: {dropped[0] if dropped else '?'}"))
        records, unusable = _parse_log(paths.read_text(log))
        broken = [r for r in records if r.get("sidecar_error") is not None]
        if broken:
            return self.result(0.0, error=(
                f"Recorder could not import its matcher on {len(broken)} invocation(s), so no response rule was "
                f"tried. First: {broken[0]['sidecar_error']!r}"))
        faults = [r for r in records if r.get("rule_error") is not None]
        if faults:
            raise CheckerMisuseError(
                f"record_cli could not evaluate its response rules on {len(faults)} invocation(s) in '{self.log}' "
                f"(an eval-config fault, not an agent failure). First: {faults[0]['rule_error']!r}")
        if unusable:
            return self.result(0.0, error=(
                f"Invocation log '{self.log}' has {unusable} unusable record(s): a line that is not JSON, not an "
                "object, or whose 'argv' is not a list of strings; an unreadable record could be the forbidden call"))
        count = sum(1 for r in records
                    if (self.tool is None or r.get("tool") == self.tool) and self.argv_matches(r["argv"]))
        return self._verdict(count, records)

    def _verdict(self, count: int, records: list[dict]) -> CriterionResult:
        bound = f"min_count={self.min_count}" + (f", max_count={self.max_count}" if self.max_count is not None else "")
        wanted = ", ".join(self._facets())
        if count < self.min_count:
            sample = "; ".join(shlex.join(r["argv"])[:120] for r in records[:3])
            more = f" (+{len(records) - 3} more)" if len(records) > 3 else ""
            return self.result(0.0, details=(
                f"{count} invocation(s) matched ({wanted}); needs {bound}. {len(records)} invocation(s) recorded "
                f"in '{self.log}'." + (f" Recorded: {sample}{more}" if sample else "")))
        if self.max_count is not None and count > self.max_count:
            return self.result(0.0, details=f"{count} invocation(s) matched ({wanted}) but {bound} forbids it")
        return self.result(1.0, details=f"{count} invocation(s) matched ({wanted}); satisfies {bound}")

    def _facets(self) -> list[str]:
        facets = [f"tool={self.tool!r}"] if self.tool is not None else []
        if self.verb_spellings:
            facets.append(f"verb={' | '.join(' '.join(v) for v in self.verb_spellings)!r}")
        if self.positional is not None:
            facets.append(f"positional={self.positional!r}")
        if self.flags:
            facets.append(f"flags={sorted(self.flags)}")
        return facets


def _parse_log(text: str) -> tuple[list[dict], int]:
    """Usable records and the number of unusable lines (blank lines are neither)."""
    records, unusable = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unusable += 1
            continue
        argv = record.get("argv") if isinstance(record, dict) else None
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            records.append(record)
        else:
            unusable += 1
    return records, unusable
