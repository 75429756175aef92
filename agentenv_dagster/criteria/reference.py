"""``reference_comparison``: how close the agent's file is to the task's reference solution.

Three measures of Python code: the sequence of AST node kinds, the sequence of token kinds, and
McCabe complexity / size / function count against the reference's (counted the way radon's
``cc_visit`` counts them, hand-written here to keep the dependency list short).
"""

from __future__ import annotations

import ast
import io
import tokenize
from difflib import SequenceMatcher
from pathlib import Path
from typing import Iterator, Literal

from pydantic import Field, model_validator

from . import paths
from .base import CheckerMisuseError, Criterion, CriterionContext, CriterionResult
from .paths import SandboxPath
from .registry import criterion

Method = Literal["ast", "token", "complexity"]
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def ast_similarity(agent: str, reference: str) -> float:
    """Ratio of matching node kinds, in ``ast.walk`` (breadth-first) order; SyntaxError propagates."""
    def kinds(source: str) -> list[str]:
        return [type(node).__name__ for node in ast.walk(ast.parse(source))]
    return SequenceMatcher(None, kinds(agent), kinds(reference)).ratio()


def token_kinds(source: str) -> list[str]:
    """Token type names (values ignored); code that stops mid-construct keeps the tokens so far."""
    kinds: list[str] = []
    try:
        for token in tokenize.tokenize(io.BytesIO(source.encode()).readline):
            kinds.append(tokenize.tok_name[token.type])
    except (tokenize.TokenError, SyntaxError):
        pass
    return kinds


def token_similarity(agent: str, reference: str) -> float:
    return SequenceMatcher(None, token_kinds(agent), token_kinds(reference)).ratio()


def _decisions(node: ast.AST) -> int:
    """Decision points in ``node`` and below, not entering nested definitions (blocks of their own)."""
    if isinstance(node, _DEFS):
        return 0
    own = 0
    if isinstance(node, (ast.If, ast.IfExp, ast.With, ast.AsyncWith, ast.Assert)):
        own = 1
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        own = 1 + bool(node.orelse)
    elif isinstance(node, (ast.Try, ast.TryStar)):
        own = len(node.handlers) + bool(node.orelse)
    elif isinstance(node, ast.BoolOp):
        own = len(node.values) - 1
    elif isinstance(node, ast.comprehension):
        own = 1 + len(node.ifs)
    elif isinstance(node, ast.Match):
        last = node.cases[-1].pattern if node.cases else None
        own = len(node.cases) - (isinstance(last, ast.MatchAs) and last.pattern is None)
    return own + sum(_decisions(child) for child in ast.iter_child_nodes(node))


def _definitions(node: ast.AST) -> Iterator[ast.AST]:
    """The outermost function and class definitions under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _DEFS):
            yield child
        else:
            yield from _definitions(child)


def _function_complexity(node: ast.AST) -> int:
    return 1 + sum(_decisions(statement) for statement in node.body)  # type: ignore[attr-defined]


def block_complexities(source: str) -> list[int]:
    """One complexity per block: each function, each class, and each method of a class."""
    blocks: list[int] = []
    for node in _definitions(ast.parse(source)):
        if isinstance(node, _FUNCTIONS):
            blocks.append(_function_complexity(node))
            continue
        methods = [_function_complexity(m) for m in _definitions(node) if isinstance(m, _FUNCTIONS)]
        body = 1 + sum(methods) + sum(_decisions(statement) for statement in node.body)  # type: ignore[attr-defined]
        blocks.append(body // len(methods) + (len(methods) > 1) if methods else body)
        blocks.extend(methods)
    return blocks


def complexity_similarity(agent: str, reference: str) -> tuple[float, str]:
    """0.5·cyclomatic + 0.3·size + 0.2·function-count scores; a zero reference divides by zero."""
    agent_blocks, reference_blocks = block_complexities(agent), block_complexities(reference)
    agent_cc, reference_cc = sum(agent_blocks), sum(reference_blocks)
    agent_loc, reference_loc = len(agent.splitlines()), len(reference.splitlines())
    cc_score = max(0.0, 1 - min(1.0, agent_cc / (1.5 * reference_cc)))
    loc_score = max(0.0, 1 - min(1.0, agent_loc / (1.5 * reference_loc)))
    function_score = max(0.0, 1 - abs(len(agent_blocks) - len(reference_blocks)) / max(len(reference_blocks), 1))
    overall = 0.5 * cc_score + 0.3 * loc_score + 0.2 * function_score
    details = (f"cyclomatic {agent_cc} vs {reference_cc} ({cc_score:.3f}), lines {agent_loc} vs {reference_loc} "
               f"({loc_score:.3f}), blocks {len(agent_blocks)} vs {len(reference_blocks)} ({function_score:.3f})")
    return overall, details


@criterion("reference_comparison")
class ReferenceComparison(Criterion):
    """Continuous: similarity of ``agent_file`` to ``reference_file`` of the task's reference.

    ``similarity_threshold`` is this criterion's ``pass_threshold`` (it overrides it)."""

    requires_agent = True
    blocking = True

    agent_file: SandboxPath
    reference_file: SandboxPath
    comparison_method: Method = "ast"
    similarity_threshold: float = Field(default=0.8, ge=0, le=1)

    @model_validator(mode="after")
    def _threshold_is_similarity(self) -> ReferenceComparison:
        self.pass_threshold = self.similarity_threshold
        return self

    async def check(self, ctx: CriterionContext) -> CriterionResult:
        if ctx.reference_dir is None:
            return self.result(0.0, error="No reference configured for this task (reference.directory is not set)")
        reference = self._reference_text(ctx.reference_dir)
        agent_path = paths.resolve_one(ctx.sandbox_dir, self.agent_file)
        if agent_path is None:
            return self.result(0.0, error=f"Agent file not found: {self.agent_file}")
        agent = paths.read_text(agent_path)
        try:
            if self.comparison_method == "complexity":
                score, measured = complexity_similarity(agent, reference)
            else:
                measure = ast_similarity if self.comparison_method == "ast" else token_similarity
                score, measured = measure(agent, reference), ""
        except (SyntaxError, ValueError, ZeroDivisionError) as exc:
            return self.result(0.0, error=f"Comparison failed: {type(exc).__name__}: {exc}")
        details = (f"Comparison method: {self.comparison_method}\nSimilarity: {score:.3f}\n"
                   f"Threshold: {self.similarity_threshold:.3f}")
        return self.result(score, details=f"{details}\n{measured}" if measured else details)

    def _reference_text(self, reference_dir: Path) -> str:
        """The reference file's text; a missing, escaping or empty one is the task's fault."""
        try:
            found = paths.resolve_one(reference_dir, self.reference_file)
            text = found.read_text() if found is not None else None
        except (OSError, ValueError) as exc:
            raise CheckerMisuseError(f"reference_file '{self.reference_file}' cannot be read: {exc}") from exc
        if text is None:
            raise CheckerMisuseError(
                f"reference_file '{self.reference_file}' does not exist in the reference directory")
        if not text.strip():
            raise CheckerMisuseError(f"reference_file '{self.reference_file}' is empty")
        return text
