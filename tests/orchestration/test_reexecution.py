"""Re-execution from a failed run: reuses the parent's stored contexts, and is refused when
the task changed since (the content hash tag differs)."""

from __future__ import annotations

import json
import textwrap

import dagster as dg
import pytest

from projects import leaked_servers, make_project, node_of, stream_rows

def task_job(project, module: str, task: str):
    """The job of ``task`` as a pointer another process can load again: a function of a
    module ``module`` written into the project."""
    (project / f"{module}.py").write_text(
        "from pathlib import Path\nfrom agentenv_dagster import build_definitions\n\n"
        f"def job():\n    return build_definitions(Path(__file__).parent / 'tasks', strict=True).resolve_job_def({task!r})\n"
    )
    return dg.build_reconstructable_job(module, "job", reconstructor_working_directory=str(project))


GATE_STEP = textwrap.dedent('''
    from pathlib import Path
    from agentenv_dagster.steps.base import TaskStep

    class GateStep(TaskStep):
        """Fails until its gate file exists; counts its runs in the context."""
        type_name = "gate"
        gate: str

        async def execute(self, ctx, rt):
            ctx.metadata_map("ran").setdefault(self.id, 0)
            ctx.metadata["ran"][self.id] += 1
            if not Path(self.gate).exists():
                raise RuntimeError(f"gate {self.gate} is closed")
''')


@pytest.mark.slow
def test_reexecution_from_failure_resumes_and_refuses_a_changed_task(tmp_path):
    gate = tmp_path / "open"
    steps = [
        {"id": "first", "type": "gate", "gate": str(tmp_path), "depends_on": []},
        {"id": "second", "type": "gate", "gate": str(gate)},
    ]
    project = make_project(tmp_path / "p", extra_config='[task_steps]\nimpls = ["gate_steps:GateStep"]\n',
                           tasks={"t.json": steps})
    (project / "gate_steps.py").write_text(GATE_STEP)

    def job_pointer(name: str):
        """A fresh module per pointer: this process caches imported modules, so a changed
        task file is only seen through a new one."""
        return task_job(project, name, "t")

    recon = job_pointer("jobs_v1")

    with dg.instance_for_test() as instance:
        with dg.execute_job(recon, instance=instance, raise_on_error=False) as failed:
            assert not failed.success
        gate.touch()
        options = dg.ReexecutionOptions.from_failure(failed.run_id, instance)
        with dg.execute_job(recon, instance=instance, reexecution_options=options, raise_on_error=False) as resumed:
            assert resumed.success
            final = stream_rows(project / ".agentenv/state/runs" / resumed.run_id, "teardown_run")[""]
        assert final["metadata"]["ran"] == {"first": 1, "second": 1}  # `first` came from the parent run

        steps[0]["gate"] = str(project)  # the task changes: its content hash too
        (project / "tasks" / "t.json").write_text(json.dumps(steps))
        gate.unlink()
        with dg.execute_job(job_pointer("jobs_v2"), instance=instance, raise_on_error=False) as failed_again:
            assert not failed_again.success
        (project / "tasks" / "t.json").write_text(json.dumps([{**steps[0], "gate": str(tmp_path)}, steps[1]]))
        gate.touch()
        options = dg.ReexecutionOptions.from_failure(failed_again.run_id, instance)
        with dg.execute_job(job_pointer("jobs_v3"), instance=instance, reexecution_options=options,
                            raise_on_error=False) as refused:
            assert not refused.success
            failures = [e for e in refused.all_events if e.event_type_value == "STEP_FAILURE"]
            assert "re-execution refused: the task changed since run" in failures[0].step_failure_data.error.message


@pytest.mark.slow
def test_regrading_reruns_only_the_rubric_of_a_finished_run(tmp_path, fake_messages_api, monkeypatch):
    """Offline, reply_to_dana's rubric is not graded; once a judge is configured, a re-execution
    of only that step (and the teardown) grades the parent run's saved reply: nothing else is
    redeployed or re-run, and the verification asset gets its score."""
    from fakes.messages_api import text_reply

    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "in_process")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    project = make_project(tmp_path / "p")
    recon = task_job(project, "jobs", "reply_to_dana")
    tone = dg.AssetKey(["verifications", "reply_to_dana", "tone"])
    with dg.instance_for_test() as instance:
        with dg.execute_job(recon, instance=instance) as first:
            assert first.success
        before = instance.get_latest_materialization_event(tone).asset_materialization.metadata
        assert before["graded"].value is False and "score" not in before

        monkeypatch.setenv("FAKE_JUDGE_KEY", "sk-judge")
        fake_messages_api.enqueue(text_reply(json.dumps({"results": [
            {"id": "c1", "score": 1.0, "justification": "polite and signed"},
            {"id": "c2", "score": 0.0, "justification": "says nothing of what was done"}]})))
        options = dg.ReexecutionOptions(parent_run_id=first.run_id, step_selection=["reply_to_dana_steps.tone", "reply_to_dana_steps.teardown_run"])
        judge = {"config": {"model": "claude-test", "base_url": fake_messages_api.base_url, "api_key_env": "FAKE_JUDGE_KEY"}}
        with dg.execute_job(recon, instance=instance, reexecution_options=options,
                            run_config={"resources": {"agentenv_judge": judge}}) as regraded:
            assert regraded.success
            ran = {node_of(e.step_key) for e in regraded.all_events if e.event_type_value == "STEP_SUCCESS"}
        assert ran == {"tone", "teardown_run"}
        after = instance.get_latest_materialization_event(tone)
        assert after.run_id == regraded.run_id
        assert after.asset_materialization.metadata["score"].value == 0.0  # all_pass: one criterion failed
        assert after.asset_materialization.metadata["graded"].value is True
        saved = stream_rows(project / ".agentenv/state/runs" / first.run_id, "reply")
        reply = saved[""]["prompt_responses"][0]["response"]
        assert f"<agent_response>\n{reply}\n</agent_response>" in fake_messages_api.requests[-1].body["messages"][-1]["content"]
    assert leaked_servers(project / ".agentenv" / "state") == []


def test_re_executing_a_step_whose_env_ended_with_its_run_is_refused_with_what_to_select(tmp_path, monkeypatch):
    """`sent` reads the email env's state; re-executed alone, the env it would talk to ended
    with the parent run: the step is refused (not a connection error) and says what to select."""
    monkeypatch.setenv("AGENTENV_DAGSTER_EXECUTOR", "in_process")
    project = make_project(tmp_path / "p")
    recon = task_job(project, "jobs", "reply_to_dana")
    with dg.instance_for_test() as instance:
        with dg.execute_job(recon, instance=instance) as first:
            assert first.success
        options = dg.ReexecutionOptions(parent_run_id=first.run_id, step_selection=["reply_to_dana_steps.sent", "reply_to_dana_steps.teardown_run"])
        with dg.execute_job(recon, instance=instance, reexecution_options=options, raise_on_error=False) as again:
            assert not again.success
            (failure,) = [e for e in again.all_events if e.event_type_value == "STEP_FAILURE" and node_of(e.step_key) == "sent"]
        message = failure.step_failure_data.error.message
        assert f"step 'sent' uses what step(s) 'email' deployed in run {first.run_id}, which ended with that run" in message
        assert "re-execute from 'email'" in message
    assert leaked_servers(project / ".agentenv" / "state") == []
