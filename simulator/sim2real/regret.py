"""Planning regret: how much throughput a plan loses by trusting the predictions.

On a measured table with several deployments of one workload (a model, GPU, stack and input/output
lengths: a group), and a TPOT limit at the group's 25th, 50th and 75th measured-TPOT percentile,
the plan picks the deployment with the highest predicted output tokens/s/GPU among those predicted
to meet the limit. Its regret is 1 - the pick's measured tokens/s/GPU / the best measured among the
deployments that really meet it; a pick that misses the limit in reality counts 1 (it serves
nothing within the SLO), and so does no pick (nothing predicted to fit). The baselines are exact
expectations: a deployment picked at random, and one picked at random among those that really meet
the limit.

A point's tokens/s/GPU is its output throughput where measured (and simulated), else, for a closed
loop of `concurrency` clients, concurrency x output tokens / (TTFT + (output tokens - 1) x TPOT),
per GPU of the deployment: its tensor-parallel size times its data-parallel ranks and replicas
where the rows carry them (`data_parallel_size`, `num_replicas`). Disaggregated rows (GPUs in two
pools of their own sizes) are left out. Workloads are grouped per stack. It reads
`simulator.sim2real.compare`'s rows.

Some measured points contradict their own stated deployment: their decode needs more memory
bandwidth than their GPUs have (`bandwidth_share` above 1, `simulator.sim2real.bandwidth`), or their
server decoded under half as many requests at once as its rerun (`simulator.sim2real.inflight`).
Such a point's throughput is a different deployment's (a smaller batch, shorter outputs), so
`regret_lines` also gives the regret with them left out, as `simulate fit` leaves them out.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from simulator.sim2real.bandwidth import over_bandwidth
from simulator.sim2real.inflight import fewer_at_once

QUANTILES = (0.25, 0.5, 0.75)
WORKLOAD = ("group", "input_len", "output_len")
"""What makes a workload, with `stack` where the rows carry one."""
GPU_FACTORS = ("data_parallel_size", "num_replicas")
"""Columns that multiply a deployment's GPUs beyond its tensor-parallel size, where rows carry them."""


