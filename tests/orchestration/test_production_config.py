"""Selecting the production pieces from config: the executor and the S3 IO manager; the
production profile's own settings (deploy/)."""

from __future__ import annotations

import json

import pytest
import dagster as dg
import yaml

from agentenv_dagster import build_definitions
from agentenv_dagster.config import AgentEnvConfig, ConfigError
from agentenv_dagster.compiler import load_plan
from agentenv_dagster.orchestration.executors import _string_source, agentenv_executor, job_executor
from agentenv_dagster.orchestration.io_manager import TaskContextIOManager, context_io_manager
from agentenv_dagster.orchestration.ops import IO_MANAGER_KEY
from agentenv_dagster.orchestration.s3_io_manager import S3ContextIOManager
from agentenv_dagster.runtime.s3 import S3Location
from projects import REPO, make_project


def test_the_executor_follows_the_plan_unless_the_project_chooses(monkeypatch, tmp_path):
    """A chain of steps with one row runs in-process; branches or rows run side by side."""
    monkeypatch.delenv("AGENTENV_DAGSTER_EXECUTOR", raising=False)
    root = make_project(tmp_path / "p")
    config = AgentEnvConfig()
    chain = load_plan(root / "tasks" / "hello_python.yaml", config)
    branches = load_plan(root / "tasks" / "reply_to_dana.json", config)
    dataset = load_plan(root / "tasks" / "triage_tickets.yaml", config)
    assert job_executor(config, chain).name == "in_process"
    assert job_executor(config, branches) is agentenv_executor
    assert job_executor(config, dataset) is agentenv_executor
    assert job_executor(config) is agentenv_executor
    chosen = AgentEnvConfig.model_validate({"dagster": {"executor": "in_process"}})
    assert job_executor(chosen, dataset).name == "in_process"
    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "multiprocess")
    assert job_executor(config, chain).name == "multiprocess"
    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "nope")
    with pytest.raises(ConfigError, match="AGENTENV_DAGSTER_EXECUTOR='nope': expected one of agentenv, in_process, "
                       "multiprocess, celery, k8s$"):
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


def test_the_s3_io_manager_stores_redacted_streams_and_finds_the_final_contexts(monkeypatch):
    moto = pytest.importorskip("moto")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with moto.mock_aws():
        S3Location("ctx-bucket", region="us-east-1").client.create_bucket(Bucket="ctx-bucket")
        manager = S3ContextIOManager(bucket="ctx-bucket", prefix="x", region="us-east-1")
        row = {"metadata": {"seen": ["a"]},
               "deployed_agents": [{"agent_name": "a", "api_url": "http://a", "litellm_api_key": "sk-1"}]}
        manager.start_stream("run-1", "a")
        manager.append_records("run-1", "a", [{"row": "", "context": row}])
        (key,) = [e["Key"] for e in manager.location.list_keys("x/runs/run-1/context/a/")]
        stored = manager.location.get_bytes(key).decode()
        assert "sk-1" not in stored and "litellm_api_key" not in stored
        records, position, ended = manager.read_records("run-1", "a")
        assert [r["context"]["metadata"] for r in records] == [{"seen": ["a"]}] and not ended
        manager.append_records("run-1", "a", [{"end": True}])
        assert manager.read_records("run-1", "a", position) == ([], manager.read_records("run-1", "a")[1], True)
        # until the teardown op's stream has ended, every stream's rows merge; then it is the answer
        manager.start_stream("run-1", "b")
        manager.append_records("run-1", "b", [{"row": "", "context": {"metadata": {"b": 1}}}])
        assert manager.stream_names("run-1") == ["a", "b"]
        assert json.dumps(manager.final_contexts("run-1")[""].metadata, sort_keys=True) == '{"b": 1, "seen": ["a"]}'
        manager.start_stream("run-1", "teardown_run")
        manager.append_records("run-1", "teardown_run", [{"row": "", "context": {"metadata": {"final": True}}},
                                                          {"end": True}])
        assert manager.final_contexts("run-1")[""].metadata == {"final": True}


def test_production_profile_fails_dead_runs_and_requeues_lost_celery_steps(monkeypatch):
    get_validated_config = pytest.importorskip("dagster_celery.cli").get_validated_config  # the prod extra

    settings = yaml.safe_load((REPO / "deploy" / "dagster.yaml").read_text())["run_monitoring"]
    with dg.instance_for_test(overrides={"run_monitoring": settings}) as instance:  # Dagster validates the section
        assert instance.run_monitoring_enabled and instance.run_monitoring_max_resume_run_attempts == 0
        assert settings["max_runtime_seconds"] == 86400  # the last bound on any run (docs/production.md)
    monkeypatch.setenv("AGENTENV_CELERY_BROKER", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("AGENTENV_CELERY_BACKEND", "redis://127.0.0.1:6379/1")
    celery = get_validated_config(str(REPO / "deploy" / "celery.yaml"))
    assert celery["config_source"] == {
        "task_acks_late": True, "task_reject_on_worker_lost": True, "worker_prefetch_multiplier": 1,
        # a step lost with its whole worker comes back to a running one (docs/production.md, "Faults")
        "broker_transport_options": {"visibility_timeout": 21600, "unacked_restore_interval": 60,
                                     "unacked_restore_throttle": 1}}
