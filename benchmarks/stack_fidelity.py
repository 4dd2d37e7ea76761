"""Per-stack fidelity on aiconfigurator's measured rows, and which hypothesis about how they were
measured the data supports.

Reruns the aggregated rows of the dense models of the table (`simulator.sim2real.measured`, `STUDIED`:
Qwen3-32B on H100 under vLLM, SGLang and TensorRT-LLM; Llama-3.1-8B fp8 on H200 under vLLM) on each stack's
profile, under each hypothesis (`VARIANTS`: the server's scheduler, the client's prompt pool, the
sweep order, the request counts), and prints the median |error| of mean TTFT and mean TPOT per stack,
on the rows a fit may use (TP 2 and 8) and on those held out (TP 1 and 4, and every Llama-3.1-8B
row). Seconds of CPU: about one per row and variant (2 processes). `--models` reruns other models'
aggregated rows instead (every one held out: nothing was fitted on them).

Where a model has rows of 8,192 prompt and 1,024 output tokens and of 1,024 and 8,192 at the same
concurrency, it also prints the prefill stall per output token: the first row's TPOT less the
second's, measured and simulated. Each request's decode is stalled by the prompts computed while
it decodes; clients that stay in lockstep see fewer of them than clients that do not
(`supported-desync`), so the stall says which the measured clients did, whatever their TTFT.

    python -m benchmarks.stack_fidelity [--variants bench-pool-sweep,...] [--models m1,m2]
        [--profile-suffix ""] [--out rows.parquet]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from simulator.sim2real.compare import default_profile
from simulator.sim2real.measured import MeasuredPoint, read_measured
from simulator.sim2real.sweeps import SUPPORTED, Hypothesis, Unit, sweep_units

SERVING = Path(__file__).resolve().parents[2] / "shared" / "reference" / "serving"
UPSTREAM = SERVING / "aiconfigurator_silicon_h100_h200.csv"
FITTED_TP = (2, 8)
STUDIED = ("qwen3-32b", "llama-3.1-8b")
"""The models of the rows this page studies (the aggregated rows of the dense models of the table)."""
AIPERF_ENTRIES = 100
"""aiperf's default `--num-dataset-entries`."""
DESYNC_SPREAD = 0.1
"""`supported-desync`'s output-length spread (`Hypothesis.output_spread`): +-10% of the row's."""


@dataclass(frozen=True)
class Variant:
    """One hypothesis of how the rows were measured, and the warm-up and measured requests per
    client (the reader's 1 and 10; aiconfigurator's templates: 2 and 20)."""

    hypothesis: Hypothesis
    warmup: int = 1
    measured: int = 10
    text_token: int = 0
    """The output token (0-based) whose arrival the TTFT is counted at (`Replay.ttft_at`)."""


VARIANTS = {
    "vllm-default": Variant(Hypothesis("vllm-default")),
    "stock": Variant(Hypothesis("stock")),
    "bench": Variant(Hypothesis("bench")),
    "bench-pool": Variant(Hypothesis("bench", AIPERF_ENTRIES)),
    "bench-pool-sweep": Variant(Hypothesis("bench", AIPERF_ENTRIES, True)),
    "stock-pool-sweep": Variant(Hypothesis("stock", AIPERF_ENTRIES, True)),
    "bench-pool-sweep-2x20": Variant(Hypothesis("bench", AIPERF_ENTRIES, True), 2, 20),
    "stock-nccl": Variant(Hypothesis("stock", disable_custom_all_reduce=True)),
    "bench-nccl": Variant(Hypothesis("bench", disable_custom_all_reduce=True)),
    "supported": Variant(Hypothesis("per-stack")),
    "supported-2x20": Variant(Hypothesis("per-stack"), 2, 20),
    "supported-desync": Variant(Hypothesis("per-stack", output_spread=DESYNC_SPREAD)),
    "supported-desync-text3": Variant(Hypothesis("per-stack", output_spread=DESYNC_SPREAD), text_token=3),
    "supported-text3": Variant(Hypothesis("per-stack"), text_token=3),
    "supported-pool": Variant(Hypothesis("per-stack", AIPERF_ENTRIES)),
}
"""`supported`: each stack under the hypothesis its fitted rows support (`sweeps.SUPPORTED`);
`supported-desync`: the same with output lengths spread, so the closed loop can leave lockstep;
`-text3`: and the TTFT counted at the fourth output token, as aiperf counts it for a model whose
first three carry no text (gpt-oss's harmony header, `<|channel|>analysis<|message|>`);
`supported-text3`: that count with the clients in lockstep; `supported-pool`: each stack's rule
with aiperf's default pool of 100 prompts, so repeats hit the prefix cache."""


