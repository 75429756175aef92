"""Coder Eval task YAML (UiPath/coder_eval) as typed models, so the compiler can turn a
task or an experiment into a job the same way it does an agent-env JSON task.

Load with :func:`load_coder_eval_task` / :func:`load_coder_eval_experiment`; tell the two
document families apart by content with :func:`is_coder_eval_document`; apply CLI ``-D``
overrides with :func:`apply_overrides`.
"""

from .agents import (
    AGENT_KINDS,
    AgentConfig,
    AnthropicAgentConfig,
    ClaudeCodeAgentConfig,
    CodingAgentConfig,
    ReplayAgentConfig,
    ReplayEpisode,
    parse_agent_config,
)
from .base import CoderEvalWarning
from .dataset import Dataset, check_row_ids, load_dataset_rows
from .experiment import ExperimentDefaults, ExperimentDefinition, ExperimentVariant
from .ignore import DEFAULT_IGNORE_PATTERNS, effective_ignore_patterns
from .limits import RunLimits
from .loader import (
    LoadedCoderEvalTask,
    LoadedExperiment,
    coder_eval_kind,
    is_coder_eval_document,
    load_coder_eval_experiment,
    load_coder_eval_task,
)
from .overrides import OverrideError, apply_overrides, parse_override
from .sandbox import DockerDriverConfig, RecordedCli, SandboxConfig
from .task import PostRunCommand, PreRunCommand, ReferenceSource, SimulationConfig, TaskDefinition
from .templates import RepoSource, StarterFilesSource, TemplateDirSource

__all__ = [
    "AGENT_KINDS", "AgentConfig", "AnthropicAgentConfig", "ClaudeCodeAgentConfig", "CodingAgentConfig",
    "CoderEvalWarning", "DEFAULT_IGNORE_PATTERNS", "Dataset", "DockerDriverConfig", "ExperimentDefaults",
    "ExperimentDefinition", "ExperimentVariant", "LoadedCoderEvalTask", "LoadedExperiment", "OverrideError",
    "PostRunCommand", "PreRunCommand", "RecordedCli", "ReferenceSource", "RepoSource", "ReplayAgentConfig",
    "ReplayEpisode", "RunLimits", "SandboxConfig", "SimulationConfig", "StarterFilesSource", "TaskDefinition",
    "TemplateDirSource", "apply_overrides", "check_row_ids", "coder_eval_kind", "effective_ignore_patterns", "is_coder_eval_document",
    "load_coder_eval_experiment", "load_coder_eval_task", "load_dataset_rows", "parse_agent_config",
    "parse_override",
]
