"""``.agentenv/config.toml``: model, registries of envs and agents, stores, custom steps.

Found by walking up from the working directory (or ``AGENT_ENV_CONFIG``); every setting has
a working local default, so a fresh checkout runs offline with no file at all. Secrets are
references (``env:NAME``) resolved when used, never stored in a context.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .redaction import remember_secret

CONFIG_RELPATH = Path(".agentenv") / "config.toml"
DEFAULT_JUDGE_MODEL = "claude-sonnet-4-6"


class ConfigError(ValueError):
    pass


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderConfig(_Section):
    """Where the models of one provider are served and how they are spoken to:
    ``protocol = "anthropic"`` (the Messages API) or ``"openai"`` (Chat Completions: OpenAI,
    a LiteLLM proxy, vLLM, Ollama ...). ``verdict`` is how a judge is made to answer in its
    schema: a forced tool call, or a JSON-schema response format for servers whose models
    cannot be forced to call a tool."""

    # how the provider is spoken to: the Messages API, or Chat Completions
    protocol: Literal["anthropic", "openai"] = "openai"
    # the API endpoint (`env:NAME` reads a variable); unset: the provider's default
    base_url: str | None = None
    # the key, as a reference (`env:NAME`), read when a model is called
    api_key: str | None = None
    # how a judge is made to answer in its schema: a forced tool call, or a JSON-schema response
    # format
    verdict: Literal["tool", "json_schema"] = "tool"
    # the request field that caps a reply's tokens (OpenAI's newer models want
    # `max_completion_tokens`)
    max_tokens_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"

    def resolved_base_url(self) -> str | None:
        """The URL (references read); Anthropic's falls back to ``ANTHROPIC_BASE_URL``."""
        url = resolve_reference(self.base_url)
        if not url and self.protocol == "anthropic":
            url = os.environ.get("ANTHROPIC_BASE_URL")
        return url or None


# the built-in providers; ``[model.providers.<name>]`` overrides their fields or adds others
BUILTIN_PROVIDERS = {
    "anthropic": ProviderConfig(protocol="anthropic"),  # base_url and api_key: [model]'s own
    "openai": ProviderConfig(api_key="env:OPENAI_API_KEY", base_url="env:OPENAI_BASE_URL",
                             max_tokens_param="max_completion_tokens"),
    # agent-env's judges reach every model through LiteLLM: its proxy, or any server like it
    "openai-compatible": ProviderConfig(api_key="env:LITELLM_API_KEY", base_url="env:LITELLM_BASE_URL"),
}


def model_key_env(provider: str) -> str:
    """The variable a tool-use agent's host reads its provider's key from (never argv or a file)."""
    return {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}.get(
        provider, "AGENTENV_" + re.sub(r"[^A-Za-z0-9]", "_", provider).upper() + "_API_KEY")


class ResolvedModel(BaseModel):
    """One model: ``provider/name`` read against the providers (a bare name is Anthropic's)."""

    model_config = ConfigDict(frozen=True)

    ref: str           # as configured: what usage, reports and prices name it by
    provider: str
    name: str          # what the API is asked for
    settings: ProviderConfig

    @property
    def protocol(self) -> str:
        return self.settings.protocol

    def api_key(self) -> str | None:
        return resolve_reference(self.settings.api_key)

    def base_url(self) -> str | None:
        return self.settings.resolved_base_url()

    def missing_setting(self, api_key: str | None = None, base_url: str | None = None) -> str | None:
        """What must be set before this model can be called (``api_key``/``base_url``: given
        instead of the provider's), or None. Anthropic and OpenAI need a key; a server of
        another provider may need none, but needs its URL."""
        if self.provider == "anthropic" or self.provider == "openai":
            if not (api_key or self.api_key()):
                return self._where("api_key")
        elif self.protocol == "openai" and not (base_url or self.base_url()):
            return self._where("base_url")
        return None

    def _where(self, setting: str) -> str:
        section = "[model]" if self.provider == "anthropic" else f"[model.providers.{self.provider}]"
        builtin = BUILTIN_PROVIDERS.get(self.provider)
        reference = (getattr(builtin, setting) if builtin else getattr(self.settings, setting)) or ""
        if self.provider == "anthropic":
            reference = "env:ANTHROPIC_API_KEY"
        variable = reference[4:].partition("?")[0] if reference.startswith("env:") else ""
        return f"set {section} {setting} in .agentenv/config.toml" + (f" or {variable}" if variable else "")


