"""Field references for the docs site, generated from the pydantic models so they never drift.

``mkdocs build`` runs this through ``scripts/mkdocs_hooks.py``: a page line that is exactly
``<!-- reference: NAME -->`` is replaced by the Markdown of ``REFERENCES[NAME]``. Each model
becomes a table of its fields (name, type, default, description). A field's description is,
in order: its ``Field(description=...)``, its attribute docstring, or the source comment on
its line or on the comment lines right above it, so a maintainer documents a field where it
is declared. Run ``python scripts/docs_reference.py NAME`` to print one reference.
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import textwrap
import tokenize
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# The fields every agent-env step has; documented once, in their own table.
STEP_BASE_FIELDS = ("id", "type", "version", "fail_task_on_error", "depends_on", "retry_config")
# Fields every Coder Eval criterion has; documented once.
CRITERION_BASE_FIELDS = ("type", "description", "weight", "pass_threshold", "suite_thresholds")


# -- descriptions from the source ---------------------------------------------------------

@cache
def _source_notes(cls: type) -> dict[str, str]:
    """``field -> note`` from the class body: an attribute docstring, the comment on the
    field's line, or the comment block right above it."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    (body,) = ast.parse(source).body
    notes: dict[str, str] = {}
    statements = list(body.body)
    for index, node in enumerate(statements):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        name = node.target.id
        following = statements[index + 1] if index + 1 < len(statements) else None
        if isinstance(following, ast.Expr) and isinstance(getattr(following, "value", None), ast.Constant) \
                and isinstance(following.value.value, str):
            notes[name] = inspect.cleandoc(following.value.value)
            continue
        trailing = comments.get(node.end_lineno)
        above, line = [], node.lineno - 1
        while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        note = " ".join([*above, *([trailing] if trailing else [])])
        if note:
            notes[name] = note
    return notes


def description(model: type[BaseModel], name: str, info: FieldInfo) -> str:
    """What a field means, from where it is declared (see the module docstring)."""
    if info.description:
        return info.description
    for cls in model.__mro__:
        if isinstance(cls, type) and issubclass(cls, BaseModel) and name in cls.__dict__.get("__annotations__", {}):
            return _source_notes(cls).get(name, "")
    return ""


# -- types and defaults --------------------------------------------------------------------

def type_text(annotation: Any, link: Callable[[type[BaseModel]], str | None]) -> str:
    """An annotation as a reader writes it in a task file (``str | None``, ``list[str]``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_text(args[0], link)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(dict.fromkeys(type_text(a, link) for a in args))
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        inner = ", ".join(type_text(a, link) for a in args if a is not Ellipsis) or "any"
        return f"list[{inner}]"
    if origin is dict:
        return f"map[{', '.join(type_text(a, link) for a in args)}]" if args else "map"
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return link(annotation) or "object"
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    name = getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Path": "path",
            "SandboxPath": "path", "BaseModel": "object"}.get(name, name)


def default_text(info: FieldInfo) -> str:
    """The default as it would be written (``required`` when there is none)."""
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "see below" if value.model_fields_set or value.model_dump(exclude_defaults=True) else "`{}`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`".replace("'", '"')


# -- tables ----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _anchor(model: type[BaseModel], prefix: str) -> str:
    return f"{prefix}-{re.sub(r'[^a-z0-9]+', '-', model.__name__.lower()).strip('-')}"


class Reference:
    """One page's reference: models rendered as tables, nested models linked and rendered once."""

    def __init__(self, prefix: str, links: dict[type, str] | None = None):
        self.prefix = prefix
        self.links = dict(links or {})  # models documented in a section of their own
        self.done: set[type] = set()
        self.queue: list[tuple[type[BaseModel], str]] = []
        self.out: list[str] = []

    def link(self, model: type[BaseModel]) -> str | None:
        if model in self.links:
            return self.links[model]
        if model.__name__ in ("BaseModel",):
            return None
        if model not in self.done and all(m is not model for m, _ in self.queue):
            self.queue.append((model, model.__name__))
        return f"[{model.__name__}](#{_anchor(model, self.prefix)})"

    def table(self, model: type[BaseModel], *, skip: tuple[str, ...] = (), heading: str | None = None,
              level: int = 3, note: str = "", types: dict[str, str] | None = None) -> None:
        self.done.add(model)
        if heading is not None:
            self.out += [f"{'#' * level} {heading} {{ #{_anchor(model, self.prefix)} }}", ""]
        doc = inspect.cleandoc(model.__doc__) if model.__doc__ and model.__doc__ is not BaseModel.__doc__ else ""
        for text in (doc, note):
            if text:
                self.out += [text, ""]
        rows = [(name, info) for name, info in model.model_fields.items() if name not in skip and not info.exclude]
        if not rows:
            self.out += ["No fields of its own.", ""]
            return
        self.out += ["| field | type | default | description |", "|---|---|---|---|"]
        for name, info in rows:
            shown = info.validation_alias if isinstance(info.validation_alias, str) else (info.alias or name)
            self.out.append(
                f"| `{shown}` | {_cell((types or {}).get(name) or type_text(info.annotation, self.link))} "
                f"| {_cell(default_text(info))} "
                f"| {_cell(description(model, name, info)) or '—'} |")
        self.out.append("")

    def flush(self, level: int = 3) -> None:
        """Every nested model linked so far, each once."""
        while self.queue:
            model, title = self.queue.pop(0)
            if model not in self.done:
                self.table(model, heading=f"`{title}`", level=level)

    def text(self) -> str:
        return "\n".join(self.out)


