"""``[model]``: models named ``provider/model`` (a bare name is Anthropic's), the providers
and their settings, and prices found under either name of a model."""

from __future__ import annotations

import pytest

from agentenv_dagster.config import ConfigError, ModelConfig, load_config


def test_a_bare_name_is_an_anthropic_model_with_the_model_sections_key_and_url(monkeypatch):
    monkeypatch.setenv("MY_ANTHROPIC_KEY", "sk-a")
    config = ModelConfig(api_key="env:MY_ANTHROPIC_KEY", base_url="http://127.0.0.1:9")
    model = config.resolve("claude-sonnet-4-6")
    assert (model.provider, model.name, model.protocol) == ("anthropic", "claude-sonnet-4-6", "anthropic")
    assert (model.api_key(), model.base_url()) == ("sk-a", "http://127.0.0.1:9")
    assert config.resolve("anthropic/claude-sonnet-4-6").name == "claude-sonnet-4-6"


def test_provider_models_and_their_settings(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-o")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    config = ModelConfig(providers={
        "openai-compatible": {"base_url": "http://127.0.0.1:4000/v1", "verdict": "json_schema"},
        "ollama": {"base_url": "http://127.0.0.1:11434/v1"}})
    openai = config.resolve("openai/gpt-4.1")
    assert (openai.protocol, openai.name, openai.api_key(), openai.base_url()) == ("openai", "gpt-4.1", "sk-o", None)
    assert openai.settings.max_tokens_param == "max_completion_tokens"
    proxy = config.resolve("openai-compatible/meta-llama/Llama-3.1-8B")  # the rest of the name is the model's
    assert (proxy.name, proxy.base_url(), proxy.settings.verdict) == (
        "meta-llama/Llama-3.1-8B", "http://127.0.0.1:4000/v1", "json_schema")
    assert config.resolve("ollama/llama3.1").protocol == "openai"
    with pytest.raises(ValueError, match=r"^model 'mistral/large': unknown provider 'mistral' \(known providers: "
                                         r"\['anthropic', 'ollama', 'openai', 'openai-compatible'\]; a bare model name "
                                         r"is an Anthropic model\)$"):
        config.resolve("mistral/large")


def test_what_a_provider_still_needs_is_said(monkeypatch):
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "LITELLM_API_KEY", "LITELLM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    config = ModelConfig()
    assert config.resolve("claude-x").missing_setting() == (
        "set [model] api_key in .agentenv/config.toml or ANTHROPIC_API_KEY")
    assert config.resolve("openai/gpt-x").missing_setting() == (
        "set [model.providers.openai] api_key in .agentenv/config.toml or OPENAI_API_KEY")
    assert config.resolve("openai-compatible/x").missing_setting() == (
        "set [model.providers.openai-compatible] base_url in .agentenv/config.toml or LITELLM_BASE_URL")
    monkeypatch.setenv("LITELLM_BASE_URL", "http://127.0.0.1:4000")
    assert config.resolve("openai-compatible/x").missing_setting() is None  # a proxy may need no key


def test_prices_are_found_under_either_name_of_a_model():
    config = ModelConfig(prices={"claude-x": {"input": 3.0}, "anthropic/claude-y": {"input": 1.0},
                                 "openai/gpt-x": {"input": 2.0}})
    assert config.prices["anthropic/claude-x"] == config.prices["claude-x"] == {"input": 3.0}
    assert config.prices["claude-y"] == {"input": 1.0}
    assert "gpt-x" not in config.prices  # a bare name is Anthropic's


def project_config(root, text: str):
    """``root``'s ``.agentenv/config.toml`` holding ``text``: its path."""
    path = root / ".agentenv" / "config.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


def test_a_misspelled_price_field_is_refused_with_the_ones_there_are(tmp_path):
    project_config(tmp_path, '[model.prices]\n"claude-x" = { input = 3.0, cache_reads = 0.3 }\n')
    with pytest.raises(ConfigError, match=r"config\.toml: model\.prices\.claude-x\.cache_reads\.\[key\]: Input should be "
                                          r"'input', 'output', 'cache_read' or 'cache_write'"):
        load_config(tmp_path)


def test_a_bad_model_section_names_the_file_and_the_field(tmp_path):
    path = project_config(tmp_path, '[model]\ndefault = "claude-x"\n[model.providers.vllm]\nprotocol = "openai"\n')
    with pytest.raises(ConfigError, match=r"config\.toml: model: Value error, providers\.vllm: an OpenAI-compatible "
                                          r"provider needs a base_url$"):
        load_config(path=path)
    path.write_text('[model.roles]\njudge = "gemini/pro"\n')
    with pytest.raises(ConfigError, match=r"config\.toml: model: Value error, model 'gemini/pro': unknown provider "
                                          r"'gemini'"):
        load_config(path=path)
