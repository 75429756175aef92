"""A 1,000-row dataset through agentenv_dagster and through Inspect AI, in one invocation.

The same rows (a sentence to classify), the same model behaviour (a keyword rule answering
after ``--latency`` seconds) and the same concurrency (``--in-flight``) on both sides:

(a) agentenv_dagster: a Coder Eval task with ``dataset``, run as ``--shards`` concurrent Dagster
    runs over slices of the rows (default: one per core, at most 2; each row a partition of the
    job, every op running its step for all its run's rows; the 32 rows in flight shared out
    between the runs; each core's slice in runs that take turns at the agent, four for 1,000
    rows) — sandboxes, the replay agent answering over real A2A in the run's agent host, a
    deterministic ``classification_match`` criterion, per-row asset materializations, the
    suite rollup and the reports;
(b) Inspect AI: its ``mockllm`` model answering through ``custom_outputs`` after the same
    delay, ``max_samples`` = ``max_connections`` = the same concurrency, an exact ``match``.

It prints both wall times, their ratio, each against the ideal (rows × latency / in flight),
and the CPU seconds the machine was busy during each (every process: the runs, the agent host;
steadier than wall time on a shared machine), divided by the cores: the wall time the work
would take with no waiting at all, against the ideal. Where that is near or above 1.2 the
machine's cores, not the waiting, bound both tools (``--latency 1.0`` asks for a fifth of the
CPU a second). Then, from the runs' event logs, where agentenv_dagster's time went: when the
runs started, each op's span over every shard run (the agent op also waits for the run's agent
host, forked as the runs start, to come up), the suite asset's run (started as the rows run,
its op waiting for them) and the command's work after the runs, and how close the prompts
alone came to their ideal. And, before the runs, how long creating a file takes in the temp
folder (on this machine it swings more than tenfold, with the files created and deleted there
before), and after each tool's run how many files and folders it made (ours: a row's
sandbox, its agent's answer, its trajectory, its task.json and that file's two folders). Needs
``pip install -e '.[bench]'``.

    python bench/fanout.py [--rows 1000] [--latency 0.2] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

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


def run_agentenv(root: Path, n: int, latency: float, in_flight: int, shards: int) -> tuple[float, str]:
    import dagster as dg

    from agentenv_dagster.config import load_config
    from agentenv_dagster.orchestration.coder_eval import run_coder_eval_task
    from agentenv_dagster.orchestration.execute import dagster_yaml

    task = project(root, n, latency)
    config = load_config(root)
    home = root / ".dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml(home))  # the project's local instance, as the CLI makes it
    with dg.DagsterInstance.from_config(str(home)) as instance:
        started, clock = time.perf_counter(), time.time()
        done = run_coder_eval_task(task, config, instance=instance, rows_in_flight=in_flight,
                                   output_dir=root / "out")
        elapsed = time.perf_counter() - started
        phases = phase_lines(instance, clock, clock + elapsed, n * latency / in_flight)
    passed = sum(r.final_status.value == "SUCCESS" for r in done.results)
    return elapsed, f"{passed}/{len(done.results)} rows passed\n" + "\n".join(phases)


def phase_lines(instance, start: float, end: float, ideal: float) -> list[str]:
    """Where the wall time went, from the runs' event logs: each op from its first start to its
    last end over the shard runs (the ops of a run go one after another, and every op runs its
    step for all the run's rows), then what the command did once the runs had ended. Shows
    how close the prompts come to their ideal, and what happens before and after them."""
    from dagster import DagsterEventType as Event

    spans: dict[str, list[float]] = {}
    suite: list[float] = []
    for record in instance.get_run_records():
        logs = instance.all_logs(record.dagster_run.run_id, of_type={
            Event.RUN_START, Event.RUN_SUCCESS, Event.RUN_FAILURE, Event.STEP_START, Event.STEP_SUCCESS,
            Event.STEP_FAILURE})
        if record.dagster_run.job_name.startswith("__"):  # the suite asset's own run
            suite += [e.timestamp for e in logs]
            continue
        for entry in logs:
            name = entry.step_key or "run"
            spans.setdefault(name, [entry.timestamp, entry.timestamp])
            spans[name] = [min(spans[name][0], entry.timestamp), max(spans[name][1], entry.timestamp)]
    runs_end = spans.pop("run", [start, start])[1]
    first_op = min((first for first, _ in spans.values()), default=runs_end)
    rows = [(start, first_op, "the runs start (fork, Dagster run, resources)"),
            *((first, last, name) for name, (first, last) in spans.items()),
            *([(min(suite), max(suite), "the suite asset's run")] if suite else []),
            (runs_end, end, "after the runs: each row's result, the reports")]
    lines = [f"    {first - start:6.2f}-{last - start:6.2f} s  {name}" for first, last, name in sorted(rows)]
    if "prompt" in spans:
        took = spans["prompt"][1] - spans["prompt"][0]
        lines.append(f"    the prompts took {took:.2f} s against their ideal {ideal:.2f} s ({took / ideal:.2f}x); "
                     f"everything else {end - start - took:.2f} s")
    return ["  where the time went (seconds from the start; each op over every shard run):", *lines]


def run_inspect(root: Path, n: int, latency: float, in_flight: int, shards: int) -> tuple[float, str]:
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


def busy_cpu_seconds() -> float | None:
    """Seconds the machine's CPUs spent busy so far (Linux's /proc/stat), None elsewhere."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


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
    parser.add_argument("--shards", type=int, default=min(os.cpu_count() or 1, 2),
                        help="agentenv_dagster: concurrent runs over slices of the rows (default: cores, at most 2)")
    args = parser.parse_args()
    ideal = args.rows * args.latency / args.in_flight
    print(f"{args.rows} rows, {args.latency * 1000:.0f} ms per answer, {args.in_flight} in flight: "
          f"ideal {ideal:.2f} s; agentenv_dagster in {args.shards} shard(s), a core's rows in up to four runs "
          "that take turns when they are enough", flush=True)
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
            elapsed, outcome = run(Path(tmp), args.rows, args.latency, args.in_flight, args.shards)
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
