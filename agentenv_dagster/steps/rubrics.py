"""rubrics_verifier: a judge grades a reply against plain-language criteria.

The judge is a named agent (``agent_name``), a judge agent deployed for the grading
(``use_agent_judge``), or the LLM itself through the ``anthropic`` client. A judge that
cannot be reached from here is not faked: the verification is written as not graded.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from pydantic import field_validator, model_validator

from ..context import PromptResponse, TaskStepContext
from ..runtime.base import StepRuntime
from ..runtime.judge import JudgeUnavailable
from .base import AGENT, PROMPT, VERIFICATION, TaskStep
from .execution import parse_structured_output, user_override
from .registry import step
from .scoring import ScoreAggregator, aggregate

OutputFormat = Literal[
    "rubric_binary", "rubric_partial", "trajectory_mistakes", "rubric_evidence",
    "rubric_evidence_with_mistakes",
]
JUDGE_ATTEMPTS = 3
VERDICT_SCHEMA = {
    "type": "object",
    "properties": {
        "results": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "score": {"type": "number"},
                    "justification": {"type": "string"},
                },
                "required": ["id", "score", "justification"],
            },
        }
    },
    "required": ["results"],
}
INSTRUCTIONS = {
    "rubric_binary": (
        "Judge each criterion PASS or FAIL and give it a score of exactly 1.0 (PASS) or 0.0 "
        "(FAIL). A criterion marked \"negative\": true describes a mistake: decide whether it "
        "is PRESENT or ABSENT, and score 1.0 only when it is ABSENT. Justify each briefly."
    ),
    "rubric_partial": (
        "Give each criterion a score from 0.0 to 1.0 for how fully the agent met it (for a "
        "criterion with \"outcomes\", the score of the outcome that applies). A criterion "
        "marked \"negative\": true describes a mistake: score 1.0 when it is absent. Justify "
        "each briefly."
    ),
}


class NotGraded(Exception):
    """The judge cannot be reached from here; the reason is recorded, no score invented."""


@step("rubrics_verifier")
class RubricsVerifierStep(TaskStep):
    reads = {"prompt_id": PROMPT, "agent_name": AGENT}
    writes = {"verifier_key": VERIFICATION}

    criteria: list[dict[str, Any]]
    prompt_id: str
    default_model: str | None = None
    default_model_api_base: str | None = None
    score_aggregator: ScoreAggregator = "all_pass"
    verifier_id: str | None = None
    agent_name: str | None = None
    use_agent_judge: bool = True
    use_trajectory: bool = True
    trajectory_filter: dict[str, Any] | str | None = None
    judge_a2a_agent_id: str | None = None
    judge_sandbox_type: str | None = None
    judge_priority: int | None = None
    max_thinking_tokens: int | None = None
    effort: str | None = None
    judge_timeout_seconds: float = 1000
    output_format: OutputFormat = "rubric_binary"
    grading_policy_prompt: str | None = None
    context_facts_for_judge: dict[str, str] | None = None

    @field_validator("criteria")
    @classmethod
    def _unique_ids(cls, criteria: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ids = [c.get("id") for c in criteria]
        if any(not isinstance(i, str) or not i for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("rubric criteria must have unique, non-empty string ids")
        return criteria

    @model_validator(mode="after")
    def _check(self) -> "RubricsVerifierStep":
        if self.default_model_api_base and self.use_agent_judge:
            raise ValueError("default_model_api_base is only allowed with use_agent_judge=false")
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
        if self.output_format not in INSTRUCTIONS:
            raise RuntimeError(f"output_format '{self.output_format}' is not supported by this runtime yet")
        trajectory = self._trajectory(rt, response)
        prompt = self.judge_prompt(ctx, response, trajectory)
        model = user_override(ctx, "judge_model") or self.default_model or rt.config.model.for_role("judge")
        try:
            items, judge = await self._grade(ctx, rt, prompt, model)
        except NotGraded as reason:
            verifications[self.verifier_key] = {
                "format": self.output_format, "score": None, "graded": False,
                "reason": str(reason), "results": [],
            }
            rt.log.warning("verifier '%s' not graded: %s", self.verifier_key, reason)
            return
        rows = self._rows(items)
        verifications[self.verifier_key] = {
            "format": self.output_format,
            "results": rows,
            "score": aggregate(rows, self.score_aggregator),
            "score_aggregator": self.score_aggregator,
            "graded": True,
            "judge": judge,
            "compact_trajectory_s3_uri": None,
            "judge_trajectory_s3_uri": None,
        }

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
            "## Instructions\n" + INSTRUCTIONS[self.output_format]
            + '\nReply with JSON only: {"results": [{"id": "c1", "score": 1.0, "justification": "..."}]},'
            " one result per criterion id."
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

    async def _grade(self, ctx, rt, prompt, model) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Ask the judge, correcting it up to three times when its ids do not match."""
        ask, judge, cleanup = await self._judge(ctx, rt, model)
        keys = [c["id"] for c in self.keyed_criteria()]
        try:
            text = prompt
            for _ in range(JUDGE_ATTEMPTS):
                items = _results_of(await ask(text))
                problem = _id_problem(items, keys)
                if problem is None:
                    return items, judge
                text = (
                    f"{prompt}\n\n## Correction\nYour previous verdict was invalid ({problem}). "
                    f"Return exactly one result for each of the ids {keys}."
                )
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
            return self._agent_asker(rt, agent.a2a_url or agent.api_url), {"agent_name": self.agent_name}, nothing
        if use_agent:
            agent_id = self.judge_a2a_agent_id or rt.config.agents.judge_a2a_agent_id
            entry = rt.config.agent_entry(agent_id)
            if entry is not None and entry.kind == "anthropic" and not rt.config.model.resolved_api_key():
                raise NotGraded(
                    f"judge agent '{agent_id}' needs an API key and none is configured "
                    "(set [model] api_key or ANTHROPIC_API_KEY)"
                )
            agent = await asyncio.to_thread(
                rt.provider.deploy_agent, agent_id, agent_name=f"judge-{self.id}", ttl_seconds=int(self.judge_timeout_seconds) + 60,
            )

            async def stop() -> None:
                await asyncio.to_thread(rt.provider.terminate, agent.instance_id)

            return self._agent_asker(rt, agent.a2a_url), {"a2a_agent_id": agent_id, "model": model}, stop
        try:
            judge = rt.judge(model)
        except JudgeUnavailable as exc:
            raise NotGraded(str(exc)) from None

        async def ask(text: str) -> Any:
            return await judge.verdict(text, VERDICT_SCHEMA)

        return ask, {"model": judge.model}, nothing

    def _agent_asker(self, rt, url):
        async def ask(text: str) -> Any:
            reply = await rt.a2a.send_and_wait(url, text, timeout_seconds=self.judge_timeout_seconds)
            if reply.state != "completed":
                raise RuntimeError(f"Judge A2A task failed (task_id={reply.task_id}): {reply.text}")
            return _parse_verdict_text(reply.text)

        return ask

    def _rows(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        by_key = {item["id"]: item for item in items}
        rows = []
        for i, criterion in enumerate(self.criteria, start=1):
            item = by_key[f"c{i}"]
            score = float(item.get("score", 0))
            row = {**criterion, "justification": item.get("justification", "")}
            if self.output_format == "rubric_binary":
                row.update(score=1.0 if score == 1.0 else 0.0, result=score == 1.0)
            else:
                score = min(1.0, max(0.0, score))
                row.update(score=score, result=score >= float(criterion.get("pass_threshold", 0.5)))
            rows.append(row)
        return rows

    def _trajectory(self, rt: StepRuntime, response: PromptResponse) -> str | None:
        if not self.use_trajectory:
            return None
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


def _results_of(verdict: Any) -> list[dict[str, Any]]:
    if isinstance(verdict, dict):
        verdict = verdict.get("results")
    return [item for item in verdict or [] if isinstance(item, dict)]


def _parse_verdict_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return parse_structured_output(text)


def _id_problem(items: list[dict[str, Any]], keys: list[str]) -> str | None:
    ids = [item.get("id") for item in items]
    missing = sorted(set(keys) - set(ids))
    unknown = sorted({i for i in ids if i not in keys}, key=str)
    duplicates = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if not (missing or unknown or duplicates) and len(ids) == len(keys):
        return None
    return "; ".join(
        f"{label}: {values}" for label, values in
        (("missing ids", missing), ("unknown ids", unknown), ("duplicate ids", duplicates)) if values
    ) or f"{len(ids)} results for {len(keys)} criteria"
