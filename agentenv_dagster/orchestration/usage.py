"""Tokens and cost behind a verification, as metadata on its asset: the agent's, a simulated user's and the
judge's, priced by ``[model] prices`` where it knows the model (unpriced shows tokens and no cost: not free)."""

from __future__ import annotations

from typing import Any

import dagster as dg

from ..context import TaskStepContext
from ..reports.evaluation import priced_usage
from ..reports.telemetry import TokenUsage


def usage_metadata(ctx: TaskStepContext, entry: dict[str, Any], prices: dict[str, dict[str, float]],
                   prompt_id: str | None = None) -> dict[str, Any]:
    """One verification's buckets: the turns of the prompt it grades (None: every prompt) and its judge."""
    buckets = {"agent": TokenUsage(), "user": TokenUsage(), "judge": TokenUsage()}
    for response in [r for r in ctx.prompt_responses if prompt_id in (None, r.prompt_id)]:
        extra = response.model_extra or {}
        buckets["agent"] += priced_usage(extra.get("usage"), prices.get(response.model or "")) or TokenUsage()
        buckets["user"] += priced_usage(extra.get("user_usage"), None) or TokenUsage()
    for row in entry.get("results") or []:
        if isinstance(row.get("token_usage"), dict):  # Coder Eval judges price their own calls
            buckets["judge"] += TokenUsage.model_validate(row["token_usage"])
    judge = entry.get("judge") or {}
    if isinstance(judge.get("usage"), dict):  # a rubric's LLM judge
        buckets["judge"] += priced_usage(judge["usage"], prices.get(judge.get("model") or "")) or TokenUsage()
    metadata: dict[str, Any] = {}
    for name, usage in buckets.items():
        if usage.total_tokens:
            metadata[f"{name}_input_tokens"] = dg.MetadataValue.int(usage.input_tokens)
            metadata[f"{name}_output_tokens"] = dg.MetadataValue.int(usage.output_tokens)
            if usage.total_cost_usd is not None:
                metadata[f"{name}_cost_usd"] = dg.MetadataValue.float(round(usage.total_cost_usd, 6))
    return metadata
