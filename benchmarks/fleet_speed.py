"""How fast a fleet simulates against the single-server runs it is made of.

The chapter's workload (2,000-token prompts, 300-token outputs, H100, Llama-3.1-8B), Poisson
arrivals at `--rate` per server (8 req/s: one server keeps up): one run of `--replicas` replicas
(`--router`, round robin by default) at `replicas x rate` with `replicas x requests` requests,
against `--replicas` runs of one server at `rate` with `requests` each (seeds 0, 1, ...). Each
run is its own process; `engine s` is the simulation and its summary inside it (ITL included),
`wall s` the whole process. Printed: each run, then the fleet's time over the singles' total, for
both (the issue's bound: 1.5).

Run: python -m benchmarks.fleet_speed [--requests 25000] [--replicas 4] [--policy chunked] [--router R]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def one(policy: str, rate: float, requests: int, replicas: int, seed: int, router: str) -> dict[str, Any]:
    """One run, timed inside this process."""
    from simulator.config import RunConfig
    from simulator.metrics.summary import build_tables, summarize
    from simulator.run.simulate import simulate

    start = time.perf_counter()
    result = simulate(RunConfig(policy=policy, rate=rate, num_requests=requests, num_replicas=replicas, seed=seed,
                                router=router if replicas > 1 else "round-robin"))
    summary = summarize(result, build_tables(result, tokens=False))
    return {"engine_s": time.perf_counter() - start, "steps": summary["num_steps"],
            "completed": summary["completed"], "kept_up": summary["kept_up"]}


def measure(policy: str, rate: float, requests: int, replicas: int, seed: int, router: str) -> dict[str, Any]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "benchmarks.fleet_speed", "--one", policy, str(rate), str(requests),
                           str(replicas), str(seed), router], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout) | {"wall_s": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=25000, help="requests per server")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rate", type=float, default=8.0, help="req/s per server")
    parser.add_argument("--policy", default="chunked")
    parser.add_argument("--router", default="round-robin", help="the fleet's router")
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        policy, rate, requests, replicas, seed, router = args.one
        print(json.dumps(one(policy, float(rate), int(requests), int(replicas), int(seed), router)))
        return
    n, k = args.requests, args.replicas
    singles = [measure(args.policy, args.rate, n, 1, seed, args.router) for seed in range(k)]
    fleet = measure(args.policy, args.rate * k, n * k, k, 0, args.router)
    print(f"{'run':<28}{'requests':>9}{'steps':>10}{'engine s':>10}{'wall s':>9}  kept up")
    for seed, run in enumerate(singles):
        print(f"{f'1 server, seed {seed}':<28}{n:>9}{run['steps']:>10}{run['engine_s']:>10.2f}{run['wall_s']:>9.2f}"
              f"  {run['kept_up']}")
    print(f"{f'{k} replicas, {args.router}':<28}{n * k:>9}{fleet['steps']:>10}{fleet['engine_s']:>10.2f}"
          f"{fleet['wall_s']:>9.2f}  {fleet['kept_up']}")
    for key, label in (("engine_s", "engine"), ("wall_s", "wall")):
        total = sum(run[key] for run in singles)
        print(f"{label}: fleet {fleet[key]:.2f} s / singles {total:.2f} s = {fleet[key] / total:.2f}")


if __name__ == "__main__":
    main()
