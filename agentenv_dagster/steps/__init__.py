"""Built-in step types; importing this package registers them in ``BUILTIN_STEPS``."""

from . import aggregate, clock, coder, collect, conformance_agent, conformance_env, containers, deploy, load, prompt, reset, review, rubrics, run_code, sandbox, snapshot, teardown, triggers, verifiers  # noqa: F401
from .registry import BUILTIN_STEPS, StepRegistry, step

__all__ = ["BUILTIN_STEPS", "StepRegistry", "step"]
