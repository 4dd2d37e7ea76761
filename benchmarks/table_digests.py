"""Digests of the tables of a fixed set of varied runs: what a refactor must leave bit for bit alone.

Each case is a `simulate` command line (every policy, TP, fp8, a fleet behind a router, prefill/decode
pools, sessions, prefix caching, a KV host tier, a time-limited run, a `compare` rerun where the reference
table is beside the checkout). The script runs each in a
fresh process through the command line, so it runs the same on any revision whatever its module
layout, reads back the Parquet tables the command wrote, and prints a sha256 of each table's
contents (column names, types and values; not the file's metadata, which holds the date). Two
revisions give the same bits when their outputs are equal line for line:

    python -m benchmarks.table_digests > after.txt
    (cd OTHER_CHECKOUT && python -m benchmarks.table_digests) > before.txt
    diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

SERVING = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving"
SMALL = ["--num-requests", "300", "--input-len", "600", "--output-len", "120"]

CASES: dict[str, list[str]] = {
    "static": ["--policy", "static", "--rate", "8", *SMALL],
    "continuous": ["--policy", "continuous", "--rate", "12", "--num-requests", "400"],
    "chunked-lognormal": ["--policy", "chunked", "--rate", "10", "--input-len-dist", "lognormal",
                          "--output-len-dist", "exponential", "--seed", "3", *SMALL],
    "priority": ["--policy", "priority", "--priority-levels", "3", "--rate", "14", *SMALL],
    "closed-loop-tp2-fp8": ["--policy", "chunked", "--concurrency", "32", "--tensor-parallel-size", "2",
                            "--quantization", "fp8", "--kv-cache-dtype", "fp8", *SMALL],
    "measured-cost": ["--policy", "chunked", "--cost", "measured", "--rate", "9", *SMALL],
    "prefix-cache": ["--policy", "chunked", "--rate", "12", "--prefix-len", "400", "--num-prefixes", "4",
                     "--enable-prefix-caching", *SMALL],
    "sessions": ["--policy", "chunked", "--rate", "3", "--num-turns", "3", "--think-time", "2",
                 "--enable-prefix-caching", *SMALL],
    "fleet-least-loaded": ["--policy", "chunked", "--rate", "25", "--num-replicas", "3", "--router", "least-loaded",
                           *SMALL],
    "fleet-prefix-aware": ["--policy", "chunked", "--rate", "25", "--num-replicas", "2", "--router", "prefix-aware",
                           "--prefix-len", "300", "--num-prefixes", "6", "--enable-prefix-caching", *SMALL],
    "pd-pools": ["--policy", "chunked", "--rate", "20", "--prefill-replicas", "1", "--decode-replicas", "2", *SMALL],
    "time-limited": ["--policy", "continuous", "--rate", "30", "--time-limit", "20", *SMALL],
    "kv-pressure": ["--policy", "continuous", "--rate", "20", "--num-gpu-blocks-override", "600", *SMALL],
    "speculative": ["--policy", "chunked", "--rate", "20", "--num-gpu-blocks-override", "600", "--speculative-method",
                    "eagle", "--num-speculative-tokens", "3", "--spec-acceptance", "0.8,0.6,0.5", *SMALL],
    "kv-offload": ["--policy", "chunked", "--rate", "12", "--prefix-len", "400", "--num-prefixes", "24",
                   "--num-gpu-blocks-override", "500", "--kv-offload-gb", "0.2", *SMALL],
}
COMPARE_TABLE = SERVING / "aiconfigurator_silicon_vllm.csv"
COMPARE = ["compare", str(COMPARE_TABLE)]


def digest(frame: pl.DataFrame) -> str:
    """sha256 of a table's schema and values, row by row (floats to the last bit)."""
    h = hashlib.sha256(repr(frame.schema).encode())
    for column in frame.columns:
        series = frame[column]
        if series.dtype.is_float():
            series = series.cast(pl.Float64).to_physical()
            h.update(series.to_numpy().tobytes())
            h.update(series.is_null().to_numpy().tobytes())
        else:
            h.update(repr(series.to_list()).encode())
    return h.hexdigest()[:16]


def run_case(args: list[str], out: Path) -> dict[str, str]:
    command = [sys.executable, "-c", "from simulator.cli.main import run; run()", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)}
    files = sorted(out.glob("*.parquet")) if out.is_dir() else [out]
    return {path.name: digest(pl.read_parquet(path)) for path in files}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", help="which cases, comma-separated (default: all, and the compare rerun)")
    chosen = parser.parse_args().cases
    # The compare rerun reads the reference table beside the checkout; without it that case is left out.
    names = chosen.split(",") if chosen else [*CASES, *(["compare"] if COMPARE_TABLE.exists() else [])]
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            out = Path(tmp) / name
            if name == "compare":
                digests = run_case([*COMPARE, "--out", str(out.with_suffix(".parquet"))], out.with_suffix(".parquet"))
            else:
                digests = run_case(["run", *CASES[name], "--out", str(out)], out)
            for table, value in digests.items():
                print(f"{name:22s} {table:18s} {value}", flush=True)


if __name__ == "__main__":
    main()
