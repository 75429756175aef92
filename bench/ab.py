"""Two versions of the code on the fan-out benchmark, taking turns, in both orders.

    python bench/ab.py <git ref> [--pairs 4] [--rows 1000] [--latency 0.2]

Runs ``bench/fanout.py --only agentenv`` from a worktree of ``<ref>`` (the baseline, A) and from
this checkout (B), a pair at a time, A first in even pairs and B first in odd ones. On this
machine the second run of a pair is ~0.3 s slower whichever code it runs (measured 2026-12-06
over ten pairs), which pairs that always run the baseline first count against the change. With
both orders the effect and that order penalty separate: the mean B − A difference is
``effect + penalty`` over pairs run A first and ``effect − penalty`` over pairs run B first.
Prints every run, then the effect on wall time and CPU seconds (with the penalty).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import mean

HERE = Path(__file__).resolve().parents[1]
RESULT = re.compile(r"agentenv_dagster\s+([\d.]+) s\b.*?([\d.]+) s CPU")


def run(tree: Path, rows: int, latency: float) -> tuple[float, float]:
    """One fan-out of ``tree``'s code, with its own benchmark script: (wall, CPU) seconds."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, str(tree / "bench" / "fanout.py"), "--only", "agentenv", "--rows", str(rows),
         "--latency", str(latency)],
        cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True, check=True,
    ).stdout
    found = RESULT.search(out)
    if found is None:
        raise SystemExit(f"no result line in the output of {tree}:\n{out}")
    return float(found[1]), float(found[2])


def effect(first_a: list[float], first_b: list[float]) -> tuple[float, float | None]:
    """(effect, order penalty) from B − A differences of pairs run A first and B first; with
    one order only, the penalty is unknown and the effect is that order's mean."""
    if first_a and first_b:
        return (mean(first_a) + mean(first_b)) / 2, (mean(first_a) - mean(first_b)) / 2
    return mean(first_a or first_b), None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the baseline: a commit, branch or tag of this repository")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="agentenv-ab-") as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(HERE), "worktree", "add", "--detach", "-q", str(base), args.ref], check=True)
        try:
            for tree in (base, HERE):  # bytecode for both: with PYTHONDONTWRITEBYTECODE (set here) a tree
                # without it compiles the package again in every process it starts (~0.3 s each)
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "agentenv_dagster")], check=True)
            diffs: dict[bool, dict[str, list[float]]] = {True: {"wall": [], "cpu": []}, False: {"wall": [], "cpu": []}}
            for pair in range(args.pairs):
                a_first = pair % 2 == 0
                order = [("A", base), ("B", HERE)] if a_first else [("B", HERE), ("A", base)]
                results = {}
                for name, tree in order:
                    results[name] = run(tree, args.rows, args.latency)
                    print(f"pair {pair + 1} {name}: {results[name][0]:6.2f} s  {results[name][1]:5.1f} s CPU", flush=True)
                diffs[a_first]["wall"].append(results["B"][0] - results["A"][0])
                diffs[a_first]["cpu"].append(results["B"][1] - results["A"][1])
        finally:
            subprocess.run(["git", "-C", str(HERE), "worktree", "remove", "--force", str(base)], check=False)
    for measure in ("wall", "cpu"):
        change, penalty = effect(diffs[True][measure], diffs[False][measure])
        said = f"(second run of a pair: {penalty:+.2f} s)" if penalty is not None else "(one order only)"
        print(f"B − A {measure:4s}: {change:+.2f} s {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
