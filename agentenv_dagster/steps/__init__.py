"""Built-in step types; importing this package registers them in ``BUILTIN_STEPS``."""

from . import aggregate, coder, collect, conformance_agent, conformance_env, deploy, load, prompt, reset, rubrics, run_code, sandbox, snapshot, teardown, verifiers  # noqa: F401
from .registry import BUILTIN_STEPS, StepRegistry, step

__all__ = ["BUILTIN_STEPS", "StepRegistry", "step"]
