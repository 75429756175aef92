"""uipath_eval against a fake ``uipath`` executable put on PATH (a real subprocess)."""

from __future__ import annotations

import json
import os
import sys

import pytest
from criteria_helpers import context, grade, write

FAKE_UIPATH = f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
json.dump(argv, open("argv.json", "w"))
output = argv[argv.index("--output-file") + 1]
mode = os.environ["FAKE_UIPATH_MODE"]
if mode == "fail":
    sys.stderr.write("auth failed")
    sys.exit(2)
documents = {{
    "evalset": {{"evaluationSetResults": [{{"evaluationRunResults": [
        {{"evaluatorId": "exact", "result": {{"score": 1.0}}}},
        {{"evaluatorId": "exact", "result": {{"score": 0.5}}}},
        {{"evaluatorId": "judge", "result": {{"score": 0.2}}}},
        {{"evaluatorId": "judge", "result": {{"score": "n/a"}}}},
    ]}}]}},
    "flat": {{"accuracy": 0.9, "f1": 0.5, "label": "high"}},
    "array": [1, 2],
}}
with open(output, "w") as f:
    f.write("garbage" if mode == "notjson" else json.dumps(documents[mode]))
"""


@pytest.fixture
def fake_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uipath").write_text(FAKE_UIPATH)
    (bin_dir / "uipath").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.fixture
def dirs(tmp_path):
    sandbox, task = tmp_path / "sandbox", tmp_path / "task"
    write(task, {"evals/regression.json": "{}"})
    sandbox.mkdir()
    return sandbox, task


def evaluate(dirs, path, mode, thresholds, eval_set="regression-v1"):
    sandbox, task = dirs
    ctx = context(sandbox, [], task_dir=task, env={"PATH": path, "FAKE_UIPATH_MODE": mode})
    return grade({"type": "uipath_eval", "agent_name": "my-agent", "eval_set": eval_set, "thresholds": thresholds}, ctx)


def test_eval_set_results_become_per_evaluator_means(dirs, fake_path):
    result = evaluate(dirs, fake_path, "evalset", {"exact": 0.7, "judge": 0.2, "*": 0.5})
    assert result.score == pytest.approx(1 / 3)
    assert result.details == ("Thresholds met: 1/3\nexact: 0.750 (minimum 0.7): pass\njudge: 0.100 (minimum 0.2): fail\n"
                              "*: 0.425 (minimum 0.5): fail")


def test_a_flat_metric_map_and_missing_or_non_numeric_metrics(dirs, fake_path):
    result = evaluate(dirs, fake_path, "flat", {"accuracy": 0.8, "f1": 0.75, "label": 0.1, "recall": 0.1})
    assert result.score == 0.25
    assert result.details.endswith(
        "f1: 0.500 (minimum 0.75): fail\nlabel: 'high' (minimum 0.1): fail\nrecall: missing (minimum 0.1): fail")
    assert evaluate(dirs, fake_path, "flat", {}).score == 1.0


def test_the_cli_is_called_in_the_sandbox_and_cleans_up(dirs, fake_path):
    sandbox, task = dirs
    evaluate(dirs, fake_path, "flat", {"accuracy": 0.5})
    argv = json.loads((sandbox / "argv.json").read_text())
    assert argv[:5] == ["eval", "my-agent", "regression-v1", "--no-report", "--output-file"]
    assert argv[5].startswith("uipath_eval_output_") and len(argv[5]) == len("uipath_eval_output_12345678.json")
    assert not (sandbox / argv[5]).exists()
    evaluate(dirs, fake_path, "flat", {"accuracy": 0.5}, eval_set="evals/regression.json")
    assert json.loads((sandbox / "argv.json").read_text())[2] == str(task / "evals/regression.json")


@pytest.mark.parametrize("mode, error", [
    ("fail", "uipath eval exited 2"),
    ("notjson", "uipath eval output is not readable JSON: "),
    ("array", "uipath eval output is a JSON list, not an object"),
])
def test_failed_runs_score_zero(dirs, fake_path, mode, error):
    result = evaluate(dirs, fake_path, mode, {"accuracy": 0.5})
    assert result.score == 0.0 and result.error.startswith(error)
    if mode == "fail":
        assert result.details == "Stderr: auth failed"


def test_without_the_cli_on_path_the_error_says_so(dirs, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = evaluate(dirs, str(empty), "flat", {"accuracy": 0.5})
    assert result.score == 0.0
    assert result.error.startswith("uipath_eval needs the `uipath` CLI on PATH")
