"""Prefix caching: what it costs the simulator, and what it does to the Mooncake trace.

`speed`: case (a) of `benchmarks.engine_speed` (2,000-token prompts, 300-token outputs, chunked
prefill, 64 clients) with the cache on and off; a workload without prefix identity never touches
the cache, so on is the uncached run. Then case (a) with prefix identity: every prompt one of 8
shared 1,000-token prefixes and then 1,000 tokens of its own (`--prefix-len 1000 --num-prefixes 8
--input-len 1000`), on and off. Each is simulated and summarised in this process, alternating on and
off, `--repeat` times; the medians of the engine's wall time and their ratio are printed.

`mooncake`: the first `--num-requests` requests of the Mooncake conversation trace, replayed at
`--trace-speed` with the cache on and off: hit rate, TTFT, and the hit rate over time (each tenth of
the run, as text bars). With `--kv-offload-gb`, also with the cache on and a host tier of that many
GB (`trace`: sized to hold every block the replayed requests compute), its hit rate split into the
GPU's and the host's, and with a GPU cache that never evicts (`--num-gpu-blocks-override` at every
block the replayed requests compute): the hit rate a host tier can approach.

Run: python -m benchmarks.prefix_cache speed [--sizes 20000] [--repeat 3]
     python -m benchmarks.prefix_cache mooncake [--num-requests 2000] [--trace-speed 0.2] [--kv-offload-gb trace]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "reference" / "traces" / "mooncake_conversation.jsonl"
CASE_A = dict(policy="chunked", concurrency=64)
SHARED = dict(prefix_len=1000, num_prefixes=8, input_len=1000)


def engine_seconds(settings: dict[str, object], n: int) -> float:
    from simulator.config import RunConfig
    from simulator.metrics.summary import build_tables, summarize
    from simulator.run.simulate import simulate

    start = time.perf_counter()
    result = simulate(RunConfig(num_requests=n, **settings))  # type: ignore[arg-type]
    summarize(result, build_tables(result, tokens=False))
    return time.perf_counter() - start


def speed(sizes: list[int], repeat: int) -> None:
    print(f"{'case':<28}{'requests':>9}{'off s':>9}{'on s':>9}{'on / off':>10}")
    for name, settings in (("a-chunked-c64", CASE_A), ("a-chunked-c64-shared-prefix", CASE_A | SHARED)):
        for n in sizes:
            runs: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(repeat):
                for on in (False, True):
                    runs[on].append(engine_seconds(settings | {"enable_prefix_caching": on}, n))
            off, on_ = statistics.median(runs[False]), statistics.median(runs[True])
            print(f"{name:<28}{n:>9}{off:>9.2f}{on_:>9.2f}{on_ / off:>10.2f}")


def mooncake_runs(num_requests: int, trace_speed: float, offload: str | None = None) -> list[tuple[str, Any]]:
    """The replay's runs, (label, RunConfig): the cache on; with `offload`, on with a host tier of
    that many GB ('trace': every block the replayed requests compute) and on with a GPU cache of
    every such block (which never evicts); the cache off."""
    from simulator.config import RunConfig
    from simulator.deploy.model import load_model
    from simulator.run.sizing import gpu_shard
    from workloads import read_trace

    config = RunConfig(policy="chunked", trace=str(MOONCAKE), num_requests=num_requests, trace_speed=trace_speed)
    runs: list[tuple[str, Any]] = [("on", config)]
    if offload is not None:
        trace = read_trace(str(MOONCAKE), speed=trace_speed, limit=num_requests)
        every_block = int(np.sum(-(-(trace.prompt_tokens + trace.output_tokens) // config.block_size)))
        block_gb = gpu_shard(config, load_model(config.model)).kv_bytes_per_token * config.block_size / 1e9
        gb = every_block * block_gb if offload == "trace" else float(offload)
        runs += [(f"on + {gb:.0f} GB host", replace(config, kv_offload_gb=gb)),
                 ("on, GPU unbounded", replace(config, num_gpu_blocks_override=every_block))]
    return [*runs, ("off", replace(config, enable_prefix_caching=False))]


def mooncake(num_requests: int, trace_speed: float, offload: str | None = None) -> None:
    from simulator.metrics.summary import build_tables, summarize
    from simulator.run.simulate import simulate

    runs = mooncake_runs(num_requests, trace_speed, offload)
    config = runs[0][1]
    print(f"Mooncake conversation trace, first {num_requests} requests at {trace_speed:g}x, {config.model} on "
          f"{config.gpu}, {config.policy}:")
    print(f"{'prefix caching':<22}{'hit rate':>10}{'GPU':>8}{'host':>8}{'mean TTFT s':>13}{'median':>9}{'p99':>9}"
          f"{'kept up':>9}")
    for label, run in runs:
        result = simulate(run)
        tables = build_tables(result, tokens=False)
        summary = summarize(result, tables)
        on = run.enable_prefix_caching
        rates = [f"{summary[key]:.1%}" if on else "-" for key in
                 ("prefix_cache_hit_rate", "prefix_cache_hit_rate_gpu", "prefix_cache_hit_rate_host")]
        print(f"{label:<22}{rates[0]:>10}{rates[1]:>8}{rates[2]:>8}{summary['mean_ttft']:>13.2f}"
              f"{summary['median_ttft']:>9.2f}{summary['p99_ttft']:>9.2f}{summary['kept_up']!s:>9}")
        if label == "on":
            steps = tables.steps.filter(tables.steps["prefix_cache_queried_tokens"] > 0)
            start = steps["start"].to_numpy()
            tenth = np.minimum((start - start[0]) / (start[-1] - start[0]) * 10, 9).astype(np.int64)
            queried = np.bincount(tenth, weights=steps["prefix_cache_queried_tokens"].to_numpy(), minlength=10)
            hit = np.bincount(tenth, weights=steps["prefix_cache_hit_tokens"].to_numpy(), minlength=10)
            bars = [(start[0] + (start[-1] - start[0]) * i / 10, h / q if q else 0.0)
                    for i, (h, q) in enumerate(zip(hit, queried, strict=True))]
    print("hit rate over time (caching on), each tenth of the run from its start (s):")
    for at, share in bars:
        print(f"  {at:>8.0f} s {share:>6.1%} {'#' * round(share * 50)}")


def offload_size(text: str) -> str:
    """`--kv-offload-gb`: GB (a number) or 'trace'."""
    if text != "trace":
        float(text)  # argparse says "invalid offload_size value" for what is not a number
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["speed", "mooncake"])
    parser.add_argument("--sizes", default="20000", help="speed: request counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="speed: runs of each, alternating on and off")
    parser.add_argument("--num-requests", type=int, default=2000, help="mooncake: the trace's first N requests")
    parser.add_argument("--trace-speed", type=float, default=0.2, help="mooncake: replay speed")
    parser.add_argument("--kv-offload-gb", default=None, type=offload_size,
                        help="mooncake: also a host tier of this many GB ('trace': every block of the replay), "
                             "and a GPU cache that never evicts")
    args = parser.parse_args()
    if args.what == "speed":
        speed([int(s) for s in args.sizes.split(",")], args.repeat)
    else:
        mooncake(args.num_requests, args.trace_speed, args.kv_offload_gb)


if __name__ == "__main__":
    main()
