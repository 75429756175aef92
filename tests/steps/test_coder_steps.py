"""The Coder Eval step family with the asyncio walker: workspace templates, commands, criteria."""

from __future__ import annotations

import textwrap

import pytest

from agentenv_dagster.compiler import load_plan
from agentenv_dagster.config import load_config
from agentenv_dagster.runner import run_plan
from projects import leaked_servers, make_project


def run_yaml(root, text: str, **options):
    import asyncio

    path = root / "tasks" / "t.yaml"
    path.write_text(textwrap.dedent(text))
    config = load_config(root)
    return asyncio.run(run_plan(load_plan(path, config, **options), config))


@pytest.fixture
def project(tmp_path):
    root = make_project(tmp_path / "p", tasks={})
    template = root / "tasks" / "template"
    (template / "src").mkdir(parents=True)
    (template / "src" / "main.py").write_text("print('main')\n")
    (template / "dist").mkdir()
    (template / "dist" / "bundle.js").write_text("//")
    (template / "__pycache__").mkdir()
    (template / "__pycache__" / "x.pyc").write_text("")
    (template / "notes.log").write_text("")
    reference = root / "tasks" / "solution"
    reference.mkdir()
    (reference / "answer.txt").write_text("42\n")
    yield root
    assert leaked_servers(root / ".agentenv" / "state") == []


def test_templates_ignore_patterns_mount_points_and_the_reference(project):
    context = run_yaml(project, """
        task_id: t
        description: d
        agent: {type: none}
        reference: {directory: solution}
        sandbox:
          python: null
          ignore_patterns: ["!dist", "*.log"]
          template_sources:
            - {type: template_dir, path: template}
            - {type: template_dir, path: template/src, mount_point: lib}
            - {type: starter_files, files: [{path: docs/README.md, content: "# hi"}]}
        success_criteria:
          - {type: file_exists, path: src/main.py, description: template copied}
          - {type: file_exists, path: dist/bundle.js, description: "!dist keeps a default-ignored folder"}
          - {type: file_exists, path: lib/main.py, description: mounted}
          - {type: file_contains, path: docs/README.md, includes: ["# hi"], description: starter file}
          - {type: run_command, command: "cat $REFERENCE_DIR/answer.txt", expected_stdout: "42", description: reference}
          - {type: file_exists, path: __pycache__/x.pyc, description: ignored by default, weight: 0}
          - {type: file_exists, path: notes.log, description: ignored by the task, weight: 0}
          - {type: file_exists, path: answer.txt, description: the reference stays out of the workspace, weight: 0}
    """)
    rows = context.metadata["verifications"]["success_criteria"]["results"]
    assert [r["score"] for r in rows] == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert context.metadata["verifications"]["success_criteria"]["passed"] is True


@pytest.mark.timeout(120)  # unbounded, the glob walks the loop and the read waits on the pipe for ever
def test_criteria_grade_a_workspace_with_a_symlink_loop_and_a_pipe_within_the_task_timeout(project):
    task = """
        task_id: t
        description: d
        agent: {type: none}
        sandbox: {python: null}
        run_limits: {task_timeout: 45}
        pre_run:
          - command: mkdir src && echo hi > src/a.md && ln -s . src/l1 && ln -s . src/l2 && ln -s . src/l3 && mkfifo answer.txt
        success_criteria:
          - {type: file_exists, path: "src/**/*.md", description: found once through the loop}
          - {type: file_contains, path: answer.txt, includes: ["42"], description: a pipe is not read}
    """
    context = run_yaml(project, task)
    rows = context.metadata["verifications"]["success_criteria"]["results"]
    assert [(r["score"], r["details"], r["error"]) for r in rows] == [
        (1.0, "File 'src/**/*.md' exists (src/a.md)", None),
        (0.0, "Check failed", "UnreadableFileError: 'answer.txt' is not a regular file (a pipe, device or socket)"),
    ]
    plan = load_plan(project / "tasks" / "t.yaml", load_config(project))
    assert plan.step_by_id["criteria"].timeout_seconds == 45  # the checks' deadline is the task's


def test_pre_run_failures_tolerated_on_request_and_post_run_never_gates(project):
    context = run_yaml(project, """
        task_id: t
        description: d
        agent: {type: none}
        sandbox: {python: null}
        pre_run:
          - {command: "exit 3", fail_on_error: false}
          - {command: "sleep 5", timeout: 1, fail_on_error: false}
          - {command: "echo made > made.txt"}
        post_run:
          - {command: "exit 9"}
        success_criteria:
          - {type: file_exists, path: made.txt, description: pre_run ran}
    """)
    pre = context.metadata["pre_run_results"]
    assert [(r["exit_code"], r["error"]) for r in pre][:2] == [(3, "exit code 3"), (-9, "timed out after 1s")]
    assert context.metadata["post_run_results"][0]["error"] == "exit code 9"
    assert context.metadata["verifications"]["success_criteria"]["passed"] is True
    assert "failed_steps" not in context.metadata


def test_a_repo_template_clones_a_local_repository_at_its_commit(project, tmp_path):
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "app.py").write_text("v1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "app.py").write_text("v2\n")
    subprocess.run([*git, "commit", "-qam", "two"], check=True)
    context = run_yaml(project, f"""
        task_id: t
        description: d
        agent: {{type: none}}
        sandbox:
          python: null
          template_sources: [{{type: repo, url: "file://{repo}", commit: "{first}"}}]
        success_criteria:
          - {{type: file_contains, path: app.py, includes: [v1], description: the pinned commit}}
          - {{type: file_exists, path: .git/HEAD, description: no history, weight: 0}}
    """)
    rows = context.metadata["verifications"]["success_criteria"]["results"]
    assert [r["score"] for r in rows] == [1.0, 0.0]


def test_a_remote_repo_template_needs_network_and_says_so(project):
    from agentenv_dagster.steps.execution import StepFailed

    with pytest.raises(StepFailed, match="cloning needs network access"):
        run_yaml(project, """
            task_id: t
            description: d
            agent: {type: none}
            sandbox:
              python: null
              template_sources: [{type: repo, url: "https://example.invalid/r.git"}]
            success_criteria: [{type: file_exists, path: a, description: d}]
        """)


def _wheel(folder, name="greeting", version="1.0"):
    """A minimal pure-Python wheel, so the venv test installs offline."""
    import zipfile

    dist = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    files = {
        f"{name}.py": "WORD = 'hello from the venv'\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as wheel:
        for arcname, text in files.items():
            wheel.writestr(arcname, text)
        wheel.writestr(f"{dist}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{dist}/RECORD"]))
    return path


@pytest.mark.slow
def test_env_packages_are_installed_into_a_workspace_venv(project, tmp_path):
    wheel = _wheel(tmp_path)
    context = run_yaml(project, f"""
        task_id: t
        description: d
        agent: {{type: none}}
        sandbox:
          python: {{env_packages: ["{wheel}"]}}
        success_criteria:
          - {{type: run_command, command: ".venv/bin/python -c 'import greeting; print(greeting.WORD)'",
              expected_stdout: "hello from the venv", description: the package is importable in the venv}}
    """)
    assert context.metadata["verifications"]["success_criteria"]["passed"] is True
