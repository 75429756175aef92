"""Built-in step types; importing this package registers them in ``BUILTIN_STEPS``."""

from . import coder, collect, deploy, load, prompt, rubrics, sandbox, snapshot, teardown, verifiers  # noqa: F401
from .registry import BUILTIN_STEPS, StepRegistry, step

__all__ = ["BUILTIN_STEPS", "StepRegistry", "step"]