def token_cost(price: dict[str, float] | None, *, uncached: int, output: int, cache_write: int = 0,
               cache_read: int = 0) -> float | None:
    """USD for one usage at ``price`` (a model's ``[model] prices`` entry; None: the cost is
    unknown). Every caller prices alike: cached prompt tokens at the price given for them, else at
    the input price, so a cost is never below what was spent.

    ```python
    token_cost({"input": 3.0, "output": 15.0, "cache_read": 0.3}, uncached=1000, output=100, cache_read=5000)
    # 0.0045
    ```
    """
    if not price:
        return None
    given = price.get("input", 0.0)
    return (uncached * given + output * price.get("output", 0.0) + cache_write * price.get("cache_write", given)
            + cache_read * price.get("cache_read", given)) / 1_000_000


class ModelConfig(_Section):
    """Models are named ``provider/model`` (``anthropic/claude-sonnet-4-6``, ``openai/gpt-4.1``,
    ``openai-compatible/llama3``); a bare name is an Anthropic model. ``base_url`` and
    ``api_key`` here are the ``anthropic`` provider's."""

    # the Anthropic API endpoint (any Messages-API compatible server); unset: `ANTHROPIC_BASE_URL`
    # or Anthropic's
    base_url: str | None = None
    # the Anthropic key, as a reference; with none, rubrics are recorded as not graded
    api_key: str | None = "env:ANTHROPIC_API_KEY"
    # the model of every role that `roles` does not name (`provider/model`, or a bare Anthropic
    # name)
    default: str = DEFAULT_JUDGE_MODEL
    # reserved for request parameters of every model call; no model call reads it yet
    params: dict[str, Any] = Field(default_factory=dict)
    # a model per role: `judge` (rubrics, LLM judges) and `agent` (the tool-use agent)
    roles: dict[str, str] = Field(default_factory=dict)
    # providers by name: the built-in `anthropic`, `openai`, `openai-compatible` with fields
    # changed, or new ones
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    # USD per million tokens, {"<model>": {"input": 3.0, "output": 15.0}}: what turns usage
    # into cost (run_limits.max_usd). No price, no cost: the cap is skipped, as upstream. A
    # model is found under its ``provider/model`` name or, for Anthropic's, its bare name too.
    # Cached prompt tokens bill at ``cache_read`` / ``cache_write`` when given, else at ``input``.
    prices: dict[str, dict[Literal["input", "output", "cache_read", "cache_write"], float]] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _models_and_prices(self) -> "ModelConfig":
        for name, provider in self.providers.items():
            if "/" in name:
                raise ValueError(f"providers.{name}: a provider name has no '/'")
            if name not in BUILTIN_PROVIDERS and provider.protocol == "openai" and not provider.base_url:
                raise ValueError(f"providers.{name}: an OpenAI-compatible provider needs a base_url")
        for model in [self.default, *self.roles.values()]:
            self.resolve(model)
        aliases: dict[str, dict[str, float]] = {}
        for model, price in self.prices.items():
            resolved = self.resolve(model, where="prices")
            aliases.update({f"{resolved.provider}/{resolved.name}": price} if resolved.provider != "anthropic"
                           else {f"anthropic/{resolved.name}": price, resolved.name: price})
        self.prices.update({k: v for k, v in aliases.items() if k not in self.prices})
        return self

    def for_role(self, role: str) -> str:
        return self.roles.get(role) or self.default

    def provider(self, name: str) -> ProviderConfig | None:
        """A provider's settings: the built-in ones with the file's fields on top."""
        base = BUILTIN_PROVIDERS.get(name)
        if name == "anthropic":
            base = ProviderConfig(protocol="anthropic", base_url=self.base_url, api_key=self.api_key)
        own = self.providers.get(name)
        if own is None:
            return base
        if base is None:
            return own
        return base.model_copy(update=own.model_dump(exclude_unset=True))

    def resolve(self, model: str, *, where: str = "model") -> ResolvedModel:
        """``provider/model`` read against the providers; a bare name is an Anthropic model.
        ValueError names the unknown provider and the known ones."""
        provider, slash, name = model.partition("/")
        if not slash:
            provider, name = "anthropic", model
        settings = self.provider(provider)
        if settings is None:
            known = sorted({*BUILTIN_PROVIDERS, *self.providers})
            raise ValueError(f"{where} '{model}': unknown provider '{provider}' (known providers: {known}; "
                             "a bare model name is an Anthropic model)")
        if not name:
            raise ValueError(f"{where} '{model}': no model name after the provider")
        return ResolvedModel(ref=model, provider=provider, name=name, settings=settings)

    def resolved_api_key(self) -> str | None:
        """The key (an ``env:`` reference read now); remembered as a secret, so no record of
        the run carries it (``redaction.py``)."""
        key = resolve_reference(self.api_key)
        remember_secret(key)
        return key

    def resolved_base_url(self) -> str | None:
        return resolve_reference(self.base_url) or os.environ.get("ANTHROPIC_BASE_URL") or None


