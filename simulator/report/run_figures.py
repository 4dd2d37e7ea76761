"""The run report's figures (plotly): latency CDFs, token times of sampled requests, the server per step.

Latency CDFs (TTFT, TPOT, ITL, E2EL) lie on log axes, where a run's milliseconds and its seconds-long
stalls both read, with p50/p90/p99 marked. The token times draw each sampled request as a row:
grey while it waits for its first token, blue while it decodes, red across a stall (a gap longer
than `STALL_FACTOR` times the run's median ITL), a diamond at the end of a row that was preempted.
The server panels keep decode-only steps and steps with a prefill apart: in one line their batch
sizes (in a continuous run: every running request, then the few prompts the token budget admits)
alternate every few steps and draw a solid block.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

CDF_POINTS = 2000
"""A distribution is drawn through at most this many quantiles (every value when fewer)."""
MARKED_PERCENTILES = (50.0, 90.0, 99.0)
TRACE_REQUESTS = 50
"""Token-time figures show this many requests, evenly spaced by id: 50 rows of a 500-pixel panel."""
STALL_FACTOR = 3.0
"""A gap between two tokens of a request longer than this many median ITLs is drawn as a stall."""
BLUE, ORANGE, RED, GREY, GREEN = "#1f77b4", "#ff7f0e", "#d62728", "#7f7f7f", "#2ca02c"


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, cumulative share) at evenly spaced quantiles, numpy's linear method."""
    share = np.linspace(0.0, 1.0, min(len(values), CDF_POINTS))
    return np.quantile(values, share, method="linear"), share


def pooled_gaps(requests: pl.DataFrame, tokens: pl.DataFrame) -> np.ndarray:
    """Every gap between consecutive tokens of the finished requests (the ITL samples)."""
    from simulator.metrics.summary import inter_token_latencies

    done = requests.filter(pl.col("finished"))["request_id"]
    return inter_token_latencies(tokens.filter(pl.col("request_id").is_in(done.implode())).sort("request_id", "index"))


