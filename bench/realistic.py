"""A dataset as real agents run it, through agentenv_dagster's CLI and through Inspect AI's.

Real agents have heavy-tailed latencies, and every row's grading costs something. Here each
row's agent answers after its own latency — most rows fast, some several times slower, a few
an order of magnitude slower — and each row is graded by a test command (a Python process that
takes ``--grade`` seconds and checks the agent's file). Both tools run the same rows, the same
command and the same concurrency (``--in-flight``), each as a user runs it:

(a) ``agentenv-dagster run realistic.yaml`` with its defaults: a Coder Eval dataset task whose
    replay agent sleeps the row's latency in the run's agent host and writes its answer, and a
    ``run_command`` criterion that runs the test command in the row's sandbox;
(b) ``inspect eval`` of a task whose solver sleeps the row's latency and writes the answer in
    the row's folder, and whose scorer runs the same command there (``--max-samples``).

It prints each wall time against the row-major ideal (a list schedule of each row's latency
plus its grading, in dataset order, on ``--in-flight`` lanes: what a runner that starts each
row's grading as soon as its own agent is done, with no overhead at all, takes) and the ratio
of the two tools. Needs ``pip install -e '.[bench]'``.

    python bench/realistic.py [--rows 240] [--in-flight 32] [--grade 0.5] [--only agentenv|inspect]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import list_schedule, timed  # noqa: E402


def latencies(n: int, seed: int = 7) -> list[float]:
    """Each row's agent latency in seconds, rounded to 0.25 s: 75 % between 0.5 and 3, 20 %
    between 3 and 8, 5 % between 15 and 30."""
    draw = random.Random(seed)
    out = []
    for _ in range(n):
        tier = draw.random()
        low, high = (0.5, 3.0) if tier < 0.75 else (3.0, 8.0) if tier < 0.95 else (15.0, 30.0)
        out.append(round(draw.uniform(low, high) * 4) / 4)
    return out


def grade_command(seconds: float) -> str:
    """The test command: a Python process that works ``seconds`` and checks the agent's file."""
    script = f"import pathlib, time; time.sleep({seconds}); assert pathlib.Path('answer.txt').read_text() == 'done'"
    return f'{sys.executable} -c "{script}"'


def agentenv_project(root: Path, lat: list[float], grade: float) -> Path:
    (root / ".agentenv").mkdir(parents=True)
    (root / ".agentenv" / "config.toml").write_text('[model]\ndefault = "replay"\n')
    (root / "tasks").mkdir()
    rows = [{"id": f"r{i:04d}", "latency": f"{value:.2f}"} for i, value in enumerate(lat)]
    (root / "tasks" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    episodes = "\n".join(
        f'    - {{match: "latency {value:.2f}$", reply: done, '
        f'actions: [{{sleep: {value}}}, {{write_file: answer.txt, content: done}}]}}'
        for value in sorted(set(lat)))
    task = root / "tasks" / "realistic.yaml"
    task.write_text(textwrap.dedent("""\
        task_id: realistic
        description: every row's agent at its own latency, every row graded by a test command
        initial_prompt: "Row ${row.id}, latency ${row.latency}"
        agent:
          type: replay
          episodes:
        """) + episodes + textwrap.dedent(f"""
        sandbox: {{python: null}}
        dataset:
          paths: [rows.jsonl]
        success_criteria:
          - type: run_command
            command: {json.dumps(grade_command(grade))}
            timeout: 120
            description: the row's tests pass
        """))
    return task


INSPECT_TASK = '''
import asyncio, json, pathlib, tempfile
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.scorer import Score, accuracy, scorer
from inspect_ai.solver import solver

ROWS = json.loads(pathlib.Path(__file__).with_name("rows.json").read_text())
COMMAND = pathlib.Path(__file__).with_name("command.txt").read_text()


@solver
def agent():
    async def solve(state, generate):
        await asyncio.sleep(state.metadata["latency"])
        folder = pathlib.Path(tempfile.mkdtemp(prefix="row-"))
        (folder / "answer.txt").write_text("done")
        state.metadata["folder"] = str(folder)
        return state
    return solve


@scorer(metrics=[accuracy()])
def tests():
    async def score(state, target):
        proc = await asyncio.create_subprocess_shell(COMMAND, cwd=state.metadata["folder"])
        return Score(value=1 if await proc.wait() == 0 else 0)
    return score


@task
def realistic():
    samples = [Sample(id=r["id"], input=f"Row {r['id']}", metadata={"latency": r["latency"]}) for r in ROWS]
    return Task(dataset=samples, solver=agent(), scorer=tests())
'''


def inspect_project(root: Path, lat: list[float], grade: float) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "rows.json").write_text(json.dumps([{"id": f"r{i:04d}", "latency": v} for i, v in enumerate(lat)]))
    (root / "command.txt").write_text(grade_command(grade))
    (root / "realistic_task.py").write_text(INSPECT_TASK)
    return root / "realistic_task.py"


def inspect_passed(logs: Path) -> int:
    """How many of Inspect AI's samples scored 1 (its log says)."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    (log,) = [read_eval_log(info) for info in list_eval_logs(str(logs))]
    return sum(1 for sample in log.samples or [] for score in sample.scores.values() if score.value == 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=240)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--grade", type=float, default=0.5, help="seconds each row's test command works")
    parser.add_argument("--only", choices=["agentenv", "inspect"])
    args = parser.parse_args()
    lat = latencies(args.rows)
    ideal = list_schedule([value + args.grade for value in lat], args.in_flight)
    print(f"{args.rows} rows (latency mean {sum(lat) / len(lat):.2f} s, max {max(lat):.2f} s), a {args.grade} s test "
          f"command each, {args.in_flight} in flight: row-major ideal {ideal:.2f} s", flush=True)
    times = {}
    with tempfile.TemporaryDirectory(prefix="realistic-") as tmp:
        work = Path(tmp)
        if args.only in (None, "agentenv"):
            task = agentenv_project(work / "agentenv", lat, args.grade)
            command = [shutil.which("agentenv-dagster") or "agentenv-dagster", "run", str(task),
                       "--rows-in-flight", str(args.in_flight), "--output-dir", str(work / "agentenv" / "out")]
            times["agentenv_dagster"], busy, output = timed(command, work / "agentenv",
                                                            {"DAGSTER_HOME": str(work / "agentenv" / ".dagster_home")})
            passed = json.loads((work / "agentenv" / "out" / "run.json").read_text())["tasks_succeeded"]
            print(f"  agentenv_dagster {times['agentenv_dagster']:7.2f} s ({times['agentenv_dagster'] / ideal:.2f}x ideal)"
                  f"  {busy or 0:6.1f} s CPU  {passed}/{args.rows} rows passed", flush=True)
        if args.only in (None, "inspect"):
            task = inspect_project(work / "inspect", lat, args.grade)
            command = [shutil.which("inspect") or "inspect", "eval", task.name, "--model", "mockllm/model",
                       "--max-samples", str(args.in_flight), "--display", "none", "--log-dir", str(work / "inspect" / "logs")]
            times["inspect_ai"], busy, output = timed(command, work / "inspect")
            print(f"  inspect_ai       {times['inspect_ai']:7.2f} s ({times['inspect_ai'] / ideal:.2f}x ideal)"
                  f"  {busy or 0:6.1f} s CPU  {inspect_passed(work / 'inspect' / 'logs')}/{args.rows} rows passed",
                  flush=True)
    if len(times) == 2:
        print(f"  agentenv_dagster / inspect_ai = {times['agentenv_dagster'] / times['inspect_ai']:.2f}")


if __name__ == "__main__":
    main()