class EnvEntry(_Section):
    """A registered env: a built-in kind served locally, or a live endpoint (``mcp_url``)."""

    # a built-in env kind served locally (`email`, `item-store`)
    kind: str | None = None
    # the env version a deploy asks for
    version: str = "1"
    # a live env's MCP endpoint, instead of a local kind
    mcp_url: str | None = None


CODING_CLI_KINDS = ("claude-code", "codex")


class AgentEntry(_Section):
    """A registered agent. ``claude-code`` and ``codex`` are the real coding agents (their
    CLIs in the sandbox folder); the permission/tool fields are theirs (Coder Eval ``agent:``)."""

    # `replay` (scripted, offline), `anthropic` (a tool-use loop on a model), or a real coding CLI
    kind: Literal["replay", "anthropic", "claude-code", "codex"]
    script: str | None = None          # replay: a JSON file of episodes (relative to the config root)
    episodes: list[dict[str, Any]] | None = None  # replay: inline episodes
    # replay: how long each answer waits (to simulate a slow agent)
    delay_seconds: float = 0.0
    # the model (`provider/model`); unset: `[model]`'s for the `agent` role
    model: str | None = None
    max_turns: int = 20                # claude-code/codex: only when set (else the CLI's own default)
    # the agent card's description
    description: str | None = None
    path_prepend: list[str] = Field(default_factory=list)  # workspace folders put first on the agent's PATH
    # claude-code: the permission mode of its tool calls
    permission_mode: Literal["default", "acceptEdits", "plan", "bypassPermissions"] = "acceptEdits"
    # claude-code/codex: the only tools the agent may use
    allowed_tools: list[str] | None = None
    # claude-code/codex: tools the agent may not use
    disallowed_tools: list[str] | None = None
    sdk_options: dict[str, Any] = Field(default_factory=dict)  # claude-code: more ClaudeAgentOptions fields
    system_prompt_mode: Literal["append", "replace"] = "append"  # claude-code: on the claude_code preset, or instead
    setting_sources: list[Literal["user", "project", "local"]] | None = None  # claude-code; default ["project"]
    settings: str | None = None        # claude-code: a settings file path or JSON text
    plugins: list[dict[str, str]] | None = None  # claude-code: [{type: "local", path}]
    cli_path: str | None = None        # claude-code/codex: the CLI to run instead of the one found


