"""The report of a plan folder (`simulate plan --out`): the Pareto frontier of output tokens/s/GPU
against tokens/s/user (as `vllm bench sweep plot_pareto` defines both: output throughput per GPU, and
per user in flight), aggregated and disaggregated deployments marked apart; each viable deployment's
capacity with its bracket (highest rate met, lowest missed); and the cost per million output tokens
where the plan was given prices. plan.parquet is untrusted: its columns and their types are checked,
and every string from it is escaped on the page.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import plotly.graph_objects as go
import polars as pl

from simulator.errors import InputError
from simulator.report.html import table

COLUMNS = {"deployment": "string", "kind": "string", "how": "string", "gpus": "integer", "max_rate": "numeric",
           "max_rate_high": "numeric", "tokens_per_s_per_gpu": "numeric", "tokens_per_s_per_user": "numeric",
           "viable": "boolean"}
OPTIONAL = {"cost_per_million_tokens": "numeric", "policy": "string", "tensor_parallel_size": "integer",
            "num_replicas": "integer", "router": "string"}
SHOWN = 25
"""Deployments the capacity figure and table show, best first."""


def read_plan(folder: Path) -> pl.DataFrame:
    path = folder / "plan.parquet"
    try:
        schema = pl.read_parquet_schema(path)
    except (OSError, pl.exceptions.PolarsError):
        raise InputError(f"{str(path)!r} is not a Parquet file") from None
    for name, kind in (COLUMNS | {k: v for k, v in OPTIONAL.items() if k in schema}).items():
        dtype = schema.get(name)
        ok = dtype is not None and (dtype == pl.String if kind == "string" else dtype == pl.Boolean
                                    if kind == "boolean" else dtype.is_integer() if kind == "integer"
                                    else dtype.is_numeric() or dtype == pl.Null)
        if not ok:
            raise InputError(f"{str(path)!r}: column {name} must be {kind}, got {dtype}")
    columns = [name for name in (*COLUMNS, *OPTIONAL) if name in schema]
    return pl.read_parquet(path, columns=columns).with_columns(pl.col("max_rate_high").cast(pl.Float64))


def viable(rows: pl.DataFrame) -> pl.DataFrame:
    return rows.filter(pl.col("viable") & pl.col("max_rate").is_finite() & (pl.col("max_rate") > 0)
                       & pl.col("tokens_per_s_per_gpu").is_finite() & pl.col("tokens_per_s_per_user").is_finite())


def pareto(rows: pl.DataFrame) -> pl.DataFrame:
    """The points no other beats on both axes: by tokens/s/user falling, each with more tokens/s/GPU
    than every point before it (plot_pareto's frontier)."""
    ordered = rows.sort(["tokens_per_s_per_user", "tokens_per_s_per_gpu"], descending=[True, True])
    keep, best = [], -math.inf
    for per_gpu in ordered["tokens_per_s_per_gpu"]:
        keep.append(per_gpu > best)
        best = max(best, per_gpu)
    return ordered.filter(pl.Series(keep, dtype=pl.Boolean)).sort("tokens_per_s_per_user")


def label(row: dict[str, object]) -> str:
    parts = [str(row.get(name)) for name in ("gpu", "policy", "tensor_parallel_size", "num_replicas", "router")
             if name in row]
    parts += [f"{role} on {row[f'{role}_gpu']}" for role in ("prefill", "decode") if row.get(f"{role}_gpu")]
    return html.escape(f"{row['deployment']} {row['kind']} {row['gpus']} GPUs " + " ".join(parts))


def frontier_figure(rows: pl.DataFrame) -> go.Figure:
    fig = go.Figure()
    for kind, symbol in (("aggregated", "circle"), ("disaggregated", "diamond")):
        part = rows.filter(pl.col("kind") == kind)
        if part.height:
            fig.add_trace(go.Scatter(x=part["tokens_per_s_per_user"], y=part["tokens_per_s_per_gpu"], mode="markers",
                                     name=kind, marker={"symbol": symbol, "size": 9, "opacity": 0.7},
                                     text=[label(r) for r in part.iter_rows(named=True)], hoverinfo="text+x+y"))
    front = pareto(rows)
    fig.add_trace(go.Scatter(x=front["tokens_per_s_per_user"], y=front["tokens_per_s_per_gpu"], mode="lines+markers",
                             name="Pareto frontier", line={"color": "black"}))
    fig.update_layout(title="Output tokens/s/GPU against tokens/s/user at each deployment's capacity",
                      xaxis_title="tokens/s/user", yaxis_title="tokens/s/GPU", height=480)
    return fig


def capacity_figure(rows: pl.DataFrame) -> go.Figure:
    top = rows.head(SHOWN)
    names = [f"{i + 1}. {label(r)}" for i, r in enumerate(top.iter_rows(named=True))]
    high = top["max_rate_high"].fill_null(math.nan).to_numpy()
    fig = go.Figure(go.Bar(x=top["max_rate"], y=names, orientation="h", name="max_rate",
                           error_x={"type": "data", "symmetric": False, "array": high - top["max_rate"].to_numpy(),
                                    "arrayminus": [0.0] * top.height}))
    fig.update_layout(title="Capacity (req/s): the highest rate that met every SLO; the whisker reaches the lowest "
                            "that missed", height=max(300, 24 * top.height + 120), yaxis={"autorange": "reversed"},
                      xaxis_title="req/s")
    return fig


def cost_figure(rows: pl.DataFrame) -> go.Figure | None:
    if "cost_per_million_tokens" not in rows.columns or rows["cost_per_million_tokens"].is_null().all():
        return None
    priced = rows.filter(pl.col("cost_per_million_tokens").is_not_null()).sort("cost_per_million_tokens").head(SHOWN)
    fig = go.Figure(go.Bar(x=priced["cost_per_million_tokens"], y=[label(r) for r in priced.iter_rows(named=True)],
                           orientation="h"))
    fig.update_layout(title="USD per million output tokens at capacity", yaxis={"autorange": "reversed"},
                      height=max(300, 24 * priced.height + 120), xaxis_title="USD / 1M output tokens")
    return fig


def missed_at(rate: float | None) -> str:
    return "-" if rate is None or math.isnan(rate) else f"{rate:.3g}"


def plan_page(folder: Path) -> tuple[str, dict[str, go.Figure]]:
    """The page's introduction (escaped HTML) and figures."""
    rows = read_plan(folder)
    good = viable(rows).sort("tokens_per_s_per_gpu", descending=True)
    counts = rows.group_by("how").len().sort("how")
    intro = (f"<p>{rows.height} deployments, {good.height} with a capacity under the SLOs. "
             + ", ".join(f"{n} {html.escape(how.split(':')[0])}" for how, n in counts.iter_rows()) + ".</p>")
    intro += table(["deployment", "kind", "GPUs", "max req/s", "missed at", "tokens/s/GPU", "tokens/s/user"],
                   [[r["deployment"], r["kind"], str(r["gpus"]), f"{r['max_rate']:.3g}",
                     missed_at(r["max_rate_high"]),
                     f"{r['tokens_per_s_per_gpu']:.0f}", f"{r['tokens_per_s_per_user']:.1f}"]
                    for r in good.head(10).iter_rows(named=True)])
    figures: dict[str, go.Figure] = {}
    if good.height:
        figures["frontier"] = frontier_figure(good)
        figures["capacity"] = capacity_figure(good)
        cost = cost_figure(good)
        if cost is not None:
            figures["cost"] = cost
    return intro, figures