def points(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per measured point: its deployment, measured and predicted TPOT and tokens/s/GPU.
    compare's rows name the stack `backend`; disaggregated rows (GPUs in two pools) are left out."""
    if "backend" in rows.columns and "stack" not in rows.columns:
        rows = rows.rename({"backend": "stack"})
    if "mode" in rows.columns:
        rows = rows.filter(pl.col("mode") == "agg").drop("mode")
    keys = [c for c in ("point", "stack", *WORKLOAD, "gpu", "model", "tensor_parallel_size", *GPU_FACTORS,
                        "quantization", "concurrency") if c in rows.columns]
    wide = rows.pivot(on="statistic", index=keys, values=["measured", "simulated"], aggregate_function="first")
    columns = set(wide.columns)

    def column(kind: str, statistic: str) -> pl.Expr:
        name = f"{kind}_{statistic}"
        return pl.col(name) if name in columns else pl.lit(None, dtype=pl.Float64)

    def per_gpu(kind: str) -> pl.Expr:
        closed = (pl.col("concurrency") * pl.col("output_len")
                  / (column(kind, "ttft_mean") + (pl.col("output_len") - 1) * column(kind, "tpot_mean")))
        return pl.coalesce(column(kind, "output_throughput"), closed) / pl.col("gpus")

    gpus = pl.col("tensor_parallel_size")
    for factor in GPU_FACTORS:
        if factor in columns:
            gpus = gpus * pl.col(factor).fill_null(1)
    wide = wide.with_columns(gpus=gpus)

    return wide.select(*keys, "gpus", measured_tpot=column("measured", "tpot_mean"),
                       predicted_tpot=column("simulated", "tpot_mean"),
                       measured_tokens=per_gpu("measured"), predicted_tokens=per_gpu("simulated"))


def group_regret(group: pl.DataFrame, quantile: float) -> dict[str, Any] | None:
    """The regret of the predicted pick under the TPOT limit at `quantile` of `group`'s measured TPOT,
    and the baselines; None for a group that cannot be judged (fewer than two measured deployments)."""
    measured = group.filter(pl.col("measured_tpot").is_not_null() & pl.col("measured_tokens").is_not_null())
    if measured.height < 2:
        return None
    tpot = measured["measured_tpot"].to_numpy()
    tokens = measured["measured_tokens"].to_numpy()
    limit = float(np.percentile(tpot, quantile * 100))
    feasible = tpot <= limit
    best = float(tokens[feasible].max())
    regrets = np.where(feasible, 1 - tokens / best, 1.0)
    predicted_tpot = measured["predicted_tpot"].fill_null(math.nan).fill_nan(math.inf).to_numpy()
    predicted_tokens = measured["predicted_tokens"].fill_null(math.nan).fill_nan(-math.inf).to_numpy()
    fits = predicted_tpot <= limit
    result = {"limit": limit, "deployments": measured.height, "random": float(regrets.mean()),
              "random_feasible": float(regrets[feasible].mean()), "no_pick": not fits.any()}
    if not fits.any():
        return result | {"regret": 1.0, "missed": False}
    pick = int(np.argmax(np.where(fits, predicted_tokens, -math.inf)))
    best_index = int(np.argmax(np.where(feasible, tokens, -math.inf)))
    shape = {f"{who}_{name}": measured[name][index] for who, index in (("pick", pick), ("best", best_index))
             for name in ("gpus", "concurrency") if name in measured.columns}
    return result | {"regret": float(regrets[pick]), "missed": not bool(feasible[pick])} | shape


def planning_regret(rows: pl.DataFrame, quantiles: tuple[float, ...] = QUANTILES) -> pl.DataFrame:
    """One row per (workload, quantile) of compare's `rows`: the TPOT limit, the pick's regret, whether
    it missed the limit in reality or nothing was predicted to fit, and the two baselines."""
    return cases(points(rows), quantiles)


def cases(table: pl.DataFrame, quantiles: tuple[float, ...] = QUANTILES) -> pl.DataFrame:
    """`planning_regret` of a table of `points` (one row per point, so a filter of it is the table of
    the same filter of the rows)."""
    keys = [c for c in ("stack", *WORKLOAD) if c in table.columns]
    found = []
    for key, group in table.group_by(keys, maintain_order=True):
        for quantile in quantiles:
            judged = group_regret(group, quantile)
            if judged is not None:
                found.append(dict(zip(keys, key, strict=True)) | {"quantile": quantile} | judged)
    schema = {"limit": pl.Float64, "deployments": pl.Int64, "random": pl.Float64, "random_feasible": pl.Float64,
              "no_pick": pl.Boolean, "regret": pl.Float64, "missed": pl.Boolean}
    if not found:
        return pl.DataFrame(schema={**{k: table.schema[k] for k in keys}, "quantile": pl.Float64, **schema})
    return pl.DataFrame(found, infer_schema_length=None)


def regret_summary(regrets: pl.DataFrame) -> pl.DataFrame:
    """Per stack (all rows when the table names none): mean regret, the shares of picks that missed
    the limit and of cases with no pick, and the baselines' mean regrets."""
    by = ["stack"] if "stack" in regrets.columns else []
    frame = regrets if by else regrets.with_columns(stack=pl.lit("all"))
    return frame.group_by("stack", maintain_order=True).agg(
        pl.len().alias("cases"), pl.col("regret").mean().alias("regret"), pl.col("missed").mean().alias("missed"),
        pl.col("no_pick").mean().alias("no_pick"), pl.col("random").mean().alias("random"),
        pl.col("random_feasible").mean().alias("random_feasible"))


def not_as_stated(rows: pl.DataFrame) -> set[str]:
    """The points of compare's `rows` whose measurements contradict their stated deployment (module
    docstring): over their GPUs' bandwidth, or fewer requests at once than their rerun."""
    flagged: set[str] = set()
    if "bandwidth_share" in rows.columns:
        flagged |= set(rows.filter(over_bandwidth())["point"].to_list())
    fewer, _ = fewer_at_once(rows)
    return flagged | (set(fewer["point"].to_list()) if not fewer.is_empty() else set())


def summary_lines(regrets: pl.DataFrame) -> list[str]:
    """One printed line per stack of `regret_summary(regrets)`."""
    return [f"  {r['stack']:<12}{r['regret']:>7.1%} mean regret over {r['cases']} cases; SLO missed by "
            f"{r['missed']:.0%} of picks, nothing predicted to fit in {r['no_pick']:.0%}; random pick "
            f"{r['random']:.1%}, random among feasible {r['random_feasible']:.1%}"
            for r in regret_summary(regrets).iter_rows(named=True)]


def regret_lines(rows: pl.DataFrame) -> list[str]:
    """What `simulate compare` prints: the regret per stack, or why there is none; and again without
    the points that did not run as stated, where any of the judged points did not."""
    table = points(rows)
    regrets = cases(table)
    if regrets.is_empty():
        return ["planning regret: no workload has two or more measured deployments"]
    predicted = int(table["predicted_tokens"].is_finite().fill_null(False).sum()) / max(table.height, 1)
    lines = ["planning regret (pick the highest predicted tokens/s/GPU under a TPOT limit at each workload's "
             f"25th/50th/75th measured-TPOT percentile; {predicted:.0%} of {table.height} points predicted):",
             *summary_lines(regrets)]
    left = not_as_stated(rows) & set(table["point"].to_list())
    if left:
        kept = cases(table.filter(~pl.col("point").is_in(sorted(left))))
        lines.append(f"and without the {len(left)} points that did not run as stated (over their GPUs' bandwidth, "
                     "or fewer requests at once than their rerun: listed below):")
        lines += summary_lines(kept) if not kept.is_empty() else ["  no workload has two or more such deployments"]
    return lines