# -- the references ------------------------------------------------------------------------

def configuration() -> str:
    """``.agentenv/config.toml``: each section, its fields, nested tables after."""
    from agentenv_dagster.config import AgentEnvConfig

    ref = Reference("config")
    ref.table(AgentEnvConfig, heading="Top level", level=2,
              note="Each field below is a TOML table (`[model]`, `[stores]`, ...) or, for "
                   "`schedules` and `experiments`, a table of entries.")
    for name, info in AgentEnvConfig.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            ref.table(annotation, heading=f"`[{name}]`", level=2)
    ref.flush(level=2)
    return ref.text()


def agent_env_steps() -> str:
    """Every built-in step type of an agent-env task document."""
    from agentenv_dagster.steps import BUILTIN_STEPS
    from agentenv_dagster.steps.base import TaskStep

    ref = Reference("step")
    ref.table(TaskStep, heading="Fields every step has", level=3,
              note="`depends_on`: absent or `null` = after every earlier step; `[]` = a root; a "
                   "list of step ids (or `{\"task_step_id\": ...}` objects) = after those steps.")
    ref.flush(level=4)
    for name in BUILTIN_STEPS.names():
        cls = BUILTIN_STEPS.get(name)
        joins = _joins(cls)
        ref.table(cls, skip=STEP_BASE_FIELDS, heading=f"`{name}`", level=3, note=joins)
        ref.flush(level=4)
    return ref.text()


def _joins(cls: type) -> str:
    parts = []
    if cls.reads:
        parts.append("reads " + ", ".join(f"`{field}` ({kind})" for field, kind in cls.reads.items()))
    if cls.writes:
        parts.append("writes " + ", ".join(f"`{field}` ({kind})" for field, kind in cls.writes.items()))
    return f"Context names: {'; '.join(parts)}." if parts else ""


def coder_eval() -> str:
    """A Coder Eval task YAML (every block under it), its agents, its criteria, and experiment
    files, on one page: each nested block is documented once and linked from where it is used."""
    from agentenv_dagster.criteria import CRITERION_TYPES
    from agentenv_dagster.criteria.base import Criterion
    from agentenv_dagster.spec.coder_eval.agents import AGENT_KINDS, AgentConfig
    from agentenv_dagster.spec.coder_eval.experiment import ExperimentDefinition
    from agentenv_dagster.spec.coder_eval.task import TaskDefinition

    # agents are documented in their own section; a field of an agent's type links there
    links = {cls: f"[{name} agent](#{_anchor(cls, 'task')})" for name, cls in AGENT_KINDS.items()}
    ref = Reference("task", links={**links, AgentConfig: "[agent](#agents)"})
    ref.table(TaskDefinition, heading="Top level", level=3,
              note="Unknown top-level keys are dropped with a warning; every nested block is strict.",
              types={"success_criteria": "list[[criterion](#criteria)]"})
    ref.flush(level=4)

    ref.out += ["### Agents (`agent:`) { #agents }", "",
                "One table per `type`; `type` may be left to an experiment layer.", ""]
    for type_name, cls in sorted(AGENT_KINDS.items()):
        ref.table(cls, heading=f"`type: {type_name}`", level=4)
    ref.flush(level=4)

    ref.out += ["### Criteria (`success_criteria:`) { #criteria }", "",
                "Every criterion has `type` and `description`; `weight` (0 = informational, never "
                "gates) and `pass_threshold` decide how it counts; `suite_thresholds` gate a "
                "dataset's aggregate. Custom criteria: [Customizing](../customizing.md#custom-criteria).", ""]
    ref.table(Criterion, heading="Fields every criterion has", level=4)
    for type_name in sorted(CRITERION_TYPES):
        ref.table(CRITERION_TYPES[type_name], skip=CRITERION_BASE_FIELDS, heading=f"`{type_name}`", level=4)
        ref.flush(level=4)

    ref.out += ["### Experiment files { #experiment-files }", ""]
    ref.table(ExperimentDefinition, heading="Experiment: top level", level=4)
    ref.flush(level=4)
    return ref.text()


REFERENCES: dict[str, Callable[[], str]] = {
    "configuration": configuration,
    "agent-env-steps": agent_env_steps,
    "coder-eval": coder_eval,
}


def main(argv: list[str]) -> int:
    names = argv or list(REFERENCES)
    for name in names:
        if name not in REFERENCES:
            print(f"unknown reference {name!r}; known: {', '.join(REFERENCES)}", file=sys.stderr)
            return 2
        print(REFERENCES[name]())
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(main(sys.argv[1:]))
