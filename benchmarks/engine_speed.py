"""How fast the engine simulates: requests and simulated seconds per wall second, and peak memory.

Workloads (issue 4): (a) the chapter's, 2,000-token prompts and 300-token outputs, chunked prefill,
closed loop of 64 clients; (b) open loop at 12 req/s with the same lengths, for static, continuous
and chunked; (c) the Azure conversation trace, tiled end to end when more requests are asked for
than it holds. Each case runs in a fresh process so its peak RSS is its own. A run is the simulation
plus its summary (every metric, ITL included), not the tokens table, which a user asks for by
writing a run folder. Speeds are printed per wall second and as ratios: simulated seconds per
wall second (x real time) and, at the sizes in --reference-sizes, the fast engine against the
reference one-event-per-step engine (`--engine reference`) run on the same workload in the same
benchmark run.

Run: python -m benchmarks.engine_speed [--sizes 10000,100000,1000000] [--reference-sizes 10000]
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


def run_one(case: str, n: int, engine: str) -> dict[str, float | str | int]:
    settings = dict(CASES[case])
    workload = None
    if "trace" in settings:
        workload = tiled_trace(n)
        settings.pop("trace")
    config = RunConfig(num_requests=n, engine=engine, **settings)  # type: ignore[arg-type]
    start = time.perf_counter()
    result = simulate(config, workload)
    simulated = time.perf_counter() - start
    summary = summarize(result, build_tables(result, tokens=False))
    wall = time.perf_counter() - start
    return {"case": case, "engine": engine, "requests": n, "wall_s": wall, "engine_s": simulated,
            "simulated_s": summary["duration"], "steps": summary["num_steps"],
            "requests_per_wall_s": n / wall, "real_time_ratio": summary["duration"] / wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def measure(case: str, n: int, engine: str) -> dict[str, float | str | int]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.engine_speed", "--one", case, str(n), engine],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="request counts, comma-separated")
    parser.add_argument("--reference-sizes", default="10000",
                        help="sizes at which the reference engine runs too, for the speed-up column ('' for none)")
    parser.add_argument("--cases", default=",".join(CASES), help="which workloads, comma-separated")
    parser.add_argument("--one", nargs=3, metavar=("CASE", "N", "ENGINE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.one[2])))
        return
    reference_sizes = {int(s) for s in args.reference_sizes.split(",") if s}
    print(f"{'case':<18}{'engine':>10}{'requests':>10}{'wall s':>9}{'req/s':>9}{'x real time':>13}"
          f"{'steps':>10}{'peak MB':>9}{'x reference':>13}")
    for n in (int(s) for s in args.sizes.split(",")):
        for case in args.cases.split(","):
            runs = [measure(case, n, "fast")]
            if n in reference_sizes:
                runs.append(measure(case, n, "reference"))
            for r in runs:
                ratio = (f"{r['requests_per_wall_s'] / runs[1]['requests_per_wall_s']:>13.1f}"  # type: ignore[operator]
                         if len(runs) == 2 else f"{'':>13}")
                print(f"{case:<18}{r['engine']:>10}{n:>10}{r['wall_s']:>9.2f}{r['requests_per_wall_s']:>9.0f}"
                      f"{r['real_time_ratio']:>13.1f}{r['steps']:>10}{r['peak_rss_mb']:>9.0f}{ratio}", flush=True)


if __name__ == "__main__":
    main()
