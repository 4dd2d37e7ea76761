"""A fleet's part of a report: a run's page gets one row per server (its role, the requests routed to
it, its busy share, latencies and, for P/D, KV transfer times); a sweep's page a figure of each
configuration's load per server and its KV transfer times. Values come from files and are checked
and escaped like the rest of the page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from simulator.errors import InputError
from simulator.report.html import fmt, milliseconds, number, shown, table

SERVER_NUMBERS = ("requests", "completed", "output_throughput", "busy", "mean_ttft", "p99_ttft", "mean_tpot",
                  "p99_tpot", "mean_transfer", "p99_transfer")
ROLES = ("replica", "prefill", "decode")


def checked_servers(servers: object, where: str) -> list[dict[str, Any]]:
    """summary.servers, each entry's role and numbers checked."""
    if not isinstance(servers, list) or not all(isinstance(s, dict) for s in servers):
        raise InputError(f"{where}: summary.servers must be a list of objects, got {shown(servers)}")
    for s in servers:
        if s.get("role") not in ROLES:
            raise InputError(f"{where}: summary.servers role must be one of {', '.join(ROLES)}, "
                             f"got {shown(s.get('role'))}")
        for key in SERVER_NUMBERS:
            if number(s.get(key)) is None:
                raise InputError(f"{where}: summary.servers {key} must be a number or null, got {shown(s.get(key))}")
    return servers


def servers_section(summary: dict[str, Any], path: Path) -> str:
    """The run page's table of servers ('' for one server)."""
    if "servers" not in summary:
        return ""
    servers = checked_servers(summary["servers"], repr(str(path)))
    header = ["server", "role", "requests", "completed", "output tok/s", "busy", "mean TTFT (ms)", "p99 TTFT (ms)",
              "mean TPOT (ms)", "p99 TPOT (ms)", "mean KV transfer (ms)", "p99 KV transfer (ms)"]
    rows = [[str(i), s["role"], fmt(s.get("requests"), ".0f"), fmt(s.get("completed"), ".0f"),
             fmt(s.get("output_throughput"), ".1f"), fmt(s.get("busy"), ".1%"),
             *(milliseconds(s.get(key)) for key in SERVER_NUMBERS[4:])] for i, s in enumerate(servers)]
    return "<h3>Servers</h3>" + table(header, rows)


def fleet_figure(rows: pl.DataFrame, path: Path) -> go.Figure | None:
    """Per configuration with more than one server of the sweep file `path`: each server's share of
    the requests, and for P/D the mean and p99 KV transfer time. None when no configuration had a fleet."""
    if "servers" not in rows.columns:
        return None
    fleets = rows.filter(pl.col("servers").is_not_null() & pl.col("error").is_null())
    if fleets.is_empty():
        return None
    labels, shares, transfers = [], [], []
    for row in fleets.iter_rows(named=True):
        servers = checked_servers(row["servers"], f"{str(path)!r} row {row['config_id']}")
        labels.append(str(row["config_id"]))
        total = sum(number(s.get("requests")) or 0.0 for s in servers) or 1.0
        shares.append([(number(s.get("requests")) or 0.0) / total for s in servers])
        transfers.append([number(servers[0].get(key)) for key in ("mean_transfer", "p99_transfer")])
    fig = make_subplots(rows=1, cols=2, subplot_titles=["share of the requests, per server", "KV transfer (ms)"])
    for server in range(max(len(s) for s in shares)):
        fig.add_trace(go.Bar(x=labels, y=[s[server] if server < len(s) else None for s in shares],
                             name=f"server {server}"), row=1, col=1)
    for index, stat in enumerate(("mean", "p99")):
        values = [None if (value := t[index]) is None else value * 1e3 for t in transfers]
        if any(v is not None and v == v for v in values):
            fig.add_trace(go.Bar(x=labels, y=values, name=f"{stat} transfer"), row=1, col=2)
    fig.update_layout(barmode="group", title="Load per server and KV transfers, by configuration")
    return fig
