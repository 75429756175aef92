"""The execution plan of one task: edges, ancestry, the static join check, slicing.

agent-env resolves names (env_id, agent_name, prompt_id ...) at run time against one shared,
racing context. Here each step sees its ancestors' writes only, so a lookup that no ancestor
can satisfy is known at compile time and reported with the file, the step and the name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

from .errors import SpecError
from .spec.depends import resolve_edges
from .spec.loader import TaskDocument
from .steps.base import ARTIFACT, SELF, TaskStep

_NOUNS = {
    "env": ("deploys", "env"),
    "agent": ("deploys", "agent"),
    "sandbox": ("deploys", "sandbox"),
    "prompt": ("answers", "prompt_id"),
    "verification": ("writes", "verifier_id"),
    "producer": ("records artifacts as", "step"),
}


@dataclass(frozen=True)
class TaskPlan:
    document: TaskDocument
    # Names already present when the plan starts (a saved context of a sliced re-run).
    given_names: frozenset[tuple[str, str]] = field(default_factory=frozenset)

    @property
    def task_id(self) -> str:
        return self.document.task_id

    @property
    def steps(self) -> tuple[TaskStep, ...]:
        return self.document.steps

    @cached_property
    def edges(self) -> dict[str, tuple[str, ...]]:
        return resolve_edges([(s.id, s.depends_on) for s in self.steps])

    @cached_property
    def step_by_id(self) -> dict[str, TaskStep]:
        return {s.id: s for s in self.steps}

    @cached_property
    def _ancestors(self) -> dict[str, frozenset[str]]:
        result: dict[str, frozenset[str]] = {}
        for step in self.steps:  # list order is a topological order
            deps = self.edges[step.id]
            result[step.id] = frozenset(deps).union(*(result[d] for d in deps))
        return result

    def ancestors(self, step_id: str) -> frozenset[str]:
        return self._ancestors[step_id]

    def context_sources(self, step_id: str) -> tuple[str, ...]:
        """The dependencies whose contexts a step merges: those no other dependency descends
        from (a descendant's context already holds its ancestors', and what it wrote since)."""
        deps = self.edges[step_id]
        return tuple(d for d in deps if not any(d in self._ancestors[other] for other in deps))

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        used = {dep for deps in self.edges.values() for dep in deps}
        return tuple(s.id for s in self.steps if s.id not in used)

    def written_by(self, step: TaskStep) -> set[tuple[str, str]]:
        return {(n.kind, step.id if n.field == SELF else n.name) for n in step.names_written()}

    def join_errors(self) -> list[SpecError]:
        """Every read that no dependency ancestor writes."""
        errors = []
        for step in self.steps:
            available = set(self.given_names)
            for ancestor in self.ancestors(step.id):
                available |= self.written_by(self.step_by_id[ancestor])
            for name in step.names_read():
                if name.kind == ARTIFACT or (name.kind, name.name) in available:
                    continue
                verb, noun = _NOUNS.get(name.kind, ("writes", name.kind))
                message = f"no step it depends on {verb} {noun} '{name.name}'"
                producers = [
                    s for s in self.steps
                    if s.id != step.id and (name.kind, name.name) in self.written_by(s)
                ]
                if producers:
                    producer = producers[0].id
                    if self._position(producer) < self._position(step.id):
                        message += (
                            f" (step '{producer}' does, but is not among its dependencies: "
                            "add it to depends_on)"
                        )
                    else:
                        message += f" (step '{producer}' does, but comes after it in the list)"
                errors.append(
                    SpecError(message, file=self.document.source, step_id=step.id, field=name.field)
                )
        return errors

    def artifact_lineage(self, step_id: str) -> list[str]:
        """Stored artifacts read by this step or its ancestors: the upstream assets of
        whatever the step produces."""
        found: list[str] = []
        for step_id_ in sorted({*self.ancestors(step_id), step_id}, key=self._position):
            for name in self.step_by_id[step_id_].names_read():
                if name.kind == ARTIFACT and name.name not in found:
                    found.append(name.name)
        return found

    @cached_property
    def _positions(self) -> dict[str, int]:
        return {s.id: i for i, s in enumerate(self.steps)}

    def _position(self, step_id: str) -> int:
        return self._positions[step_id]

    def slice(self, start_step: int = 0, end_step: int | None = None,
              given_names: Iterable[tuple[str, str]] = ()) -> "TaskPlan":
        """Steps ``[start_step, end_step)``; earlier ones count as done (their writes come
        from the saved context), later ones are dropped. Messages as ``Task.run``."""
        total = len(self.steps)
        if not 0 <= start_step < total:
            raise SpecError(f"start_step={start_step} out of range [0, {total})")
        end = total if end_step is None else end_step
        if not start_step < end <= total:
            raise SpecError(f"end_step={end} out of range ({start_step}, {total}]")
        kept = self.steps[start_step:end]
        kept_ids = {s.id for s in kept}
        sliced = []
        for step in kept:
            deps = [d for d in self.edges[step.id] if d in kept_ids]
            sliced.append(step.model_copy(update={"depends_on": deps}))
        document = TaskDocument(
            task_id=self.document.task_id, version=self.document.version,
            steps=tuple(sliced), source=self.document.source, format=self.document.format,
            seed=self.document.seed,
        )
        return TaskPlan(document, given_names=frozenset(given_names))
