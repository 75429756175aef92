"""The step contract: a pydantic model of the step's fields plus ``async execute``.

Each step type declares which context names it reads and writes (``reads``/``writes``: field
name -> kind of name). The static join check, asset lineage and docs are derived from these
declarations instead of per-type code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterator, NamedTuple

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from ..ids import check_id
from ..spec.depends import normalize_depends_on

if TYPE_CHECKING:
    from ..context import TaskStepContext
    from ..runtime.base import StepRuntime

DEFAULT_AGENT_NAME = "default-agent"
DEFAULT_TTL_SECONDS = 7200

# Kinds of names steps join on through the context.
ENV, AGENT, SANDBOX, PROMPT, VERIFICATION, PRODUCER, ARTIFACT = (
    "env", "agent", "sandbox", "prompt", "verification", "producer", "artifact",
)
SELF = "id"  # a declaration on the step's own id (e.g. collect_artifacts produces under it)


class ContextName(NamedTuple):
    kind: str
    name: str
    field: str


class RetryConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # ``go_to_step_id`` is accepted on input only; the stored form says ``retry_from_step_id``.
    retry_from_step_id: str = Field(validation_alias=AliasChoices("retry_from_step_id", "go_to_step_id"))
    # retries at most
    max_retries: int = 1

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if not data.get("retry_from_step_id") and not data.get("go_to_step_id"):
                raise ValueError("retry_config requires 'retry_from_step_id' (or 'go_to_step_id')")
            retries = data.get("max_retries", 1)
            if not isinstance(retries, int) or isinstance(retries, bool):
                raise ValueError(f"retry_config.max_retries must be an int, got {retries!r}")
            if retries < 0:
                raise ValueError(f"retry_config.max_retries must be >= 0, got {retries}")
        return data


class TaskStep(BaseModel):
    """Base of every step type. Unknown fields are refused, so a typo fails at compile time.

    A step type declares its fields, its ``type_name``, the context names it reads and writes
    (field -> kind: ``ENV``, ``AGENT``, ``SANDBOX``, ``PROMPT``, ``VERIFICATION``,
    ``PRODUCER``, ``ARTIFACT``) and ``execute``:

    ```python
    class ReplyLengthVerifier(TaskStep):
        type_name = "reply_length_verifier"
        reads = {"prompt_id": PROMPT}           # an ancestor must produce this prompt
        writes = {"verifier_id": VERIFICATION}  # the asset verifications/<job>/<verifier_id>

        prompt_id: str
        verifier_id: str
        max_words: int = 120

        async def execute(self, ctx, rt):
            words = len(ctx.find_prompt_response(self.prompt_id).response.split())
            score = float(words <= self.max_words)
            ctx.metadata_map("verifications")[self.verifier_id] = {"score": score, "graded": True, "results": []}
    ```
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False, allow_inf_nan=False)

    type_name: ClassVar[str] = "task_step"
    reads: ClassVar[dict[str, str]] = {}
    writes: ClassVar[dict[str, str]] = {}

    # the step's id: unique in the task, its node name and what `depends_on` names
    id: str
    # the step type (the headings below)
    type: str
    # the step's version, kept in the stored form
    version: int | None = None
    # `true`: a failure stops the row and fails the run; `false`: it is recorded and the row goes on
    fail_task_on_error: bool = True
    # the steps this one runs after (see above)
    depends_on: list[Any] | None = None
    # retry this step's failure from itself or from an ancestor
    retry_config: RetryConfig | None = None

    @field_validator("id")
    @classmethod
    def _id_names_files(cls, value: str) -> str:
        return check_id(value, "step id")  # it names the step's files (objects, references)

    @field_validator("depends_on", mode="before")
    @classmethod
    def _normalize_depends_on(cls, value: Any) -> list[Any] | None:
        return normalize_depends_on(value)

    async def warm_up(self, rt: "StepRuntime") -> None:
        """What the step can start before its first row arrives, so the row waits less (an
        agent host, say). Best effort: what fails here is the first row's to report."""

    async def execute(self, ctx: "TaskStepContext", rt: "StepRuntime") -> None:
        """Run the step for one row: read what ancestors wrote from ``ctx`` (the merged
        context of this row's ancestors), act through ``rt`` (providers, artifacts, judges,
        HTTP clients, the run's log) and record the outcome in ``ctx``. Raising fails the
        step (the row stops when ``fail_task_on_error`` is true).

        ```python
        async def execute(self, ctx, rt):
            env = ctx.find_env(self.env_id)
            rt.log.info("resetting %s", env.mcp_url)
        ```
        """
        raise NotImplementedError(f"step type {self.type!r} does not implement execute()")

    # -- declarations ----------------------------------------------------------------------
    def names_read(self) -> Iterator[ContextName]:
        return self._names(self.reads)

    def names_written(self) -> Iterator[ContextName]:
        return self._names(self.writes)

    def _names(self, declared: dict[str, str]) -> Iterator[ContextName]:
        for field, kind in declared.items():
            value = getattr(self, field, None)
            for name in value if isinstance(value, list) else [value]:
                if isinstance(name, str) and name:
                    yield ContextName(kind, name, field)

    def verification_checks(self) -> list[tuple[str, str]]:
        """(name, description) of the asset checks on the verification this step writes."""
        return [("passed", "The verification met its pass threshold; not graded fails as WARN.")]

    def to_document(self) -> dict[str, Any]:
        """The stored form: object-form depends_on, defaults omitted except the base fields."""
        data = self.model_dump(mode="json", exclude_none=True, exclude_defaults=True, by_alias=True)
        data.update(id=self.id, type=self.type, fail_task_on_error=self.fail_task_on_error)
        data["version"] = self.version
        if self.depends_on is not None:
            data["depends_on"] = [{"task_step_id": dep} for dep in self.depends_on]
        return data
