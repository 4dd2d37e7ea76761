"""How long `simulate plan` takes on the issue's 8B case, whole process, as a user runs it.

    simulate plan --model llama-3.1-8b --gpu h100_sxm --max-gpus 8 --input-len 2000 --output-len 300
        --slo 'p99_ttft_ms<=500' --slo 'p99_tpot_ms<=20' --out DIR

Runs it `--repeat` times (each into a fresh folder) with `--jobs` workers and prints each run's wall
time, its CPU time (user + system of the process and its workers) and the machine's 1-minute load
average before it started (on a shared machine a wall time means little without it), then the
median wall time and the pick. With `--rate R`, the fewest-GPUs question instead.

Run: python -m benchmarks.plan_speed [--jobs 2] [--repeat 3] [--rate R]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

CASE = ["--model", "llama-3.1-8b", "--gpu", "h100_sxm", "--max-gpus", "8", "--input-len", "2000", "--output-len",
        "300", "--slo", "p99_ttft_ms<=500", "--slo", "p99_tpot_ms<=20"]


def one(out: Path, jobs: int, rate: float | None) -> tuple[float, float, float, str]:
    """(wall s, CPU s, load average before, the pick line) of one whole `simulate plan` process."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    extra = ["--rate", str(rate)] if rate is not None else []
    command = [sys.executable, "-c", "from simulator.cli.main import run; run()", "plan", *CASE, *extra,
               "--jobs", str(jobs), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    pick = next((line for line in done.stdout.splitlines() if line.startswith("pick:")), "no pick")
    assert pl.read_parquet(out / "plan.parquet").height > 0
    return wall, cpu, load, pick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=float, default=None)
    args = parser.parse_args()
    print(f"simulate plan {' '.join(CASE)}{f' --rate {args.rate:g}' if args.rate else ''} --jobs {args.jobs}; "
          f"{len(os.sched_getaffinity(0))} cores")
    print(f"{'run':>4}{'wall s':>9}{'CPU s':>9}{'load before':>13}")
    walls = []
    with tempfile.TemporaryDirectory() as scratch:
        for i in range(args.repeat):
            wall, cpu, load, pick = one(Path(scratch) / f"plan{i}", args.jobs, args.rate)
            walls.append(wall)
            print(f"{i + 1:>4}{wall:>9.1f}{cpu:>9.1f}{load:>13.2f}")
    print(f"median wall {statistics.median(walls):.1f} s; {pick}")


if __name__ == "__main__":
    main()