class AgentsConfig(_Section):
    # the agent a `deploy_agent` step without `a2a_agent_id` deploys
    default_a2a_agent_id: str = "a2a-default"
    # the judge agent of a rubric that names none (`judge_a2a_agent_id` of `rubrics_verifier`)
    judge_a2a_agent_id: str = "a2a-default"
    # agents by id (`[agents.registry.<id>]`): what `a2a_agent_id` and Coder Eval agents resolve to
    registry: dict[str, AgentEntry] = Field(default_factory=dict)


class EnvsConfig(_Section):
    # envs by id (`[envs.registry.<id>]`): what `deploy_env`'s `env_id` resolves to
    registry: dict[str, EnvEntry] = Field(default_factory=dict)


class StoresConfig(_Section):
    """Where runs keep artifacts, objects (trajectories) and the contexts between ops:
    the state folder (the default), or an S3 bucket (``backend = "s3"``) that every worker of
    a distributed deployment reaches. ``bucket``, ``prefix`` and ``endpoint_url`` (moto,
    MinIO) may be ``env:NAME`` references; credentials come from boto3's usual chain."""

    # runs' ledgers and streams, artifact versions, objects and stored task versions (relative to
    # the project root)
    state_dir: str = ".agentenv/state"
    # read-only folders of bundled artifacts (version 1 of each), searched in order
    artifact_dirs: list[str] = Field(default_factory=lambda: ["artifacts"])
    # where artifacts, objects and the contexts between ops live: the state folder, or S3
    backend: Literal["filesystem", "s3"] = "filesystem"
    # s3: the bucket (a reference like `env:AGENTENV_S3_BUCKET` is fine)
    bucket: str | None = None
    # s3: the key prefix of everything this project writes
    prefix: str = "agentenv"
    # s3: a non-AWS endpoint (moto, MinIO)
    endpoint_url: str | None = None
    # s3: the bucket's region; unset: boto3's default
    region: str | None = None
    # run folders (sandboxes, contexts, server logs) older than this many days are removed
    # when a later run or the code location starts; 0 keeps them all
    keep_runs_days: float = Field(default=30, ge=0)

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> "StoresConfig":
        if self.backend == "s3" and not self.bucket:
            raise ValueError('backend = "s3" needs a bucket')
        return self


EXECUTORS = ("agentenv", "in_process", "multiprocess", "celery", "k8s")


class CeleryConfig(_Section):
    """The Celery executor's broker and result backend (``env:NAME?default`` references)."""

    # the Celery broker URL (Redis)
    broker: str = "env:AGENTENV_CELERY_BROKER?redis://127.0.0.1:6379/0"
    # the Celery result backend URL
    backend: str = "env:AGENTENV_CELERY_BACKEND?redis://127.0.0.1:6379/1"
    include: list[str] = Field(default_factory=list)  # modules every worker imports


class DagsterConfig(_Section):
    """How jobs execute. Unset: ``agentenv`` (a run's ops side by side in threads of its
    process, rows pipelined), or ``in_process`` for a task whose steps form a chain. Or one for
    every job: ``agentenv``, ``in_process``, ``multiprocess`` (Dagster's: a process per step),
    ``celery`` (``dagster_celery.celery_executor``: steps run on Celery workers) or ``k8s``
    (``dagster_k8s.k8s_job_executor``: a Kubernetes Job per step, ``[dagster.k8s]`` is its
    config). The ``AGENTENV_DAGSTER_EXECUTOR`` environment variable overrides ``executor``."""

    # the executor of every job; unset: `agentenv`, or `in_process` for a chain-shaped task without
    # rows
    executor: Literal["agentenv", "in_process", "multiprocess", "celery", "k8s"] | None = None
    # the Celery executor's settings (`[dagster.celery]`)
    celery: CeleryConfig = Field(default_factory=CeleryConfig)
    k8s: dict[str, Any] = Field(default_factory=dict)  # job_namespace, job_image, env_secrets, ...

    def chosen_executor(self) -> str | None:
        chosen = os.environ.get("AGENTENV_DAGSTER_EXECUTOR") or self.executor
        if chosen is not None and chosen not in EXECUTORS:
            raise ConfigError(f"AGENTENV_DAGSTER_EXECUTOR='{chosen}': expected one of {', '.join(EXECUTORS)}")
        return chosen