def studied_rows(path: Path, models: tuple[str, ...] = STUDIED) -> list[MeasuredPoint]:
    """The aggregated closed-loop rows of `models` in the silicon table `path`."""
    return [p for p in read_measured(path).points if p.mode == "agg" and p.model in models and p.concurrency]


def held_out(point: MeasuredPoint) -> bool:
    return point.tensor_parallel_size not in FITTED_TP or point.model != "qwen3-32b"


def rerun_rows(job: tuple[Unit, str, Variant, str]) -> list[dict[str, Any]]:
    unit, variant_name, variant, suffix = job
    points = [replace(p, warmup=variant.warmup * (p.concurrency or 1),
                      num_requests=variant.measured * (p.concurrency or 1)) for p in unit.points]
    profile = default_profile(points[0].gpu, points[0].backend) + suffix
    rows = []
    hypothesis = variant.hypothesis
    if hypothesis.scheduler == "per-stack":
        hypothesis = replace(SUPPORTED[points[0].backend], output_spread=hypothesis.output_spread,
                             num_dataset_entries=hypothesis.num_dataset_entries)
    for point, run in hypothesis.rerun(points, profile):
        simulated = {"ttft_mean": float(np.mean(run.ttft_at(variant.text_token))),
                     "tpot_mean": float(np.nanmean(run.tpot))}
        for statistic, measured in point.measured.items():
            rows.append({"variant": variant_name, "backend": point.backend, "point": point.name,
                         "model": point.model, "gpu": point.gpu, "tp": point.tensor_parallel_size,
                         "concurrency": point.concurrency, "input_len": point.input_lens[0],
                         "output_len": point.output_lens[0],
                         "held_out": held_out(point), "statistic": statistic, "measured": measured,
                         "simulated": simulated[statistic], "error": (simulated[statistic] - measured) / measured})
    return rows


def fidelity(points: list[MeasuredPoint], variants: list[str], suffix: str = "", workers: int = 2) -> pl.DataFrame:
    jobs = [(unit, name, VARIANTS[name], suffix) for name in variants
            for unit in sweep_units(points, VARIANTS[name].hypothesis.sweep)]
    # spawn, not fork: a forked child of a process whose polars threads hold a lock waits forever.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        rows = [row for part in pool.map(rerun_rows, jobs) for row in part]
    return pl.DataFrame(rows)


