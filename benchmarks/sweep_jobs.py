"""How a sweep's wall time scales with --jobs on this machine.

Runs the same sweep (3 policies x 4 rates, 1,000 requests each by default) with 1, 2, ... up to
the machine's cores (and one oversubscribed count), each into a fresh file, and prints each wall
time as a speed-up over --jobs 1 measured in the same run.

    python benchmarks/sweep_jobs.py [--num-requests 1000] [--max-jobs N]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import polars as pl

from simulator.sweep.grid import SweepSpec, run_sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-requests", type=int, default=1000)
    parser.add_argument("--max-jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    spec = SweepSpec({"policy": ["static", "continuous", "chunked"], "rate": [4.0, 8.0, 12.0, 16.0],
                      "num_requests": [args.num_requests]})
    counts = sorted({*range(1, args.max_jobs + 1), 2 * args.max_jobs})
    print(f"{len(spec.settings())} configurations x {args.num_requests} requests, {os.cpu_count()} CPUs")
    print(f"{'jobs':>5}{'wall (s)':>10}{'speed-up':>10}{'per core':>10}")
    reference_rows = None
    reference_time = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for jobs in counts:
            out = Path(scratch) / f"jobs{jobs}.parquet"
            start = time.perf_counter()
            run_sweep(spec, out, jobs=jobs)
            wall = time.perf_counter() - start
            rows = pl.read_parquet(out)
            if reference_rows is None:
                reference_rows, reference_time = rows, wall
            assert rows.equals(reference_rows), f"--jobs {jobs} changed the rows"
            speedup = reference_time / wall
            print(f"{jobs:>5}{wall:>10.2f}{speedup:>10.2f}{speedup / min(jobs, os.cpu_count() or 1):>10.2f}")


if __name__ == "__main__":
    main()
