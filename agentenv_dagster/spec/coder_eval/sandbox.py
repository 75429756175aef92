"""The ``sandbox:`` block: where the agent runs and what is in it.

``driver: tempdir`` is a plain host temp dir (only ``limits.timeout`` binds there);
``driver: docker`` is one container per task, with the ``docker:`` knobs and the other
limits mapped to docker flags. Paths the sandbox writes stay inside it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, ValidationInfo, field_validator, model_validator

from ...errors import SpecError
from ...redaction import is_secret_name
from .base import Strict, inside_sandbox
from .ignore import normalize_ignore_pattern
from .merge import APPEND
from .templates import TemplateSources, check_template_sources

DEFAULT_DOCKER_IMAGE = "coder-eval-agent:latest"

# Host variables forwarded into a container by default: model-API and UiPath credentials and
# routing, and HOME (keeps ~/.claude resolving as on the host).
DEFAULT_ENV_PASSTHROUGH = (
    "ANTHROPIC_API_KEY", "API_BACKEND", "UIPATH_LLM_BACKEND", "UIPATH_ACCESS_TOKEN", "UIPATH_URL",
    "UIPATH_TENANT_ID", "UIPATH_ORGANIZATION_ID", "UIPATH_CLI_DISABLE_VERSION_SYNC",
    "AWS_BEARER_TOKEN_BEDROCK", "AWS_REGION", "BEDROCK_MODEL", "CLAUDE_CODE_USE_BEDROCK",
    "ANTHROPIC_MODEL", "LITELLM_BASE_URL", "LITELLM_AUTH_TOKEN", "LITELLM_MODEL",
    "LITELLM_SMALL_MODEL", "LITELLM_COST_LOG", "CODEX_API_KEY", "CODEX_BASE_URL", "CODEX_MODEL",
    "GEMINI_API_KEY", "ANTIGRAVITY_MODEL", "HOME",
)

# Container paths the framework mounts; a task's working_dir may not land on them.
RESERVED_CONTAINER_DIRS = frozenset({
    "/", "/work", "/work/input", "/work/output", "/work/task_dir", "/work/references",
})

RECORDED_TOOL_NAME = re.compile(r"[A-Za-z0-9._+-]+")
# Shimming these would break the shell, the interpreters or git the harness itself relies on.
RESERVED_TOOL_NAMES = frozenset({
    "python", "python3", "py", "env", "sh", "bash", "zsh", "cmd", "node", "uv", "git",
})
RECORDED_CALLS_LOG = "calls.jsonl"


class ResourceLimits(Strict):
    # seconds a sandbox command may take
    timeout: int = 300
    # docker: the container's memory limit
    max_memory_mb: int | None = None
    # docker: the container's CPU limit
    max_cpus: float | None = Field(default=None, gt=0)
    # docker: the container's process limit
    max_pids: int | None = Field(default=None, gt=0)
    # reserved (not enforced)
    max_disk_mb: int | None = None


class PythonEnvConfig(Strict):
    # pip packages installed into the sandbox's virtualenv
    env_packages: list[str] = Field(default_factory=list)


class NodeEnvConfig(Strict):
    # npm packages installed into the sandbox
    env_packages: list[str] = Field(default_factory=list)


class DockerBuildConfig(Strict):
    """``docker build`` options, used when ``dockerfile_path`` is set."""

    buildkit: bool | None = None
    args: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)
    extra_args: list[str] = Field(default_factory=list)


class DockerDriverConfig(Strict):
    # the container image (build it locally: `scripts/docker_engine.sh image`)
    image: str = DEFAULT_DOCKER_IMAGE
    # a Dockerfile to build the image from, relative to the task YAML
    dockerfile_path: str | None = None
    # how the Dockerfile is built
    build: DockerBuildConfig = Field(default_factory=DockerBuildConfig)
    # the container's network: `bridge`, `none`, or model APIs only
    network: Literal["bridge", "none", "llm_only"] = "bridge"
    # where the sandbox folder is mounted in the container (`auto`: the image's)
    working_dir: str | None = None
    # host variables passed into the container
    env_passthrough: list[str] = Field(default_factory=lambda: list(DEFAULT_ENV_PASSTHROUGH))
    # more host variables passed in (added across experiment layers)
    env_passthrough_extra: Annotated[list[str], APPEND] = Field(default_factory=list)
    # more `host:container` mounts
    extra_mounts: list[str] = Field(default_factory=list)

    def passthrough_names(self) -> list[str]:
        """The host variables the task's commands and agent tools see: the task's own
        ``env_passthrough`` list and ``env_passthrough_extra`` as written; of the default list,
        only what is not a credential (a key, token or secret), which a task must name itself."""
        names = self.env_passthrough
        if list(names) == list(DEFAULT_ENV_PASSTHROUGH):
            names = [name for name in names if not is_secret_name(name)]
        return list(dict.fromkeys([*names, *self.env_passthrough_extra]))

    @field_validator("working_dir")
    @classmethod
    def _not_a_framework_path(cls, value: str | None) -> str | None:
        if value is None or value == "auto":
            return value
        if not value.startswith("/"):
            raise ValueError(f"working_dir {value!r} must be an absolute path or the sentinel 'auto'.")
        normalized = value.rstrip("/") or "/"
        if normalized in RESERVED_CONTAINER_DIRS or normalized.startswith("/work/"):
            raise ValueError(
                f"working_dir {value!r} collides with a framework-reserved container path "
                "(/, /work, /work/*). Choose the task image's own WORKDIR (e.g. /root, /app)."
            )
        return value


class RecordedCliResponse(Strict):
    """A canned answer for invocations matching ``when`` (an argv pattern); first match wins."""

    when: dict[str, Any] = Field(min_length=1)
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""


class RecordedCli(Strict):
    """A shimmed executable that logs its calls to ``cli_mocks/calls.jsonl`` and answers from
    ``responses`` (falling back to its own fields)."""

    # the executable to shim (a bare name)
    tool: str
    # the exit code when no response matches
    exit_code: int = 1
    # the output when no response matches
    stdout: str = ""
    # the error output when no response matches
    stderr: str = ""
    # answers by argv pattern; the first match wins
    responses: list[RecordedCliResponse] = Field(default_factory=list)

    @field_validator("tool")
    @classmethod
    def _bare_unreserved_name(cls, value: str) -> str:
        if not RECORDED_TOOL_NAME.fullmatch(value):
            raise ValueError(f"tool {value!r} must be a bare executable name matching [A-Za-z0-9._+-]+")
        if value in RESERVED_TOOL_NAMES:
            raise ValueError(f"tool {value!r} is reserved: the sandbox itself runs it ({sorted(RESERVED_TOOL_NAMES)})")
        if value == RECORDED_CALLS_LOG or value.lower().endswith((".cmd", ".bat")):
            raise ValueError(f"tool {value!r} would collide with the shim's own files ({RECORDED_CALLS_LOG}, *.cmd, *.bat)")
        return value


class SandboxConfig(Strict):
    # `tempdir` (a folder on the host) or `docker` (a container per task)
    driver: Literal["tempdir", "docker"] = "tempdir"
    # the container's settings (with `driver: docker`)
    docker: DockerDriverConfig = Field(default_factory=DockerDriverConfig)
    # a Python virtualenv in the sandbox (`null`: none)
    python: PythonEnvConfig | None = Field(default_factory=PythonEnvConfig)
    # npm packages in the sandbox
    node: NodeEnvConfig | None = None
    # time, memory, CPU and process limits
    limits: ResourceLimits = Field(default_factory=ResourceLimits)
    # what the workspace starts with: template folders, starter files, a repo
    template_sources: Annotated[TemplateSources, APPEND] = None
    # sandbox folders put first on the agent's PATH (their files made executable)
    mock_path_dirs: list[str] | None = None
    # executables replaced by recording shims (what `cli_called` grades)
    record_cli: list[RecordedCli] | None = None
    # more patterns left out when copying templates (`!name` keeps a default-ignored one)
    ignore_patterns: list[str] = Field(
        default_factory=list, validation_alias=AliasChoices("ignore_patterns", "additional_ignore_patterns")
    )

    @field_validator("mock_path_dirs")
    @classmethod
    def _mock_dirs_inside_sandbox(cls, values: list[str] | None) -> list[str] | None:
        for index, value in enumerate(values or []):
            try:
                inside_sandbox("mock_path_dirs entry", value)
            except ValueError as exc:
                raise SpecError(str(exc), field=str(index)) from None
        return values

    @field_validator("ignore_patterns")
    @classmethod
    def _normalize_ignore_patterns(cls, values: list[str]) -> list[str]:
        return [normalize_ignore_pattern(value) for value in values]

    @model_validator(mode="after")
    def _template_sources(self, info: ValidationInfo) -> "SandboxConfig":
        if self.template_sources:
            check_template_sources(self.template_sources, info)
        return self
