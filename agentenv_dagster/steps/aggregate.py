"""aggregate_verifiers: one score over the rows of several verifications.

When one task's criteria are split across verifier steps (files in verify_sandbox, the reply
in a rubric), this scores their union once, with the same aggregators as the verifiers.
"""

from __future__ import annotations

from typing import Any

from ..context import TaskStepContext
from ..runtime.base import StepRuntime
from .base import VERIFICATION
from .registry import step
from .scoring import ScoreAggregator, aggregate
from .verifiers import _Verifier


@step("aggregate_verifiers")
class AggregateVerifiersStep(_Verifier):
    """Reading the verifications by id makes the named verifiers' steps its dependencies,
    checked before the run and drawn as asset lineage."""

    reads = {"verifier_ids": VERIFICATION}

    verifier_ids: list[str] = []
    score_aggregator: ScoreAggregator = "weighted_average"

    async def execute(self, ctx: TaskStepContext, rt: StepRuntime) -> None:
        verifications = ctx.metadata.get("verifications") or {}
        missing = [vid for vid in self.verifier_ids if vid not in verifications]
        if missing:
            raise RuntimeError(
                f"AggregateVerifiers: verifier_id(s) not found in context.metadata.verifications: "
                f"{missing}. Available: {list(verifications)}"
            )
        entry: dict[str, Any] = {"source_verifier_ids": list(self.verifier_ids)}
        ungraded = [vid for vid in self.verifier_ids if verifications[vid].get("graded") is False]
        if ungraded:
            # A source with no verdict (no judge reachable) has no rows: scoring the others
            # alone would pass a task on part of its criteria.
            reason = f"source verification(s) not graded: {ungraded}"
            ctx.metadata_map("verifications")[self.verifier_key] = {
                "score": None, "graded": False, "reason": reason, **entry,
            }
            rt.log.warning("verifier '%s' not graded: %s", self.verifier_key, reason)
            return
        rows = [row for vid in self.verifier_ids for row in verifications[vid].get("results") or []]
        counted = [row for row in rows if not row.get("skipped")]
        score = aggregate(counted, self.score_aggregator)
        ctx.metadata_map("verifications")[self.verifier_key] = {"score": score, **entry}
        rt.log.info(
            "AggregateVerifiers '%s': merged %d verifier(s), %d/%d criteria evaluated, score=%s",
            self.verifier_key, len(self.verifier_ids), len(counted), len(rows), score,
        )