def duration_text(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def label_sides(values: np.ndarray, marks: np.ndarray) -> list[str]:
    """Each percentile label's side: toward the middle of the log axis, so it stays inside the panel;
    the last (p99) above its mark, clear of p90's label."""
    positive = values[values > 0]
    if not len(positive):  # nothing to place on a log axis: every label to the right of its mark
        return ["middle right"] * len(marks)
    low, high = np.log10(positive.min()), np.log10(positive.max())
    sides = ["right" if np.log10(max(mark, 1e-300)) < (low + high) / 2 else "left" for mark in marks]
    return [f"{'top' if i == len(marks) - 1 else 'middle'} {side}" for i, side in enumerate(sides)]


def latency_figure(requests: pl.DataFrame, itl: np.ndarray | None) -> go.Figure:
    """TTFT, TPOT, ITL and E2EL CDFs of the finished requests; `itl` None when the run has no tokens table."""
    done = requests.filter(pl.col("finished"))
    samples = {"TTFT": done["ttft"].to_numpy(), "TPOT": done["tpot"].drop_nulls().to_numpy(),
               "ITL": np.zeros(0) if itl is None else itl, "E2EL": done["e2el"].to_numpy()}
    fig = make_subplots(rows=2, cols=2, subplot_titles=[f"{name} (ms, log scale)" for name in samples],
                        vertical_spacing=0.16, horizontal_spacing=0.08)
    for i, (name, values) in enumerate(samples.items()):
        row, col = i // 2 + 1, i % 2 + 1
        if not len(values):
            why = "no tokens.parquet (a --no-tokens run)" if name == "ITL" and itl is None else "no samples"
            fig.add_annotation(text=why, showarrow=False, xref=f"x{i + 1} domain", yref=f"y{i + 1} domain",
                               x=0.5, y=0.5)
            continue
        x, y = cdf_points(values)
        fig.add_trace(go.Scatter(x=x * 1e3, y=y, name=name, mode="lines", line={"color": BLUE}), row=row, col=col)
        marks = np.percentile(values, MARKED_PERCENTILES, method="linear")
        fig.add_trace(go.Scatter(
            x=marks * 1e3, y=np.array(MARKED_PERCENTILES) / 100, name=f"{name} percentiles", mode="markers+text",
            text=[f"p{q:g} {duration_text(v)} " for q, v in zip(MARKED_PERCENTILES, marks, strict=True)],
            textposition=label_sides(values, marks), cliponaxis=False,
            marker={"color": RED, "size": 8}), row=row, col=col)
    fig.update_xaxes(type="log")
    fig.update_yaxes(range=[0, 1.1])
    fig.update_yaxes(title_text="share of samples", col=1)
    fig.update_layout(title="Latency distributions (CDF, finished requests; red: p50, p90, p99)", height=620,
                      showlegend=False)
    return fig


def sample_requests(requests: pl.DataFrame) -> np.ndarray:
    ids = requests["request_id"].to_numpy()
    if len(ids) <= TRACE_REQUESTS:
        return ids
    return ids[np.linspace(0, len(ids) - 1, TRACE_REQUESTS).round().astype(int)]


def segments(starts: np.ndarray, ends: np.ndarray, rows: np.ndarray) -> dict[str, np.ndarray]:
    """Horizontal segments start->end at height `rows`, as one line trace's x and y broken by NaN."""
    gaps = np.full(len(starts), np.nan)
    return {"x": np.column_stack([starts, ends, gaps]).ravel(),
            "y": np.column_stack([rows.astype(float), rows.astype(float), gaps]).ravel()}


def token_figure(requests: pl.DataFrame, tokens: pl.DataFrame, median_itl: float) -> go.Figure:
    """The sampled requests as rows over time; below, every gap between two of their tokens."""
    chosen = sample_requests(requests)
    shown = requests.filter(pl.col("request_id").is_in(pl.Series(chosen).implode())).sort("request_id")
    sample = tokens.filter(pl.col("request_id").is_in(pl.Series(chosen).implode())).sort("request_id", "index")
    ids, times = sample["request_id"].to_numpy(), sample["time"].to_numpy()
    same = ids[1:] == ids[:-1]
    gap = times[1:] - times[:-1]
    stall = same & (gap > STALL_FACTOR * median_itl)
    # A request's decoding runs from its first token to its last, broken at each stall.
    run_start = np.r_[True, ~same | stall][: len(ids)]
    run_end = np.r_[~same | stall, True][: len(ids)]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.7, 0.3])
    waiting = shown.filter(pl.col("first_token").is_not_null())
    fig.add_trace(go.Scatter(**segments(waiting["arrival"].to_numpy(), waiting["first_token"].to_numpy(),
                                       waiting["request_id"].to_numpy()),
                             mode="lines", line={"color": GREY, "width": 1}, name="waiting for the first token"),
                  row=1, col=1)
    fig.add_trace(go.Scatter(**segments(times[run_start], times[run_end], ids[run_start]), mode="lines+markers",
                             line={"color": BLUE, "width": 3}, marker={"size": 3}, name="decoding"), row=1, col=1)
    fig.add_trace(go.Scatter(**segments(times[:-1][stall], times[1:][stall], ids[1:][stall]), mode="lines",
                             line={"color": RED, "width": 2}, name="stall"), row=1, col=1)
    preempted = shown.filter(pl.col("preemptions") > 0)
    last_token = sample.group_by("request_id").agg(pl.col("time").max().alias("last"))
    marks = preempted.join(last_token, on="request_id", how="left")
    fig.add_trace(go.Scatter(x=marks["finish"].fill_null(marks["last"]), y=marks["request_id"], mode="markers",
                             marker={"symbol": "diamond", "size": 9, "color": ORANGE},
                             text=[f"preempted {n}x" for n in marks["preemptions"]],
                             name="preempted (at its finish; the tables do not say when)"), row=1, col=1)
    for name, keep, colour in (("gap", same & ~stall, BLUE), ("stall gap", stall, RED)):
        fig.add_trace(go.Scattergl(x=times[1:][keep], y=gap[keep] * 1e3, mode="markers", name=name,
                                   marker={"size": 3, "color": colour}, showlegend=False), row=2, col=1)
    fig.add_hline(y=STALL_FACTOR * median_itl * 1e3, line_dash="dot", line_color=RED, row=2, col=1)
    fig.update_yaxes(title_text="request id", row=1, col=1)
    fig.update_yaxes(title_text="gap since previous token (ms)", type="log", row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    count = f"{len(chosen)} of {requests.height} requests" if len(chosen) < requests.height else "every request"
    fig.update_layout(title=f"Token times ({count}, {preempted.height} of them preempted); red: a stall, a gap over "
                            f"{STALL_FACTOR:g}x the median ITL ({STALL_FACTOR * median_itl * 1e3:.3g} ms)",
                      height=850, legend={"orientation": "h", "y": -0.08})
    return fig


def server_figure(steps: pl.DataFrame, kv_blocks: int) -> go.Figure:
    """Per forward pass: batch size (decode-only steps apart from steps with a prefill), prefill tokens, KV use
    with the steps that preempted marked, and waiting requests."""
    with_prefill = steps.filter(pl.col("prefill_tokens") > 0)
    decode_only = steps.filter(pl.col("prefill_tokens") == 0)
    preempting = steps.filter(pl.col("num_preempted") > 0)
    fig = make_subplots(rows=4, cols=1, shared_xaxes=True, vertical_spacing=0.04, row_heights=[0.3, 0.2, 0.25, 0.25])
    fig.add_trace(go.Scattergl(x=decode_only["start"], y=decode_only["num_seqs"], mode="markers",
                               name="decode-only step", marker={"size": 3, "color": BLUE}), row=1, col=1)
    fig.add_trace(go.Scattergl(x=with_prefill["start"], y=with_prefill["num_seqs"], mode="markers",
                               name="step with a prefill", marker={"size": 4, "color": ORANGE}), row=1, col=1)
    fig.add_trace(go.Scattergl(x=with_prefill["start"], y=with_prefill["prefill_tokens"], mode="markers",
                               name="prefill tokens", marker={"size": 4, "color": ORANGE}, showlegend=False),
                  row=2, col=1)
    fig.add_trace(go.Scattergl(x=steps["start"], y=steps["kv_blocks_used"] / kv_blocks * 100, mode="lines",
                               line={"shape": "hv", "color": GREEN}, name="KV cache used"), row=3, col=1)
    fig.add_trace(go.Scattergl(x=preempting["start"], y=preempting["kv_blocks_used"] / kv_blocks * 100,
                               mode="markers", marker={"symbol": "x", "size": 7, "color": RED},
                               text=[f"{n} preempted" for n in preempting["num_preempted"]],
                               name="step that preempted"), row=3, col=1)
    fig.add_trace(go.Scattergl(x=steps["start"], y=steps["num_waiting"], mode="lines",
                               line={"shape": "hv", "color": GREY}, name="waiting requests"), row=4, col=1)
    for row, title in enumerate(("sequences in the step", "prefill tokens", "KV cache used (%)", "waiting requests"),
                                start=1):
        fig.update_yaxes(title_text=title, row=row, col=1)
    fig.update_xaxes(title_text="time (s)", row=4, col=1)
    fig.update_layout(title="The server per forward pass (blue: decode-only steps, orange: steps with a prefill, "
                            "red x: a step that preempted)", height=900, legend={"orientation": "h", "y": -0.06})
    return fig


HIT_RATE_WINDOWS = 50
"""The windowed hit rate is drawn over this many equal spans of the run."""


def prefix_cache_figure(steps: pl.DataFrame) -> go.Figure:
    """The prefix cache's hit rate over time, as vLLM's (hit tokens / queried tokens): so far, and
    within each of `HIT_RATE_WINDOWS` equal spans of the run (the admissions' queries in it)."""
    queried = steps.filter(pl.col("prefix_cache_queried_tokens") > 0)
    start = queried["start"].to_numpy()
    asked = queried["prefix_cache_queried_tokens"].to_numpy().astype(np.float64)
    hit = queried["prefix_cache_hit_tokens"].to_numpy().astype(np.float64)
    edges = np.linspace(start[0], start[-1], HIT_RATE_WINDOWS + 1)
    window = np.clip(np.searchsorted(edges, start, side="right") - 1, 0, HIT_RATE_WINDOWS - 1)
    asked_in = np.bincount(window, weights=asked, minlength=HIT_RATE_WINDOWS)
    hit_in = np.bincount(window, weights=hit, minlength=HIT_RATE_WINDOWS)
    some = asked_in > 0
    fig = go.Figure()
    fig.add_trace(go.Scattergl(x=start, y=np.cumsum(hit) / np.cumsum(asked) * 100, mode="lines",
                               line={"shape": "hv", "color": BLUE}, name="so far"))
    fig.add_trace(go.Bar(x=((edges[:-1] + edges[1:]) / 2)[some], y=(hit_in[some] / asked_in[some]) * 100,
                         width=(edges[1] - edges[0]) * 0.9, marker={"color": ORANGE, "opacity": 0.5},
                         name=f"in each 1/{HIT_RATE_WINDOWS} of the run"))
    fig.update_yaxes(title_text="prefix cache hit rate (%)", range=[0, 100])
    fig.update_xaxes(title_text="time (s)")
    fig.update_layout(title="Prefix cache hit rate (prompt tokens found cached / looked up, at admission)",
                      height=450, legend={"orientation": "h", "y": -0.2})
    return fig


def median_gap(tokens: pl.DataFrame, itl: np.ndarray) -> float:
    """The median ITL of the finished requests, or of every request's gaps when none finished."""
    from simulator.metrics.summary import inter_token_latencies

    gaps = itl if len(itl) else inter_token_latencies(tokens.sort("request_id", "index"))
    return float(np.median(gaps)) if len(gaps) else float("nan")


def run_figures(requests: pl.DataFrame, steps: pl.DataFrame, tokens: pl.DataFrame | None,
                kv_blocks: int) -> dict[str, go.Figure]:
    """A run's figures by page id; each left out when it would draw nothing (no request finished, no
    tokens, no steps)."""
    figures = {}
    itl = None if tokens is None else pooled_gaps(requests, tokens)
    if requests["finished"].any():
        figures["latency"] = latency_figure(requests, itl)
    if tokens is not None and itl is not None and not tokens.is_empty():
        figures["tokens"] = token_figure(requests, tokens, median_gap(tokens, itl))
    if not steps.is_empty():
        figures["server"] = server_figure(steps, kv_blocks)
    if "prefix_cache_queried_tokens" in steps.columns and steps["prefix_cache_queried_tokens"].sum():
        figures["prefix_cache"] = prefix_cache_figure(steps)
    return figures
