"""How fast the engine simulates: requests and simulated seconds per wall second, and peak memory.

Workloads (issue 4): (a) the chapter's, 2,000-token prompts and 300-token outputs, chunked prefill,
closed loop of 64 clients; (b) open loop at 12 req/s with the same lengths, for static, continuous
and chunked; (c) the Azure conversation trace, tiled end to end when more requests are asked for
than it holds. Each case runs in a fresh process so its peak RSS is its own. Speeds are printed as
ratios to real time (simulated seconds per wall second) and per request.

Run: python -m benchmarks.engine_speed [--sizes 10000,100000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from simulator.config import RunConfig
from simulator.metrics import build_tables, summarize
from simulator.simulate import simulate
from workloads import Workload, read_trace

AZURE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "traces" / "azure_conv_2023.csv"
CASES = {
    "a-chunked-c64": dict(policy="chunked", concurrency=64),
    "b-static-r12": dict(policy="static", rate=12.0),
    "b-continuous-r12": dict(policy="continuous", rate=12.0),
    "b-chunked-r12": dict(policy="chunked", rate=12.0),
    "c-azure-chunked": dict(policy="chunked", trace=str(AZURE)),
}


def tiled_trace(n: int) -> Workload:
    """The Azure trace repeated back to back (each copy starts one mean gap after the last) up to n."""
    trace = read_trace(AZURE)
    assert trace.arrival is not None
    copies = -(-n // trace.num_requests)
    span = float(trace.arrival[-1]) + float(np.mean(np.diff(trace.arrival)))
    arrival = np.concatenate([trace.arrival + i * span for i in range(copies)])[:n]
    return Workload(prompt_tokens=np.tile(trace.prompt_tokens, copies)[:n],
                    output_tokens=np.tile(trace.output_tokens, copies)[:n], arrival=arrival, concurrency=None)


def run_one(case: str, n: int) -> dict[str, float | str | int]:
    settings = dict(CASES[case])
    workload = None
    if "trace" in settings:
        workload = tiled_trace(n)
        settings.pop("trace")
    config = RunConfig(num_requests=n, **settings)  # type: ignore[arg-type]
    start = time.perf_counter()
    result = simulate(config, workload)
    simulated = time.perf_counter() - start
    summary = summarize(result, build_tables(result))
    wall = time.perf_counter() - start
    return {"case": case, "requests": n, "wall_s": wall, "engine_s": simulated,
            "simulated_s": summary["duration"], "steps": summary["num_steps"],
            "requests_per_wall_s": n / wall, "real_time_ratio": summary["duration"] / wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000", help="request counts, comma-separated")
    parser.add_argument("--cases", default=",".join(CASES), help="which workloads, comma-separated")
    parser.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]))))
        return
    print(f"{'case':<20}{'requests':>10}{'wall s':>9}{'req/s':>9}{'x real time':>13}{'steps':>10}{'peak MB':>9}")
    for n in (int(s) for s in args.sizes.split(",")):
        for case in args.cases.split(","):
            done = subprocess.run([sys.executable, "-m", "benchmarks.engine_speed", "--one", case, str(n)],
                                  capture_output=True, text=True, check=True)
            r = json.loads(done.stdout)
            print(f"{case:<20}{n:>10}{r['wall_s']:>9.2f}{r['requests_per_wall_s']:>9.0f}"
                  f"{r['real_time_ratio']:>13.1f}{r['steps']:>10}{r['peak_rss_mb']:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
