"""How long `simulate` takes to start: whole processes, this checkout against a baseline revision.

Three processes, each timed whole (interpreter start-up included), the median of `--runs`:
- `simulate --help`: the command list;
- `import phase of run`: `simulate run --num-requests 0`, which imports everything `simulate run`
  imports and then refuses its first setting, before any simulation (exit status 2);
- `1-request run`: `simulate run --num-requests 1 --no-tokens --out TMP`, start to finish.

`--baseline REV` measures the same processes, in the same benchmark run and interleaved with this
checkout's, on servesim as it was at git revision REV (checked out into a temporary worktree;
default: the last commit before the one-engine redesign), and prints the ratio. Each process runs
once untimed first, so neither side pays for compiling its bytecode.

Run: python -m benchmarks.startup [--runs 7] [--baseline REV | --no-baseline]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.engine_speed import BASELINE, baseline_tree

ROOT = Path(__file__).resolve().parents[1]
CLI = "from simulator.cli.main import run; run()"
REFUSED = {"import phase of run": 2}
"""The cases whose process ends in a refusal, and its exit status; the others exit 0."""
CASES = {
    "simulate --help": ["-c", CLI, "--help"],
    "import phase of run": ["-c", CLI, "run", "--num-requests", "0"],
    "1-request run": ["-c", CLI, "run", "--num-requests", "1", "--no-tokens", "--out"],
}


def time_once(tree: Path, case: str) -> float:
    """Seconds of one whole process of `case` on the servesim in `tree`."""
    args = CASES[case]
    with tempfile.TemporaryDirectory() as scratch:
        if args[-1] == "--out":
            args = [*args, str(Path(scratch) / "run")]
        env = os.environ | {"PYTHONPATH": str(tree)}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, *args], cwd=scratch, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
    if done.returncode != REFUSED.get(case, 0):
        raise RuntimeError(f"{case} on {tree} exited {done.returncode}: {done.stderr.strip()}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="timed processes per case and tree (the median is shown)")
    parser.add_argument("--baseline", default=BASELINE, help="git revision to compare against")
    parser.add_argument("--no-baseline", action="store_true", help="measure this checkout only")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    trees = {"this checkout": ROOT}
    if not args.no_baseline:
        trees[f"baseline {args.baseline}"] = baseline_tree(args.baseline)
    try:
        for case in CASES:
            for tree in trees.values():
                time_once(tree, case)  # untimed: compiles the tree's bytecode
        times: dict[tuple[str, str], list[float]] = {(case, name): [] for case in CASES for name in trees}
        for _ in range(args.runs):  # rounds of every case on every tree, so a busy moment hits them all alike
            for case in CASES:
                for name, tree in trees.items():
                    times[case, name].append(time_once(tree, case))
        print(f"median of {args.runs} whole processes, seconds")
        print(f"{'':<22}" + "".join(f"{name:>22}" for name in trees) + ("   this / baseline" if len(trees) > 1 else ""))
        for case in CASES:
            medians = [statistics.median(times[case, name]) for name in trees]
            line = f"{case:<22}" + "".join(f"{m:>22.3f}" for m in medians)
            if len(medians) > 1:
                line += f"{medians[0] / medians[1]:>18.2f}"
            print(line)
    finally:
        for tree in trees.values():
            if tree != ROOT:
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


if __name__ == "__main__":
    main()
