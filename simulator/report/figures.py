"""The report figures (plotly) of a sweep file and of the chapter's batch table, and the page they go on.

A sweep: throughput against median and tail latency, goodput (or throughput) against the offered
load, each group's saturation point (its "knee": the highest load it kept up with before the first
overloaded one, where throughput stops following the load; no latency target is met there), and,
when the sweep has SLOs (--goodput), each group's SLO capacity: the highest load, below the first
that fails, at which at least `SLO_ATTAINMENT` of the requests met every SLO and the server kept
up. The figures show seconds as ms. A run's figures are in `simulator.report.run_figures`.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from simulator.cost.batch_table import BatchTable
from simulator.errors import InputError
from simulator.metrics.summary import LATENCY_STAT
from simulator.report.html import color_cycle

LOAD_AXES = ("rate", "concurrency")
# Settings that never split a sweep's curves: the load (the x axis), the seed (averaged) and the
# columns that are no settings at all.
NOT_GROUPING = (*LOAD_AXES, "seed", "config_id", "error")
DRAWN = ("policy", "kept_up", "request_throughput", "median_ttft", "median_itl")
"""The columns a sweep's figures draw, beside a tail percentile of TTFT and of ITL (and `completed`
where the rows count the requests that met the SLOs, `good_requests`)."""


def load_axis(rows: pl.DataFrame) -> str | None:
    for name in LOAD_AXES:
        if name in rows.columns and rows[name].drop_nulls().n_unique() > 1:
            return name
    return None


def grouping(rows: pl.DataFrame, setting_names: list[str]) -> list[str]:
    """Policy, and every other setting that varies across the sweep except the load and the seed."""
    varying = [name for name in setting_names if name not in NOT_GROUPING and name in rows.columns
               and rows[name].n_unique() > 1]
    return ["policy", *[name for name in varying if name != "policy"]]


def sweep_curves(rows: pl.DataFrame, setting_names: list[str]) -> tuple[str | None, dict[str, pl.DataFrame]]:
    """The load axis and, per group label, the group's rows averaged over seeds, sorted by load.

    A point counts as overloaded when any of its seeds was.
    """
    ok = rows.filter(pl.col("error").is_null())
    axis = load_axis(ok)
    keys = grouping(ok, setting_names)
    by = [*keys, axis] if axis else [*keys, "config_id"]
    numeric = [name for name, dtype in ok.schema.items() if dtype.is_numeric() and name not in by]
    points = (ok.group_by(by, maintain_order=True)
              .agg([pl.col(numeric).mean(), (pl.col("kept_up") == False).any().alias("overloaded")])  # noqa: E712
              .sort(by))
    curves = {}
    for key, group in points.group_by(keys, maintain_order=True):
        label = ", ".join([str(key[0])] + [f"{name}={value}" for name, value in zip(keys[1:], key[1:], strict=True)])
        curves[label] = group
    return axis, curves


def knee(group: pl.DataFrame, axis: str) -> float | None:
    """The highest load kept up with below the first overloaded point; None if never overloaded."""
    overloaded = group["overloaded"].to_list()
    if True not in overloaded:
        return None
    first = overloaded.index(True)
    return float(group[axis][first - 1]) if first > 0 else None


SLO_ATTAINMENT = 0.99
"""The share of requests that must meet every SLO (DistServe's attainment, `simulate plan`'s default)."""


def slo_capacity(group: pl.DataFrame, axis: str) -> float | None:
    """The highest load below the first one that fails its SLOs (under `SLO_ATTAINMENT` of requests
    good, or overloaded); None when the first load already fails or the rows hold no SLO counts."""
    if "good_requests" not in group.columns or group["good_requests"].is_null().all():
        return None
    met = None
    for row in group.iter_rows(named=True):
        completed, good = row["completed"] or 0, row["good_requests"]
        if row["overloaded"] or not completed or good is None or good < SLO_ATTAINMENT * completed:
            break  # a point with no count of good requests cannot be said to meet the SLOs
        met = float(row[axis])
    return met


def tail_columns(rows: pl.DataFrame, metric: str) -> list[float]:
    """The percentiles summarised for `metric` (99 for p99_ttft)."""
    return [float(m.group(1)[1:]) for c in rows.columns
            if (m := LATENCY_STAT.fullmatch(c)) and m.group(1).startswith("p") and m.group(2) == metric]


def tail_stat(rows: pl.DataFrame, metric: str) -> str:
    """The highest percentile column summarised for `metric` (e.g. p99)."""
    return f"p{max(tail_columns(rows, metric)):g}"


def throughput_latency_figure(rows: pl.DataFrame, curves: dict[str, pl.DataFrame]) -> go.Figure:
    metrics = {"ttft": "TTFT", "itl": "ITL"}
    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"{label} (ms)" for label in metrics.values()])
    colors = color_cycle()
    for label, group in curves.items():
        color = next(colors)
        for col, metric in enumerate(metrics, start=1):
            for stat, dash in (("median", "solid"), (tail_stat(rows, metric), "dash")):
                fig.add_trace(go.Scatter(
                    x=group["request_throughput"], y=group[f"{stat}_{metric}"] * 1e3, mode="lines+markers",
                    name=f"{label} {stat}", legendgroup=label, showlegend=col == 1,
                    line={"color": color, "dash": dash}), row=1, col=col)
    fig.update_xaxes(title_text="request throughput (req/s)")
    fig.update_yaxes(type="log")
    fig.update_layout(title="Throughput against latency (solid: median, dashed: tail)", height=450)
    return fig


def load_figure(rows: pl.DataFrame, axis: str, curves: dict[str, pl.DataFrame]) -> go.Figure:
    metric = "request_goodput" if "request_goodput" in rows.columns else "request_throughput"
    fig = go.Figure()
    colors = color_cycle()
    for label, group in curves.items():
        color = next(colors)
        group = group.filter(pl.col(axis).is_not_null())  # a point with no load (--rate none) has no place here
        symbols = ["x" if over else "circle" for over in group["overloaded"]]
        fig.add_trace(go.Scatter(x=group[axis], y=group[metric], mode="lines+markers", name=label,
                                 line={"color": color}, marker={"symbol": symbols, "size": 9}))
        at = knee(group, axis)
        if at is not None:
            y = float(group.filter(pl.col(axis) == at)[metric][0])
            fig.add_trace(go.Scatter(x=[at], y=[y], mode="markers+text", text=[f"saturation {at:g}"],
                                     textposition="top left", marker={"symbol": "star", "size": 16, "color": color},
                                     name=f"{label} knee", showlegend=False))
        met = slo_capacity(group, axis)
        if met is not None:
            y = float(group.filter(pl.col(axis) == met)[metric][0])
            fig.add_trace(go.Scatter(x=[met], y=[y], mode="markers+text", text=[f"SLO capacity {met:g}"],
                                     textposition="bottom right", name=f"{label} SLO capacity", showlegend=False,
                                     marker={"symbol": "triangle-up", "size": 14, "color": color}))
    top = rows[axis].filter(rows[axis].is_finite()).max() if axis == "rate" else None
    if isinstance(top, float):  # offered = served, up to the highest finite rate
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="offered",
                                 line={"color": "gray", "dash": "dot"}))
    what = "goodput (req/s meeting every SLO)" if metric == "request_goodput" else "request throughput (req/s)"
    slos = " and the triangle the SLO capacity" if "good_requests" in rows.columns else ""
    fig.update_layout(title=f"{what.split(' (')[0].capitalize()} against {axis}; x marks an overloaded run, "
                            f"the star saturation (the last load kept up with; no SLO){slos}", height=450,
                      xaxis_title="offered rate (req/s)" if axis == "rate" else "concurrent clients",
                      yaxis_title=what)
    return fig


def sweep_figures(path: Path) -> tuple[pl.DataFrame, dict[str, go.Figure]]:
    from simulator.config import RunConfig
    from simulator.sweep.executors import setting_column
    from simulator.sweep.grid import read_sweep_file

    rows = read_sweep_file(path, repr(str(path)))
    figures: dict[str, go.Figure] = {}
    if rows.filter(pl.col("error").is_null()).is_empty():
        return rows, figures
    lacking = [name for name in (*DRAWN, *(("completed",) if "good_requests" in rows.columns else ()))
               if name not in rows.columns]
    lacking += [f"a tail percentile of {metric}" for metric in ("ttft", "itl") if not tail_columns(rows, metric)]
    if lacking:
        raise InputError(f"{str(path)!r} lacks what its figures draw: {', '.join(lacking)}")
    axis, curves = sweep_curves(rows, [setting_column(name) for name in RunConfig.field_names()])
    figures["throughput-latency"] = throughput_latency_figure(rows, curves)
    if axis is not None:
        figures["load"] = load_figure(rows, axis, curves)
    from simulator.report.fleet import fleet_figure

    fleet = fleet_figure(rows, path)
    if fleet is not None:
        figures["fleet"] = fleet
    return rows, figures


def sweep_notes(rows: pl.DataFrame) -> str:
    failed = rows.filter(pl.col("error").is_not_null())
    text = f"<p>{rows.height} configurations, {failed.height} failed.</p>"
    if failed.height:
        items = "".join(f"<li><code>{html.escape(r['config_id'])}</code> {html.escape(r['policy'] or '')}: "
                        f"{html.escape(r['error'])}</li>" for r in failed.iter_rows(named=True))
        text += f"<ul>{items}</ul>"
    return text


def batch_table_figure(table: BatchTable, title: str) -> go.Figure:
    """Step time, and aggregate against per-request tokens/s, by batch size; knee and ceiling marked."""
    rows = table.rows
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        specs=[[{}], [{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=rows["batch"], y=rows["step_time"] * 1e3, mode="lines+markers", name="step time"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=rows["batch"], y=rows["aggregate_tokens_per_s"], mode="lines+markers",
                             name="aggregate tok/s"), row=2, col=1)
    fig.add_trace(go.Scatter(x=rows["batch"], y=rows["per_request_tokens_per_s"], mode="lines+markers",
                             name="per-request tok/s", line={"dash": "dash"}), row=2, col=1, secondary_y=True)
    marks = ((table.knee_batch, 0.9, f"knee: KV reads = weight reads (batch {table.knee_batch:.1f}) "),
             (table.max_batch, 1.0, f"memory ceiling: KV cache full ({table.max_batch} sequences) "))
    for x, height, text in marks:
        for row in (1, 2):
            fig.add_vline(x=x, line_dash="dot", line_color="gray", row=row, col=1)
        # On a log axis a shape takes the data value and an annotation its log10.
        fig.add_annotation(x=math.log10(x), y=height, xref="x", yref="y domain", text=text, showarrow=False,
                           xanchor="right")
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="batch size (sequences)", row=2, col=1)
    fig.update_yaxes(title_text="step time (ms)", row=1, col=1)
    fig.update_yaxes(title_text="aggregate tok/s", row=2, col=1)
    fig.update_yaxes(title_text="per-request tok/s", row=2, col=1, secondary_y=True)
    fig.update_layout(title=title, height=700)
    return fig


