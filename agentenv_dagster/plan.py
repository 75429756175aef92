"""The execution plan of one task: edges, ancestry, the static join check, slicing.

agent-env resolves names (env_id, agent_name, prompt_id ...) at run time against one shared,
racing context. Here each step sees its ancestors' writes only, so a lookup that no ancestor
can satisfy is known at compile time and reported with the file, the step and the name.
Ancestry is carried as bit sets in one pass over the steps in list order (a topological
order), so checking a task costs steps x names, never steps x steps of Python sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

from .errors import SpecError
from .spec.depends import ancestry_pass, resolve_edges
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
    def _ancestors(self) -> dict[str, int]:
        """Each step's dependency ancestors as a bit set over list positions."""
        ids = [s.id for s in self.steps]
        return {ids[position]: union for position, union in ancestry_pass(self._depends_on, lambda i: 1 << i, keep=True)}

    @property
    def _depends_on(self) -> list[tuple[str, list | None]]:
        return [(s.id, s.depends_on) for s in self.steps]

    def ancestors(self, step_id: str) -> frozenset[str]:
        mask = self._ancestors[step_id]
        return frozenset(s.id for i, s in enumerate(self.steps[:self._position(step_id)]) if mask >> i & 1)

    def context_sources(self, step_id: str) -> tuple[str, ...]:
        """The dependencies whose contexts a step merges: those no other dependency descends
        from (a descendant's context already holds its ancestors', and what it wrote since)."""
        deps = self.edges[step_id]
        covered = 0
        for dep in deps:
            covered |= self._ancestors[dep]
        return tuple(d for d in deps if not covered >> self._position(d) & 1)

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        used = {dep for deps in self.edges.values() for dep in deps}
        return tuple(s.id for s in self.steps if s.id not in used)

    def written_by(self, step: TaskStep) -> set[tuple[str, str]]:
        return {(n.kind, step.id if n.field == SELF else n.name) for n in step.names_written()}

    def join_errors(self) -> list[SpecError]:
        """Every read that no dependency ancestor writes (nor the given names), found in one
        ancestry pass whose bit sets range over the names that are read."""
        bit: dict[tuple[str, str], int] = {}
        for step in self.steps:
            for name in step.names_read():
                key = (name.kind, name.name)
                if name.kind != ARTIFACT and key not in self.given_names:
                    bit.setdefault(key, len(bit))
        writes = [self.written_by(step) for step in self.steps]
        producers: dict[tuple[str, str], list[int]] = {}  # the first two writers of each name read
        for position, written in enumerate(writes):
            for key in written:
                if key in bit and len(found := producers.setdefault(key, [])) < 2:
                    found.append(position)

        def contribution(position: int) -> int:
            mask = 0
            for key in writes[position]:
                if key in bit:
                    mask |= 1 << bit[key]
            return mask

        errors = []
        for position, available in ancestry_pass(self._depends_on, contribution):
            step = self.steps[position]
            for name in step.names_read():
                key = (name.kind, name.name)
                if key not in bit or available >> bit[key] & 1:
                    continue
                errors.append(SpecError(self._join_message(name, position, producers.get(key, [])),
                                        file=self.document.source, step_id=step.id, field=name.field))
        return errors

    def _join_message(self, name, position: int, producers: list[int]) -> str:
        verb, noun = _NOUNS.get(name.kind, ("writes", name.kind))
        message = f"no step it depends on {verb} {noun} '{name.name}'"
        producer = next((p for p in producers if p != position), None)
        if producer is None:
            return message
        if producer < position:
            return message + (f" (step '{self.steps[producer].id}' does, but is not among its dependencies: "
                              "add it to depends_on)")
        return message + f" (step '{self.steps[producer].id}' does, but comes after it in the list)"

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
