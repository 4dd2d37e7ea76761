"""A fleet's tables and summary: which server served each request and ran each step, and one block
per server beside the fleet's totals (the summary's own figures). For P/D, each request's transfer
(start and end, s) and each server's transfer times."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.fleet.engine import FleetResult
from simulator.metrics.tables import Tables
from simulator.run.result import RunResult

if TYPE_CHECKING:
    import polars as pl


def fleet_columns(fleet: FleetResult, requests: pl.DataFrame, steps: pl.DataFrame
                  ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """requests gain `replica` (or `prefill_server`, `decode_server`, `prefill_end`,
    `transfer_start`, `transfer_end`; -1 and null where it did not happen), steps gain `server`,
    and their prefix-cache hit rate so far is each server's."""
    import polars as pl

    columns = [pl.Series(name, values).fill_nan(None) if values.dtype.kind == "f" else pl.Series(name, values)
               for name, values in fleet.request_columns.items()]
    steps = steps.with_columns(pl.Series("server", fleet.step_server))
    # Each server's own hit rate so far (the step log holds one server's steps after another's).
    queried = pl.col("prefix_cache_queried_tokens").cum_sum().over("server")
    hit_rate = pl.when(queried > 0).then(pl.col("prefix_cache_hit_tokens").cum_sum().over("server") / queried)
    return requests.with_columns(columns), steps.with_columns(hit_rate.alias("prefix_cache_hit_rate"))


def _mean(values: pl.Series) -> float | None:
    values = values.drop_nulls()
    return float(values.mean()) if len(values) else None  # type: ignore[arg-type]


def _p99(values: pl.Series) -> float | None:
    sample = values.drop_nulls().to_numpy()
    return float(np.percentile(sample, 99)) if len(sample) else None


def server_summaries(result: RunResult, tables: Tables, duration: float) -> list[dict[str, Any]]:
    """Per server: its role, the requests routed to it and finished there, its output tokens and
    throughput over the fleet's duration, its busy share, and its requests' TTFT and TPOT (a decode
    server's: of those it decoded); for P/D the transfers it sent or received."""
    import polars as pl

    assert result.fleet is not None
    fleet, requests, steps = result.fleet, tables.requests, tables.steps
    column = "replica" if "replica" in requests.columns else None
    summaries = []
    for index, role in enumerate(fleet.roles):
        name = column or ("prefill_server" if role == "prefill" else "decode_server")
        mine = requests.filter(pl.col(name) == index)
        done = mine.filter(pl.col("finished"))
        busy = float(steps.filter(pl.col("server") == index)["duration"].sum())
        tokens = int(done["output_tokens"].sum()) if role != "prefill" else int(mine["first_token"].is_not_null().sum())
        entry: dict[str, Any] = {
            "server": index, "role": role, "kv_blocks": fleet.kv_blocks[index],
            "requests": mine.height, "completed": done.height, "output_tokens": tokens,
            "output_throughput": tokens / duration if duration > 0 else None,
            "busy": busy / duration if duration > 0 else None,
            "mean_ttft": _mean(mine["ttft"]), "p99_ttft": _p99(mine["ttft"]),
        }
        if role != "prefill":
            entry |= {"mean_tpot": _mean(done["tpot"]), "p99_tpot": _p99(done["tpot"])}
        if column is None:
            transfer = mine["transfer_end"] - mine["transfer_start"]
            entry |= {"mean_transfer": _mean(transfer), "p99_transfer": _p99(transfer)}
        summaries.append(entry)
    return summaries


def fleet_totals(servers: list[dict[str, Any]], requests: pl.DataFrame) -> dict[str, Any]:
    """Scalars a sweep row can hold: the spread of requests and busy shares over the entry pool's
    servers (replicas, or prefill servers) and the decode pool's, and for P/D the KV transfers."""
    totals: dict[str, Any] = {}
    for role in ("replica", "prefill", "decode"):
        pool = [s for s in servers if s["role"] == role]
        if pool:
            busy = [s["busy"] for s in pool if s["busy"] is not None]
            totals |= {f"{role}_requests_min": min(s["requests"] for s in pool),
                       f"{role}_requests_max": max(s["requests"] for s in pool),
                       f"{role}_busy_min": min(busy, default=None), f"{role}_busy_max": max(busy, default=None)}
    if "transfer_end" in requests.columns:
        transfer = requests["transfer_end"] - requests["transfer_start"]
        totals |= {"mean_transfer": _mean(transfer), "p99_transfer": _p99(transfer),
                   "mean_transfer_wait": _mean(requests["transfer_start"] - requests["prefill_end"])}
    return totals


def format_servers(servers: list[dict[str, Any]]) -> str:
    """The per-server block under the fleet's summary."""
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.2f}"

    transfers = "mean_transfer" in servers[0]
    lines = [f"{'server':<8}{'role':<9}{'requests':>9}{'completed':>10}{'out tok/s':>11}{'busy':>7}"
             f"{'TTFT ms':>9}{'p99':>9}{'TPOT ms':>9}{'p99':>8}"
             + (f"{'KV xfer ms':>11}{'p99':>7}" if transfers else "")]
    for s in servers:
        rate = "-" if s["output_throughput"] is None else f"{s['output_throughput']:.1f}"
        busy = "-" if s["busy"] is None else f"{s['busy']:.0%}"
        line = (f"{s['server']:<8}{s['role']:<9}{s['requests']:>9}{s['completed']:>10}{rate:>11}{busy:>7}"
                f"{ms(s['mean_ttft']):>9}{ms(s['p99_ttft']):>9}{ms(s.get('mean_tpot')):>9}{ms(s.get('p99_tpot')):>8}")
        if transfers:
            line += f"{ms(s['mean_transfer']):>11}{ms(s['p99_transfer']):>7}"
        lines.append(line)
    return "\n".join(lines)
