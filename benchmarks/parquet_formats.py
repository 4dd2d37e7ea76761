"""How a run folder's tables are written: Parquet encodings and compressions timed side by side.

One chunked run at 12 req/s (the chapter's lengths, `--requests` of them) gives the requests, steps
and tokens tables; each is written with pyarrow in each of `WAYS` (the fastest of `--repeat`
writes), and its size and the time to read it back are printed. `ours` marks the way
`simulate run` writes that table (`simulator/outputs/run_folder.py` for the requests and steps
tables, `simulator/metrics/tokens.py` for the tokens table).

Run: python -m benchmarks.parquet_formats [--requests 30000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from simulator.config import RunConfig
from simulator.metrics.summary import build_tables
from simulator.run.simulate import simulate

WAYS: dict[str, dict[str, object]] = {
    "dictionary, snappy (pyarrow's default)": {},
    "plain, snappy": {"use_dictionary": False},
    "plain, zstd": {"use_dictionary": False, "compression": "zstd"},
}
OURS = {"requests": "plain, snappy", "steps": "plain, snappy", "tokens": "plain, zstd"}


def best_of(repeat: int, action) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    result = simulate(RunConfig(num_requests=args.requests, policy="chunked", rate=12.0))
    tables = build_tables(result)
    print(f"{'table':<9}{'rows':>11}  {'way':<40}{'write ms':>9}{'MB':>7}{'read ms':>9}")
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "table.parquet"
        for name in ("requests", "steps", "tokens"):
            table = getattr(tables, name).to_arrow()
            for way, options in WAYS.items():
                write = best_of(args.repeat, lambda: pq.write_table(table, path, **options))  # noqa: B023
                read = best_of(args.repeat, lambda: pq.read_table(path))
                mark = "  ours" if OURS[name] == way else ""
                print(f"{name:<9}{table.num_rows:>11,}  {way:<40}{write * 1000:>9.0f}"
                      f"{os.path.getsize(path) / 1e6:>7.1f}{read * 1000:>9.0f}{mark}")


if __name__ == "__main__":
    main()
