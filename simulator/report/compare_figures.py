"""The report of a `simulate compare --out` file: predicted against measured, one panel per statistic.

Each panel puts every point at (measured, simulated) on log axes beside the line where they are
equal and the lines 10% either side, coloured by group (model on GPU); a point whose measured decode
needs more memory bandwidth than its GPUs have (`bandwidth_share` above 1, where the file has the
column: `simulator.sim2real.bandwidth`) is drawn as a cross. The page opens with the median |error|
per group and statistic. The file is untrusted: its columns and their types are checked, and every
string from it is escaped on the page and in the hover text.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from simulator.errors import InputError
from simulator.sim2real.bandwidth import over_bandwidth

COLUMNS = {"point": "string", "group": "string", "statistic": "string", "measured": "numeric",
           "simulated": "numeric", "error": "numeric"}
OPTIONAL = {"bandwidth_share": "numeric"}
"""Columns a compare file may lack (one written before they were)."""
PANELS_PER_ROW = 3


def is_compare_file(path: Path) -> bool:
    """Whether `path` is a Parquet file with the compare rows' columns."""
    try:
        return set(COLUMNS) <= set(pl.read_parquet_schema(path))
    except (OSError, pl.exceptions.PolarsError):
        return False


def read_compare_file(path: Path) -> pl.DataFrame:
    schema = pl.read_parquet_schema(path)
    present = {**COLUMNS, **{name: kind for name, kind in OPTIONAL.items() if name in schema}}
    for name, kind in present.items():
        dtype = schema[name]
        if not (dtype == pl.String if kind == "string" else dtype.is_numeric()):
            raise InputError(f"{str(path)!r}: column {name} must be {kind}, got {dtype}")
    rows = pl.read_parquet(path, columns=list(present))
    if rows.is_empty():
        raise InputError(f"{str(path)!r} has no rows to draw")
    for name in COLUMNS:
        if empty := rows[name].null_count():
            raise InputError(f"{str(path)!r}: column {name} has {empty} empty cells")
    if "bandwidth_share" not in rows.columns:
        rows = rows.with_columns(bandwidth_share=pl.lit(None, dtype=pl.Float64))
    return rows.with_columns(pl.col("bandwidth_share").cast(pl.Float64))


def compare_figures(rows: pl.DataFrame) -> dict[str, go.Figure]:
    statistics = rows["statistic"].unique(maintain_order=True).to_list()
    cols = min(PANELS_PER_ROW, len(statistics))
    grid = math.ceil(len(statistics) / cols)
    fig = make_subplots(rows=grid, cols=cols, subplot_titles=[html.escape(s) for s in statistics])
    groups = rows["group"].unique(maintain_order=True).to_list()
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    for i, statistic in enumerate(statistics):
        row, col = i // cols + 1, i % cols + 1
        panel = rows.filter(pl.col("statistic") == statistic, pl.col("measured") > 0, pl.col("simulated") > 0)
        scale, unit = (1.0, "/s") if "throughput" in statistic else (1e3, "ms")
        if panel.is_empty():
            continue
        low, high = float(panel.select(pl.min_horizontal("measured", "simulated")).min().item()) * scale, \
            float(panel.select(pl.max_horizontal("measured", "simulated")).max().item()) * scale
        for factor, dash in ((1.0, "solid"), (0.9, "dot"), (1.1, "dot")):
            fig.add_trace(go.Scatter(x=[low, high], y=[low * factor, high * factor], mode="lines", hoverinfo="skip",
                                     line={"color": "gray", "dash": dash, "width": 1}, showlegend=False),
                          row=row, col=col)
        for g, group in enumerate(groups):
            part = panel.filter(pl.col("group") == group)
            if part.is_empty():
                continue
            over = part.select(over_bandwidth())["bandwidth_share"].to_list()
            text = [f"{html.escape(p)}<br>error {e:+.1%}"
                    + (f"<br>decode needs {b:.0%} of its GPUs' memory bandwidth" if x else "")
                    for p, e, b, x in zip(part["point"], part["error"], part["bandwidth_share"], over, strict=True)]
            fig.add_trace(go.Scatter(x=part["measured"] * scale, y=part["simulated"] * scale, mode="markers",
                                     name=html.escape(group), legendgroup=group, showlegend=i == 0,
                                     marker={"color": palette[g % len(palette)],
                                             "symbol": ["x" if x else "circle" for x in over]}, text=text,
                                     hovertemplate="%{text}<extra></extra>"), row=row, col=col)
        fig.update_xaxes(type="log", title_text=f"measured ({unit})", row=row, col=col)
        fig.update_yaxes(type="log", title_text=f"simulated ({unit})", row=row, col=col)
    fig.update_layout(title="simulated against measured (lines: equal, and 10% either side)", height=420 * grid)
    return {"predicted-measured": fig}


def compare_notes(rows: pl.DataFrame) -> str:
    from simulator.sim2real.compare import summary

    cells = "".join(f"<tr><td>{html.escape(r['group'])}</td><td>{html.escape(r['statistic'])}</td>"
                    f"<td>{r['points']}</td><td>{r['median_abs_error']:.1%}</td></tr>"
                    for r in summary(rows).iter_rows(named=True))
    over = rows.filter(over_bandwidth())["point"].n_unique()
    flagged = (f" {over} of them need more memory bandwidth than their GPUs have, rerun as they state "
               "(crosses): a KV cache, speculation or output lengths they do not state." if over else "")
    return (f"<p>{rows['point'].n_unique()} measured points rerun.{flagged}</p><table><tr><th>group</th>"
            f"<th>statistic</th><th>points</th><th>median |error|</th></tr>{cells}</table>")