class TaskStepsConfig(_Section):
    """Custom step types, beside the built-in ones."""

    # ``module.path:ClassName`` of each custom step type (a ``TaskStep`` subclass with its own
    # ``type_name``), importable from the project root.
    impls: list[str] = Field(default_factory=list)


class CriteriaConfig(_Section):
    """Custom Coder Eval criterion types, beside the built-in ones."""

    # Modules to import before tasks are read, each registering its criteria with
    # ``@criterion("<type>")``; importable from the project root.
    modules: list[str] = Field(default_factory=list)


CRON_ALIASES = ("@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@annually", "@midnight")
_CRON_FIELD = re.compile(r"^[0-9A-Za-z*/,?-]+$")


class ScheduleEntry(_Section):
    """A task's cron schedule (``[schedules]``): ``task_id = "0 6 * * *"``, or a table
    ``{cron, timezone, default_status}``. Schedules start stopped unless said otherwise."""

    # five cron fields (`0 6 * * 1-5`) or an alias (`@daily`)
    cron: str
    # the timezone the cron is read in
    timezone: str = "UTC"
    # whether the schedule starts running when the code location loads
    default_status: Literal["running", "stopped"] = "stopped"

    @field_validator("cron")
    @classmethod
    def _looks_like_cron(cls, cron: str) -> str:
        # The shape only (Dagster checks the values when it builds the schedule): five
        # fields, or one of the @ aliases.
        fields = cron.split()
        if cron.strip() in CRON_ALIASES or (len(fields) == 5 and all(_CRON_FIELD.match(f) for f in fields)):
            return cron.strip()
        raise ValueError(f"'{cron}' is not a cron schedule (five fields like '0 6 * * *', or {', '.join(CRON_ALIASES)})")


def _cron_string_to_entry(value: Any) -> Any:
    return {"cron": value} if isinstance(value, str) else value


BUILTIN_ENVS = {"email": EnvEntry(kind="email"), "item-store": EnvEntry(kind="item-store")}
BUILTIN_AGENTS = {
    "replay": AgentEntry(kind="replay"),
    "anthropic": AgentEntry(kind="anthropic"),
    "a2a-default": AgentEntry(kind="anthropic"),
    "claude-code": AgentEntry(kind="claude-code"),
    "codex": AgentEntry(kind="codex"),
}


class RegressionSettings(_Section):
    """The regression gate of a task's scores: each new score is compared with the median of
    the scores before it (of the same row, for a dataset) by the blocking-capable asset check
    ``no_regression``; ``agentenv-dagster run --fail-on-regression`` exits 1 when it fails."""

    # check each new score against the earlier ones (`false`: no `no_regression` check)
    enabled: bool = True
    # how many of the latest earlier scores the baseline is the median of
    window: int = Field(default=5, ge=1)
    # the largest drop below the baseline that still passes (scores run from 0 to 1)
    max_drop: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    # with fewer earlier scores than this the check passes, saying there is no baseline yet
    min_history: int = Field(default=1, ge=1)
    # compare only with scores of the same code version, so a changed task, agent, model or
    # judge starts a new baseline; `false` (the default) compares across them, which is how a
    # change that costs score shows up
    same_code_version: bool = False
    # a Dagster blocking check: a regression fails the step that graded it, so the run fails
    # (the CLI exits 1 whatever `--fail-on-regression` says) and Dagster's one-step-at-a-time
    # executors skip the steps after it
    blocking: bool = False


