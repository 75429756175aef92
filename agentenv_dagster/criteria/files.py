"""File criteria: existence, substrings and regular expressions over files in the sandbox."""

from __future__ import annotations

import re
from statistics import fmean

from pydantic import BaseModel, ConfigDict

from . import paths
from .base import Criterion, CriterionContext, CriterionResult
from .paths import SandboxPath
from .registry import criterion

MATCH_QUOTE_LIMIT = 100


class FileCriterion(Criterion):
    """A criterion over the text of one sandbox file (a glob must name exactly one)."""

    blocking = True

    # a sandbox path, or a glob naming exactly one file
    path: SandboxPath

    def read(self, ctx: CriterionContext) -> tuple[str, str] | None:
        """The file's text and how details should name it; None when it does not exist."""
        found = paths.resolve_one(ctx.sandbox_dir, self.path)
        if found is None:
            return None
        return paths.read_text(found), paths.label(ctx.sandbox_dir, self.path, found)

    def missing(self) -> CriterionResult:
        return self.result(0.0, error=f"File '{self.path}' does not exist")


def includes_score(text: str, includes: list[str]) -> tuple[float, str]:
    found = [s for s in includes if s in text]
    missing = [s for s in includes if s not in text]
    detail = f"Includes: {len(found)}/{len(includes)} found"
    return len(found) / len(includes), detail + (f" (missing: {missing})" if missing else "")


def excludes_score(text: str, excludes: list[str]) -> tuple[float, str]:
    present = [s for s in excludes if s in text]
    detail = f"Excludes: {len(excludes) - len(present)}/{len(excludes)} absent"
    return 1 - len(present) / len(excludes), detail + (f" (present: {present})" if present else "")


def regex_verdict(pattern: str, flags: int, must_match: bool, text: str) -> tuple[bool, str]:
    """Whether ``text`` satisfies one pattern rule, and a line saying why (re.error if invalid)."""
    match = re.compile(pattern, flags).search(text)
    if match is not None:
        seen = f"matched {match.group(0)[:MATCH_QUOTE_LIMIT]!r}"
    else:
        seen = "no match"
    return (match is not None) == must_match, f"/{pattern}/ {'must' if must_match else 'must not'} match: {seen}"


def mean_of_categories(parts: list[tuple[float, str]], lead: str) -> tuple[float, str]:
    """The mean of the active categories' scores; no active category means 1.0."""
    if not parts:
        return 1.0, lead
    score = fmean(s for s, _ in parts)
    return score, "; ".join([lead, *(d for _, d in parts), f"Score: {score:.2f}"])


@criterion("file_exists")
class FileExists(Criterion):
    """Binary: a path, or a glob matching at least one path, exists in the sandbox."""

    blocking = True

    # a sandbox path, or a glob that must match at least one
    path: SandboxPath

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = paths.matches(ctx.sandbox_dir, self.path)
        if not found:
            return self.result(0.0, details=f"File '{self.path}' does not exist")
        names = ", ".join(p.relative_to(ctx.sandbox_dir).as_posix() for p in found)
        return self.result(1.0, details=f"File '{self.path}' exists" + ("" if names == self.path else f" ({names})"))


@criterion("file_contains")
class FileContains(FileCriterion):
    """Fractional: share of ``includes`` present, of ``excludes`` absent, averaged when both."""

    # strings the file must contain
    includes: list[str]
    # strings the file must not contain
    excludes: list[str] | None = None

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = self.read(ctx)
        if found is None:
            return self.missing()
        text, name = found
        score, details = mean_of_categories(content_parts(text, self.includes, self.excludes), f"File {name}")
        return self.result(score, details=details)


def content_parts(text: str, includes: list[str] | None, excludes: list[str] | None) -> list:
    """The include and exclude categories a file check averages (only those it asks for)."""
    parts = []
    if includes:
        parts.append(includes_score(text, includes))
    if excludes:
        parts.append(excludes_score(text, excludes))
    return parts


class PatternRule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # a regular expression
    pattern: str
    # `false`: the pattern must not match
    must_match: bool = True
    # Python `re` flags, as a number
    flags: int = 0


@criterion("file_check")
class FileCheck(FileCriterion):
    """Fractional: existence, then the mean of the active include, exclude and pattern checks."""

    # strings the file must contain
    includes: list[str] = []
    # strings the file must not contain
    excludes: list[str] = []
    # regular expressions the file must (or must not) match
    patterns: list[PatternRule] = []

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = self.read(ctx)
        if found is None:
            return self.missing()
        text, name = found
        parts = content_parts(text, self.includes, self.excludes)
        if self.patterns:
            parts.append(self._patterns_score(text))
        score, details = mean_of_categories(parts, f"File {name} exists")
        return self.result(score, details=details)

    def _patterns_score(self, text: str) -> tuple[float, str]:
        """Each pattern scores 1 or 0; an invalid one scores 0 and says so."""
        verdicts = []
        for rule in self.patterns:
            try:
                verdicts.append(regex_verdict(rule.pattern, rule.flags, rule.must_match, text))
            except (re.error, ValueError) as exc:
                verdicts.append((False, f"/{rule.pattern}/ invalid regex: {exc}"))
        ok = sum(1 for passed, _ in verdicts if passed)
        lines = ", ".join(line for _, line in verdicts)
        return ok / len(verdicts), f"Patterns: {ok}/{len(verdicts)} satisfied ({lines})"


@criterion("file_matches_regex")
class FileMatchesRegex(FileCriterion):
    """Binary: ``pattern`` (with Python ``re`` flag bits) is found, or with ``must_match: false`` is not."""

    # a regular expression searched in the file
    pattern: str
    # `false`: the pattern must not match
    must_match: bool = True
    # Python `re` flags, as a number
    flags: int = 0

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        found = self.read(ctx)
        if found is None:
            return self.missing()
        text, name = found
        try:
            passed, line = regex_verdict(self.pattern, self.flags, self.must_match, text)
        except (re.error, ValueError) as exc:
            return self.result(0.0, details=f"File {name}", error=f"Invalid regex /{self.pattern}/: {exc}")
        return self.result(1.0 if passed else 0.0, details=f"File {name}: {line}")
