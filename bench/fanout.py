"""A 1,000-row dataset through agentenv_dagster and through Inspect AI, in one invocation.

The same rows (a sentence to classify), the same model behaviour (a keyword rule answering
after ``--latency`` seconds) and the same concurrency (``--in-flight``) on both sides:

(a) agentenv_dagster: ``agentenv-dagster run`` of a Coder Eval task with ``dataset`` (each row a
    partition of the job, one run whose ops stream the rows to each other) — sandboxes, the
    replay agent answering over real A2A in the run's agent host, a deterministic
    ``classification_match`` criterion, per-row asset materializations, the suite rollup and
    the reports;
(b) Inspect AI: its ``mockllm`` model answering through ``custom_outputs`` after the same
    delay, ``max_samples`` = ``max_connections`` = the same concurrency, an exact ``match``.

It prints both wall times, their ratio, each against the ideal (rows × latency / in flight),
and the CPU seconds the machine was busy during each (every process: the runs, the agent host;
steadier than wall time on a shared machine), divided by the cores: the wall time the work
would take with no waiting at all, against the ideal. Before the runs, how long creating a
file takes in the temp folder (it swings widely with what was created and deleted there);
after each tool's run, how many files and folders it made. Needs
``pip install -e '.[bench]'``.

    python bench/fanout.py [--rows 1000] [--latency 0.2] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import busy_cpu_seconds, timed  # noqa: E402

LABELS = ("positive", "negative")
WORDS = {"positive": ["great", "lovely", "superb"], "negative": ["awful", "dull", "broken"]}


def rows(n: int) -> list[dict]:
    """Deterministic sentences; every fifth one is neutral, which the rule answers wrongly."""
    out = []
    for i in range(n):
        label = LABELS[i % 2]
        word = WORDS[label][i % 3] if i % 5 else "ordinary"
        out.append({"id": f"r{i:05d}", "text": f"item {i} was {word}", "label": label})
    return out


def answer(text: str) -> str:
    """The model: positive words answer positive, anything else negative."""
    return "positive" if any(w in text for w in WORDS["positive"]) else "negative"


def project(root: Path, n: int, latency: float) -> Path:
    (root / ".agentenv").mkdir(parents=True)
    (root / ".agentenv" / "config.toml").write_text('[model]\ndefault = "replay"\n')
    (root / "tasks").mkdir()
    (root / "tasks" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(n)))
    pattern = "|".join(WORDS["positive"])
    task = root / "tasks" / "sentiment.yaml"
    task.write_text(textwrap.dedent(f"""\
        task_id: sentiment
        description: classify each sentence
        initial_prompt: "Classify, answering in label.txt: ${{row.text}}"
        agent:
          type: replay
          delay_seconds: {latency}
          episodes:
            - {{match: "{pattern}", reply: positive, actions: [{{write_file: label.txt, content: positive}}]}}
            - {{match: ".", reply: negative, actions: [{{write_file: label.txt, content: negative}}]}}
        sandbox: {{python: null}}
        dataset:
          paths: [rows.jsonl]
        success_criteria:
          - type: classification_match
            path: label.txt
            expected_label: "${{row.label}}"
            allowed_labels: [positive, negative]
            description: the label is right
        """))
    return task


def run_agentenv(root: Path, n: int, latency: float, in_flight: int) -> tuple[float, str]:
    """``agentenv-dagster run sentiment.yaml`` as a user runs it (its own process, the
    project's instance), with ``--rows-in-flight``."""
    task = project(root, n, latency)
    command = [shutil.which("agentenv-dagster") or "agentenv-dagster", "run", str(task),
               "--rows-in-flight", str(in_flight), "--output-dir", str(root / "out")]
    elapsed, _busy, _output = timed(command, root, {"DAGSTER_HOME": str(root / ".dagster_home")})
    summary = json.loads((root / "out" / "run.json").read_text())
    return elapsed, f"{summary['tasks_succeeded']}/{summary['tasks_run']} rows passed"


def run_inspect(root: Path, n: int, latency: float, in_flight: int) -> tuple[float, str]:
    """Inspect AI's ``eval`` in this process (its mockllm model answering after the delay)."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    async def delayed(messages, tools, tool_choice, config):
        await asyncio.sleep(latency)
        output = ModelOutput.from_content(model="mockllm", content=answer(messages[-1].text))
        output.usage = ModelUsage(input_tokens=10, output_tokens=1, total_tokens=11)  # no tokenizer download
        return output

    samples = [Sample(id=r["id"], input=f"Classify: {r['text']}", target=r["label"]) for r in rows(n)]
    model = get_model("mockllm/model", custom_outputs=delayed)
    started = time.perf_counter()
    (log,) = inspect_eval(
        Task(dataset=samples, solver=generate(), scorer=match(location="exact")), model=model,
        max_samples=in_flight, max_connections=in_flight, display="none", log_dir=str(root / "logs"),
    )
    elapsed = time.perf_counter() - started
    accuracy = log.results.scores[0].metrics["accuracy"].value if log.results else None
    return elapsed, f"status {log.status}, accuracy {accuracy}"


def file_creation_micros(folder: Path, count: int = 500) -> float:
    """Microseconds to create one small file in a new folder under ``folder`` (nearly all of
    it the kernel's work). On this machine's disk it swings from ~12 to ~250 (it rises after
    many files were created and deleted there, as every run of this benchmark does): each row
    of ours creates a few."""
    with tempfile.TemporaryDirectory(dir=folder) as probe:
        started = time.perf_counter()
        for i in range(count):
            Path(probe, f"f{i}").write_bytes(b"x")
        return (time.perf_counter() - started) / count * 1e6


def made_under(root: Path) -> int:
    """How many files and folders a run left under ``root``."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--only", choices=["agentenv", "inspect"])
    args = parser.parse_args()
    ideal = args.rows * args.latency / args.in_flight
    print(f"{args.rows} rows, {args.latency * 1000:.0f} ms per answer, {args.in_flight} in flight: "
          f"ideal {ideal:.2f} s", flush=True)
    print(f"a new file in {tempfile.gettempdir()} takes {file_creation_micros(Path(tempfile.gettempdir())):.0f} µs "
          "here", flush=True)
    times = {}
    cores = os.cpu_count() or 1
    for name, run in (("agentenv_dagster", run_agentenv), ("inspect_ai", run_inspect)):
        if args.only and not name.startswith(args.only):
            continue
        with tempfile.TemporaryDirectory(prefix=f"fanout-{name}-") as tmp:
            os.environ["DAGSTER_HOME"] = str(Path(tmp) / ".dagster_home")
            busy = busy_cpu_seconds()
            elapsed, outcome = run(Path(tmp), args.rows, args.latency, args.in_flight)
            busy = busy_cpu_seconds() - busy if busy is not None else None
            made = made_under(Path(tmp))
        times[name] = elapsed
        # the CPU alone, spread perfectly over every core, already takes busy / cores of wall time
        cpu = f"{busy:6.1f} s CPU (/{cores} cores: {busy / cores / ideal:.2f}x ideal)" if busy is not None else ""
        print(f"  {name:<17} {elapsed:7.2f} s  ({elapsed / ideal:.2f}x ideal)  {cpu}  {outcome}\n"
              f"    files and folders made: {made:,} ({made / args.rows:.1f} a row)", flush=True)
    if len(times) == 2:
        ratio = times["agentenv_dagster"] / times["inspect_ai"]
        print(f"  agentenv_dagster / inspect_ai = {ratio:.2f}")


if __name__ == "__main__":
    sys.exit(main())
