"""Selecting the production pieces from config: the executor and the S3 IO manager; the
production profile's own settings (deploy/)."""

from __future__ import annotations

import json

import pytest
import yaml
from dagster._config import process_config
from dagster._core.instance.config import dagster_instance_config_schema

from agentenv_dagster import build_definitions
from agentenv_dagster.config import AgentEnvConfig, ConfigError
from agentenv_dagster.orchestration.executors import FORKSERVER_EXECUTOR, _string_source, job_executor
from agentenv_dagster.orchestration.io_manager import TaskContextIOManager, context_io_manager
from agentenv_dagster.orchestration.ops import IO_MANAGER_KEY
from agentenv_dagster.orchestration.s3_io_manager import S3ContextIOManager
from agentenv_dagster.runtime.s3 import S3Location
from projects import REPO, make_project


def test_the_executor_is_forkserver_unless_the_project_chooses(monkeypatch):
    monkeypatch.delenv("AGENTENV_DAGSTER_EXECUTOR", raising=False)
    assert job_executor(AgentEnvConfig()) is FORKSERVER_EXECUTOR
    assert job_executor(AgentEnvConfig.model_validate({"dagster": {"executor": "in_process"}})).name == "in_process"
    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "nope")
    with pytest.raises(ConfigError, match="AGENTENV_DAGSTER_EXECUTOR='nope': expected one of multiprocess, in_process, celery, k8s$"):
        job_executor(AgentEnvConfig())


def test_celery_takes_its_broker_from_the_environment_by_reference(monkeypatch):
    pytest.importorskip("dagster_celery")
    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "celery")
    assert job_executor(AgentEnvConfig()).name == "celery"
    # a set variable stays a reference (a broker password never sits in the definition);
    # an unset one falls back to its default
    monkeypatch.setenv("AGENTENV_CELERY_BROKER", "redis://:s3cret@broker:6379/0")
    monkeypatch.delenv("AGENTENV_CELERY_BACKEND", raising=False)
    settings = AgentEnvConfig().dagster.celery
    assert _string_source(settings.broker) == {"env": "AGENTENV_CELERY_BROKER"}
    assert _string_source(settings.backend) == "redis://127.0.0.1:6379/1"


def test_k8s_takes_its_config_from_the_project_and_dagster_checks_it(monkeypatch):
    pytest.importorskip("dagster_k8s", reason="dagster-k8s is not installed: pip install -e '.[k8s]'")
    import dagster as dg

    monkeypatch.delenv("AGENTENV_DAGSTER_EXECUTOR", raising=False)

    @dg.op
    def noop():
        pass

    def job(k8s: dict):
        executor = job_executor(AgentEnvConfig.model_validate({"dagster": {"executor": "k8s", "k8s": k8s}}))
        return dg.GraphDefinition(name="g", node_defs=[noop]).to_job(executor_def=executor)

    good = job({"job_namespace": "agentenv", "env_secrets": ["agentenv-aws"], "max_concurrent": 8})
    assert good.executor_def.name == "k8s"
    assert dg.validate_run_config(good, {})
    with pytest.raises(dg.DagsterInvalidConfigError, match='unexpected config entry "job_namespce"'):
        dg.validate_run_config(job({"job_namespce": "agentenv"}), {})


def test_a_project_with_s3_stores_and_celery_gets_them_in_its_definitions(tmp_path, monkeypatch):
    pytest.importorskip("dagster_celery")
    monkeypatch.delenv("AGENTENV_DAGSTER_EXECUTOR", raising=False)
    root = make_project(tmp_path / "p", tasks={"t.json": [{"id": "e", "type": "deploy_env", "env_id": "email"}]})
    config = root / ".agentenv" / "config.toml"
    config.write_text(config.read_text().replace('[stores]\n', '[stores]\nbackend = "s3"\nbucket = "b-1"\n'
                                                 'endpoint_url = "http://127.0.0.1:9"\n')
                      + '\n[dagster]\nexecutor = "celery"\n')
    defs = build_definitions(root / "tasks")
    assert defs.resolve_job_def("t").executor_def.name == "celery"
    io_manager = defs.resources[IO_MANAGER_KEY]
    assert isinstance(io_manager, S3ContextIOManager)
    assert (io_manager.bucket, io_manager.prefix, io_manager.endpoint_url) == ("b-1", "agentenv", "http://127.0.0.1:9")
    artifacts = defs.resources["agentenv_artifacts"]
    assert (artifacts.backend, artifacts.bucket, artifacts.prefix) == ("s3", "b-1", "agentenv")
    assert isinstance(context_io_manager(AgentEnvConfig(root=tmp_path)), TaskContextIOManager)


def test_the_s3_io_manager_stores_redacted_contexts_and_finds_the_final_one(monkeypatch):
    moto = pytest.importorskip("moto")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with moto.mock_aws():
        S3Location("ctx-bucket", region="us-east-1").client.create_bucket(Bucket="ctx-bucket")
        manager = S3ContextIOManager(bucket="ctx-bucket", prefix="x", region="us-east-1")
        row = {"metadata": {"seen": ["a"]},
               "deployed_agents": [{"agent_name": "a", "api_url": "http://a", "litellm_api_key": "sk-1"}]}
        url = manager.write("run-1", "a", {"rows": {"": row}})
        assert url == "s3://ctx-bucket/x/runs/run-1/context/a.json"
        stored = manager.location.get_bytes("x/runs/run-1/context/a.json").decode()
        assert "sk-1" not in stored and "litellm_api_key" not in stored
        assert manager.read("run-1", "a")["rows"][""]["metadata"] == {"seen": ["a"]}
        # without a teardown output every stored context merges; with one, it is the answer
        manager.write("run-1", "b", {"rows": {"": {"metadata": {"b": 1}}}})
        assert json.dumps(manager.final_contexts("run-1")[""].metadata, sort_keys=True) == '{"b": 1, "seen": ["a"]}'
        manager.write("run-1", "teardown_run", {"rows": {"": {"metadata": {"final": True}}}})
        assert manager.final_contexts("run-1")[""].metadata == {"final": True}


def test_production_profile_fails_dead_runs_and_requeues_lost_celery_steps(monkeypatch):
    get_validated_config = pytest.importorskip("dagster_celery.cli").get_validated_config  # the prod extra

    settings = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["run_monitoring"]
    assert process_config(dagster_instance_config_schema(), {"run_monitoring": settings}).success
    assert settings["enabled"] is True and settings["max_resume_run_attempts"] == 0
    monkeypatch.setenv("AGENTENV_CELERY_BROKER", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("AGENTENV_CELERY_BACKEND", "redis://127.0.0.1:6379/1")
    celery = get_validated_config(str(REPO / "deploy" / "celery.yaml"))
    assert celery["config_source"] == {"task_acks_late": True, "task_reject_on_worker_lost": True,
                                       "worker_prefetch_multiplier": 1}