class RegressionConfig(RegressionSettings):
    # task id -> settings of its own (only the fields it sets replace the ones above):
    # `[regression.tasks."triage-tickets"]` with `max_drop = 0.2`
    tasks: dict[str, RegressionSettings] = Field(default_factory=dict)

    def for_task(self, task_id: str) -> RegressionSettings:
        """The settings of one task: its own fields over the project's."""
        base = RegressionSettings(**self.model_dump(exclude={"tasks"}))
        own = self.tasks.get(task_id)
        return base.model_copy(update=own.model_dump(exclude_unset=True)) if own is not None else base


class ConversationsConfig(_Section):
    # where a conversation's user is when no user agent is deployed and no user_a2a_url set
    default_human_a2a_url: str | None = "env:AGENT_ENV_HUMAN_A2A_URL"

    def human_a2a_url(self) -> str | None:
        return resolve_reference(self.default_human_a2a_url)


class AgentEnvConfig(_Section):
    # models for judges, the tool-use agent and simulated users (`[model]`)
    model: ModelConfig = Field(default_factory=ModelConfig)
    # where a conversation's user is (`[conversations]`)
    conversations: ConversationsConfig = Field(default_factory=ConversationsConfig)
    # the agent registry and defaults (`[agents]`)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)
    # the env registry (`[envs]`)
    envs: EnvsConfig = Field(default_factory=EnvsConfig)
    # where runs keep their state, artifacts and contexts (`[stores]`)
    stores: StoresConfig = Field(default_factory=StoresConfig)
    # custom step types (`[task_steps]`)
    task_steps: TaskStepsConfig = Field(default_factory=TaskStepsConfig)
    # custom Coder Eval criteria (`[criteria]`)
    criteria: CriteriaConfig = Field(default_factory=CriteriaConfig)
    # how jobs execute (`[dagster]`)
    dagster: DagsterConfig = Field(default_factory=DagsterConfig)
    # task id -> its cron schedule (a Dagster schedule of the task's job)
    schedules: dict[str, Annotated[ScheduleEntry, BeforeValidator(_cron_string_to_entry)]] = Field(default_factory=dict)
    # the regression gate of the scores (`[regression]`)
    regression: RegressionConfig = Field(default_factory=RegressionConfig)
    # experiment file (relative to the project root) -> the Coder Eval task ids it runs: a job
    # each, partitioned by variant x row
    experiments: dict[str, list[str]] = Field(default_factory=dict)
    root: Path = Field(default_factory=Path.cwd, exclude=True)

    def env_entry(self, env_id: str) -> EnvEntry | None:
        return self.envs.registry.get(env_id) or BUILTIN_ENVS.get(env_id)

    def agent_entry(self, agent_id: str) -> AgentEntry | None:
        return self.agents.registry.get(agent_id) or BUILTIN_AGENTS.get(agent_id)

    def path(self, relative: str | Path) -> Path:
        return (self.root / relative).resolve()

    @property
    def state_dir(self) -> Path:
        return self.path(self.stores.state_dir)


def resolve_reference(value: str | None) -> str | None:
    """``env:NAME`` (with ``?default``) reads the environment; other strings are literal."""
    if value is None or not value.startswith("env:"):
        return value
    name, _, default = value[4:].partition("?")
    return os.environ.get(name) or default or None


def find_config_file(start: Path | None = None) -> Path | None:
    explicit = os.environ.get("AGENT_ENV_CONFIG")
    if explicit:
        if not Path(explicit).is_file():
            raise ConfigError(f"AGENT_ENV_CONFIG='{explicit}' does not point to an existing file")
        return Path(explicit)
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        if (folder / CONFIG_RELPATH).is_file():
            return folder / CONFIG_RELPATH
    return None


def load_config(start: Path | None = None, path: Path | None = None) -> AgentEnvConfig:
    """The config in force for ``start`` (a folder), or the built-in defaults."""
    path = path or find_config_file(start)
    if path is None:
        return AgentEnvConfig(root=(start or Path.cwd()).resolve())
    root = path.resolve().parent.parent if path.parent.name == ".agentenv" else path.resolve().parent
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc
    try:
        return AgentEnvConfig.model_validate({**data, "root": root})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{path}: {problems}") from exc