def table(rows: pl.DataFrame) -> pl.DataFrame:
    """Median |error| per variant, stack, fitted/held-out rows and statistic."""
    return (rows.group_by("variant", "backend", "held_out", "statistic")
            .agg(pl.len().alias("rows"), pl.col("error").abs().median().alias("median_abs_error"),
                 pl.col("error").median().alias("median_error"))
            .sort("variant", "backend", "held_out", "statistic"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--models", default=",".join(STUDIED), help="whose aggregated rows to rerun")
    parser.add_argument("--profile-suffix", default="", help="rerun on <gpu>_<stack><suffix> (e.g. a fitted copy)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    points = studied_rows(UPSTREAM, tuple(args.models.split(",")))
    rows = fidelity(points, args.variants.split(","), args.profile_suffix, min(2, os.cpu_count() or 1))
    if args.out is not None:
        rows.write_parquet(args.out)
    print(f"{'variant':<24}{'stack':<8}{'rows':<9}{'TTFT fit':>10}{'held out':>10}{'TPOT fit':>10}{'held out':>10}")
    summary = table(rows)
    for (variant, backend), part in summary.group_by("variant", "backend", maintain_order=True):
        cell = {(r["held_out"], r["statistic"]): r for r in part.iter_rows(named=True)}

        def pct(held: bool, stat: str, cells: dict[Any, Any] = cell) -> str:
            r = cells.get((held, stat))
            return f"{r['median_abs_error']:>9.1%}" if r else f"{'-':>9}"

        n = sum(r["rows"] for k, r in cell.items() if k[1] == "tpot_mean")
        print(f"{variant:<24}{backend:<8}{n:<9}{pct(False, 'ttft_mean'):>10}{pct(True, 'ttft_mean'):>10}"
              f"{pct(False, 'tpot_mean'):>10}{pct(True, 'tpot_mean'):>10}")
    print_groups(rows)
    print_stalls(rows)
    print_gaps(rows)


def stalls(rows: pl.DataFrame) -> pl.DataFrame:
    """Per variant, stack, model, GPU and concurrency: mean TPOT of the 8,192/1,024-token rows less
    that of the 1,024/8,192-token rows, measured and simulated (seconds; empty without both)."""
    tpot = rows.filter(pl.col("statistic") == "tpot_mean")
    key = ["variant", "backend", "model", "gpu", "concurrency"]

    def mean(prompt: int, output: int) -> pl.DataFrame:
        part = tpot.filter((pl.col("input_len") == prompt) & (pl.col("output_len") == output))
        return part.group_by(key).agg(pl.col("measured").mean(), pl.col("simulated").mean())

    both = mean(8192, 1024).join(mean(1024, 8192), on=key, suffix="_decode")
    return both.select(*key, measured=pl.col("measured") - pl.col("measured_decode"),
                       simulated=pl.col("simulated") - pl.col("simulated_decode")).sort(key)


def print_stalls(rows: pl.DataFrame) -> None:
    table = stalls(rows)
    if table.is_empty():
        return
    print("\nprefill stall per output token (TPOT at 8,192/1,024 tokens less at 1,024/8,192), ms")
    print(f"{'variant':<24}{'stack':<8}{'model':<14}{'gpu':<10}{'clients':>8}{'measured':>10}{'simulated':>10}")
    for r in table.iter_rows(named=True):
        print(f"{r['variant']:<24}{r['backend']:<8}{r['model']:<14}{r['gpu']:<10}{r['concurrency']:>8}"
              f"{r['measured'] * 1e3:>10.2f}{r['simulated'] * 1e3:>10.2f}")


def gaps(rows: pl.DataFrame) -> pl.DataFrame:
    """Per variant, stack, model, GPU and prompt length: the median over rows of measured less
    simulated mean TTFT (seconds), and of the same in simulated TPOTs (decode steps)."""
    key = ["variant", "backend", "model", "gpu", "input_len"]
    wide = rows.pivot(on="statistic", index=["point", *key], values=["measured", "simulated"])
    gap = pl.col("measured_ttft_mean") - pl.col("simulated_ttft_mean")
    return (wide.group_by(key).agg(pl.len().alias("rows"), gap.median().alias("gap"),
                                   (gap / pl.col("simulated_tpot_mean")).median().alias("steps"))
            .sort(key))


def print_gaps(rows: pl.DataFrame) -> None:
    print("\nmeasured less simulated TTFT, median over rows: ms, and simulated decode steps (TPOTs)")
    print(f"{'variant':<24}{'stack':<8}{'model':<14}{'gpu':<10}{'prompt':>8}{'rows':>6}{'ms':>10}{'steps':>8}")
    for r in gaps(rows).iter_rows(named=True):
        print(f"{r['variant']:<24}{r['backend']:<8}{r['model']:<14}{r['gpu']:<10}{r['input_len']:>8}{r['rows']:>6}"
              f"{r['gap'] * 1e3:>10.1f}{r['steps']:>8.1f}")


def print_groups(rows: pl.DataFrame) -> None:
    """Median |error| (and signed) per variant, stack, model and tensor parallel size."""
    groups = (rows.group_by("variant", "backend", "model", "gpu", "tp", "held_out", "statistic")
              .agg(pl.len().alias("rows"), pl.col("error").abs().median().alias("abs"),
                   pl.col("error").median().alias("sgn"))
              .sort("variant", "backend", "model", "gpu", "tp"))
    print(f"\n{'variant':<24}{'stack':<8}{'model':<14}{'gpu':<10}{'TP':>3}{'rows':>6}{'':>10}{'TTFT':>16}{'TPOT':>16}")
    for key, part in groups.group_by("variant", "backend", "model", "gpu", "tp", "held_out", maintain_order=True):
        cell = {r["statistic"]: r for r in part.iter_rows(named=True)}
        text = "".join(f"{cell[s]['abs']:>8.1%} ({cell[s]['sgn']:+.0%})" if s in cell else f"{'-':>16}"
                       for s in ("ttft_mean", "tpot_mean"))
        print(f"{key[0]:<24}{key[1]:<8}{key[2]:<14}{key[3]:<10}{key[4]:>3}{cell['tpot_mean']['rows']:>6}"
              f"{'held out' if key[5] else 'fitted':>10}{text}")


if __name__ == "__main__":
    main()
