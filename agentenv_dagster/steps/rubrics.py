"""rubrics_verifier: a judge grades a reply against plain-language criteria.

The judge is a named agent (``agent_name``), a judge agent deployed for the grading
(``use_agent_judge``), or the LLM itself (``runtime.judge``, a model of any provider). A judge
that cannot be reached from here is not faked: the verification is written as not graded.

The LLM's verdict is its forced ``submit_verdict`` call (or the schema-constrained response,
for providers configured so); a judge agent's is its structured output or its whole reply as
JSON. A JSON object inside prose never counts: it could be the graded agent's, quoted.

Output formats (``rubric_formats``): ``rubric_binary``, ``rubric_partial`` and
``trajectory_mistakes`` are graded here; the evidence formats need screenshot trajectory
compaction, which this runtime does not provide. Ids that never match after three attempts fail
the step ("Judge returned <n> results but expected <m> criteria"); a judge that never returns a
verdict at all scores 0 with the error recorded.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..context import PromptResponse, TaskStepContext
from ..errors import clip, excerpt
from ..runtime.base import StepRuntime
from ..runtime.judge import JudgeNoVerdict, JudgeUnavailable
from .base import AGENT, PROMPT, VERIFICATION, TaskStep
from .execution import user_override
from .registry import step
from .rubric_formats import (
    EVIDENCE_FORMATS,
    FORMATS,
    MissingVerdict,
    id_problem,
    agent_verdict,
    make_row,
    restore_mistakes,
    verdict_parts,
)
from .scoring import ScoreAggregator, aggregate

OutputFormat = Literal[
    "rubric_binary", "rubric_partial", "trajectory_mistakes", "rubric_evidence",
    "rubric_evidence_with_mistakes",
]
JUDGE_ATTEMPTS = 3


class NotGraded(Exception):
    """The judge cannot be reached from here; the reason is recorded, no score invented."""


@step("rubrics_verifier")
class RubricsVerifierStep(TaskStep):
    reads = {"prompt_id": PROMPT, "agent_name": AGENT}
    writes = {"verifier_key": VERIFICATION}

    # the rubric: `{id, criterion, weight}` items a judge grades
    criteria: list[dict[str, Any]]
    # the response graded
    prompt_id: str
    # the judge's model; unset: `[model.roles] judge`
    default_model: str | None = None
    # the judge's API endpoint
    default_model_api_base: str | None = None
    # how the items' grades become the score
    score_aggregator: ScoreAggregator = "all_pass"
    # the verification's name (its asset); unset: the step id
    verifier_id: str | None = None
    # the agent whose trajectory the judge reads
    agent_name: str | None = None
    # grade with a judge agent over A2A rather than a model call
    use_agent_judge: bool = True
    # show the judge the agent's trajectory
    use_trajectory: bool = True
    # which parts of the trajectory the judge sees
    trajectory_filter: dict[str, Any] | str | None = None
    # the judge agent; unset: `[agents] judge_a2a_agent_id`
    judge_a2a_agent_id: str | None = None
    # the judge agent's sandbox kind
    judge_sandbox_type: str | None = None
    # the judge agent's scheduling priority
    judge_priority: int | None = None
    # the judge's thinking budget
    max_thinking_tokens: int | None = None
    # the judge's effort setting
    effort: str | None = None
    # seconds the judge may take
    judge_timeout_seconds: float = 1000
    # how the judge answers: binary per item, or a scale
    output_format: OutputFormat = "rubric_binary"
    # instructions added to the judge's prompt
    grading_policy_prompt: str | None = None
    # facts the judge is told (name -> value)
    context_facts_for_judge: dict[str, str] | None = None

    @field_validator("criteria")
    @classmethod
    def _unique_ids(cls, criteria: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ids = [c.get("id") for c in criteria]
        if any(not isinstance(i, str) or not i for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("rubric criteria must have unique, non-empty string ids")
        for criterion in criteria:
            if "weight" in criterion and not _finite_number(criterion["weight"]):
                raise ValueError(f"rubric criterion '{clip(criterion['id'])}': weight must be a finite number, "
                                 f"got {excerpt(criterion['weight'])}")
        return criteria

    @model_validator(mode="after")
    def _check(self) -> RubricsVerifierStep:
        if self.default_model_api_base and self.use_agent_judge:
            raise ValueError("default_model_api_base is only allowed with use_agent_judge=false")
        if self.output_format in EVIDENCE_FORMATS:
            compaction = self.trajectory_filter
            if isinstance(compaction, dict):
                screenshot = compaction.get("compaction") == "screenshot" and \
                    compaction.get("frame_strategy") == "per_criterion"
            else:
                screenshot = False
            if self.use_agent_judge or not self.use_trajectory or not screenshot:
                raise ValueError(
                    f"output_format '{self.output_format}' needs use_agent_judge=false, use_trajectory=true "
                    "and trajectory_filter {compaction: 'screenshot', frame_strategy: 'per_criterion'}"
                )
        return self

    @property
    def verifier_key(self) -> str:
        """The key under metadata.verifications; the step id when the author set none."""
        return self.verifier_id or self.id

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        response = ctx.find_prompt_response(self.prompt_id)
        if response is None:
            raise RuntimeError(f"PromptResponse with prompt_id='{self.prompt_id}' not found in context")
        verifications = ctx.metadata_map("verifications")
        if response.error_type:
            verifications[self.verifier_key] = {
                "format": self.output_format, "score": 0.0,
                "results": [{
                    "id": "prompt_error", "score": 0, "result": False,
                    "message": f"Skipped: prompt had error_type={response.error_type}",
                }],
            }
            return
        if self.output_format not in FORMATS:
            raise RuntimeError(
                f"output_format '{self.output_format}' needs screenshot trajectory compaction, "
                "which this runtime does not provide"
            )
        trajectory = self._trajectory(rt, response)
        prompt = self.judge_prompt(ctx, response, trajectory)
        model = user_override(ctx, "judge_model") or self.default_model or rt.config.model.for_role("judge")
        try:
            graded = await self._grade(ctx, rt, prompt, model)
        except NotGraded as reason:
            verifications[self.verifier_key] = {
                "format": self.output_format, "score": None, "graded": False,
                "reason": str(reason), "results": [],
            }
            rt.log.warning("verifier '%s' not graded: %s", self.verifier_key, reason)
            return
        entry: dict[str, Any] = {"format": self.output_format}
        if graded.error is not None:
            # no verdict at all after every attempt: 0, with the judge's failure on record
            rows = [{**c, "score": 0.0, "result": False, "justification": "", "error": graded.error}
                    for c in self.criteria]
            entry.update(results=rows, score=0.0, error=graded.error)
            rt.log.warning("verifier '%s' scored 0: %s", self.verifier_key, graded.error)
        else:
            rows = self._rows(graded.items)
            entry.update(results=rows, score=aggregate(rows, self.score_aggregator))
            errors = [f"{r['id']}: {r['error']}" for r in rows if "error" in r]
            if errors:
                entry["errors"] = errors
        if self.output_format == "trajectory_mistakes":
            entry["mistakes"] = restore_mistakes(graded.mistakes, self._id_of())
        entry.update(
            score_aggregator=self.score_aggregator, graded=True, judge=graded.judge,
            compact_trajectory_s3_uri=None, judge_trajectory_s3_uri=None,
        )
        if graded.discrepancies:
            entry.update(judge_output_retries=len(graded.discrepancies),
                         judge_output_discrepancies=graded.discrepancies)
        verifications[self.verifier_key] = entry

    # -- the judge -------------------------------------------------------------------------
    def keyed_criteria(self) -> list[dict[str, Any]]:
        """Criteria re-keyed c1..cN for the judge (restored in the rows)."""
        keyed = []
        for i, criterion in enumerate(self.criteria, start=1):
            item = {k: v for k, v in criterion.items() if k != "id"}
            item["id"] = f"c{i}"
            if float(criterion.get("weight", 1) or 0) < 0:
                item["negative"] = True
            keyed.append(item)
        return keyed

    def _id_of(self) -> dict[str, str]:
        return {f"c{i}": c["id"] for i, c in enumerate(self.criteria, start=1)}

    def judge_prompt(self, ctx: TaskStepContext, response: PromptResponse, trajectory: str | None) -> str:
        sections = [
            "You are grading the work of an AI agent against rubric criteria.",
            f"## Agent Prompt\n<agent_prompt>\n{response.prompt_text or ''}\n</agent_prompt>",
        ]
        if trajectory is not None:
            sections.append(f"## Agent Trajectory\n<agent_trajectory>\n{trajectory}\n</agent_trajectory>")
        sections.append(f"## Agent Response\n<agent_response>\n{response.response}\n</agent_response>")
        sections.append("## Criteria\n" + json.dumps(self.keyed_criteria(), indent=2))
        sections.append(
            "## Instructions\n" + FORMATS[self.output_format].instructions
            + "\n" + FORMATS[self.output_format].reply_instruction()
        )
        if self.grading_policy_prompt:
            sections.append(f"## Grading policy\n{self.grading_policy_prompt}")
        facts = self._context_facts(ctx)
        if facts:
            sections.append("## Context facts\n" + json.dumps(facts, indent=2, default=str))
        files = self._judge_files(ctx)
        if files:
            sections.append("## Files\nThese files were loaded for you to open:\n" + "\n".join(files))
        return "\n\n".join(sections)

    async def _grade(self, ctx, rt, prompt, model) -> _Graded:
        """Ask the judge, correcting it up to three times when its ids do not match or its
        reply holds no verdict. Wrong ids to the end fail the step (the reference's message);
        no verdict to the end is graded 0 with the error recorded."""
        ask, judge, cleanup = await self._judge(ctx, rt, model)
        keys = [c["id"] for c in self.keyed_criteria()]
        discrepancies: list[str] = []
        try:
            text = prompt
            items: list[dict[str, Any]] = []
            missing: str | None = None
            for attempt in range(JUDGE_ATTEMPTS):
                try:
                    items, mistakes = verdict_parts(await ask(text))
                except (MissingVerdict, JudgeNoVerdict) as exc:
                    missing = problem = f"no verdict: {exc}"
                else:
                    missing = None
                    problem = id_problem(items, keys)
                    if problem is None:
                        return _Graded(items, mistakes, judge, discrepancies)
                if attempt + 1 < JUDGE_ATTEMPTS:
                    discrepancies.append(problem)
                text = (
                    f"{prompt}\n\n## Correction\nYour previous verdict was invalid ({problem}). "
                    f"Return exactly one result for each of the ids {keys}."
                )
            if missing is not None:
                return _Graded([], [], judge, discrepancies,
                               error=f"judge returned no verdict after {JUDGE_ATTEMPTS} attempts ({missing})")
            raise ValueError(f"Judge returned {len(items)} results but expected {len(keys)} criteria")
        finally:
            await cleanup()

    async def _judge(self, ctx, rt, model):
        async def nothing() -> None:
            return None

        use_agent = user_override(ctx, "use_agent_judge")
        use_agent = self.use_agent_judge if use_agent is None else bool(use_agent)
        if self.agent_name:
            agent = ctx.find_agent(self.agent_name)
            if agent is None:
                raise RuntimeError(f"Agent with name '{self.agent_name}' not found in context.deployed_agents")
            return self._agent_asker(rt, agent.a2a_url or agent.api_url, agent.a2a_card), {"agent_name": self.agent_name}, nothing
        if use_agent:
            agent_id = self.judge_a2a_agent_id or rt.config.agents.judge_a2a_agent_id
            entry = rt.config.agent_entry(agent_id)
            if entry is not None and entry.kind == "anthropic":
                missing = _agent_model_missing(rt, entry)
                if missing:
                    raise NotGraded(f"judge agent '{agent_id}' needs an API key and none is configured ({missing})")
            agent = await asyncio.to_thread(
                rt.provider.deploy_agent, agent_id, agent_name=f"judge-{self.id}", ttl_seconds=int(self.judge_timeout_seconds) + 60,
            )

            async def stop() -> None:
                await asyncio.to_thread(rt.provider.terminate, agent.instance_id)

            return self._agent_asker(rt, agent.a2a_url, agent.a2a_card), {"a2a_agent_id": agent_id, "model": model}, stop
        try:
            # a run's LiteLLM overrides (agent-env's) stand for the judge provider's URL and key
            judge = rt.judge(model, self.default_model_api_base or user_override(ctx, "judge_litellm_base_url"),
                             user_override(ctx, "judge_litellm_api_key"))
        except JudgeUnavailable as exc:
            raise NotGraded(str(exc)) from None

        info: dict[str, Any] = {"model": judge.model}

        async def ask(text: str) -> Any:
            try:
                return await judge.verdict(text, FORMATS[self.output_format].schema)
            finally:  # every attempt's tokens, for the verification asset's cost metadata
                info["usage"] = asdict(judge.usage)

        return ask, info, nothing

    def _agent_asker(self, rt, url, card):
        async def ask(text: str) -> Any:
            reply = await rt.a2a.send_and_wait(url, text, timeout_seconds=self.judge_timeout_seconds, card=card)
            if reply.state != "completed":
                raise RuntimeError(f"Judge A2A task failed (task_id={reply.task_id}): {reply.text[:2000]}")
            return agent_verdict(reply.data.get("structured_output"), reply.text)

        return ask

    def _rows(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_key = {item["id"]: item for item in items}
        return [make_row(self.output_format, criterion, by_key[f"c{i}"])
                for i, criterion in enumerate(self.criteria, start=1)]

    def _trajectory(self, rt: StepRuntime, response: PromptResponse) -> str | None:
        """The agent's trajectory; of a conversation (two or more turns recorded), every
        turn's, each under a ``===== Turn i =====`` header (a turn with none is said so)."""
        if not self.use_trajectory:
            return None
        turns = getattr(response, "target_agent_per_turn_trajectory_object_urls", None) or []
        if len(turns) >= 2 and any(turns):
            return "\n\n".join(
                f"===== Turn {i} =====\n" + (rt.objects.read(url).decode(errors="replace") if url else "(no trajectory)")
                for i, url in enumerate(turns, start=1)
            )
        url = response.agent_trajectory_object_url
        if not url:
            raise RuntimeError(f"No trajectory available for prompt_id='{self.prompt_id}'")
        return rt.objects.read(url).decode(errors="replace")

    def _context_facts(self, ctx: TaskStepContext) -> dict[str, Any]:
        facts = {}
        for label, dotted in (self.context_facts_for_judge or {}).items():
            value: Any = ctx.metadata
            for part in dotted.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            facts[label] = value
        return facts

    def _judge_files(self, ctx: TaskStepContext) -> list[str]:
        if not self.agent_name:
            return []
        return [
            f"{entry.get('destination_path', '')}/{name}"
            for entry in ctx.metadata.get("loaded_file_artifact_universes") or []
            if entry.get("agent_name") == self.agent_name
            for name in entry.get("files") or []
        ]



def _agent_model_missing(rt: StepRuntime, entry: Any) -> str | None:
    """What the judge agent's model still needs configured (its provider's key), or None."""
    try:
        return rt.config.model.resolve(entry.model or rt.config.model.for_role("agent")).missing_setting()
    except ValueError as exc:
        return str(exc)


@dataclass
class _Graded:
    items: list[dict[str, Any]]
    mistakes: list[Any]
    judge: dict[str, Any]
    discrepancies: list[str] = field(default_factory=list)
    error: str | None = None


def _finite_number(value: Any) -> bool:
    """A weight the aggregate can use: a number (or numeric text, as agent-env's ``float()``
    takes it) that is neither NaN nor infinite; null leaves the default."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        return math.isfinite(float(value))
    except (ValueError, OverflowError):
        return False
