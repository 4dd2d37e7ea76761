"""A plan's rows (one per deployment, `plan.parquet`), its pick, and the folder it writes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from simulator.plan.launch import bench_params, dump, launch, serve_params, simulate_args
from simulator.plan.search import Outcome, PlanSpec
from simulator.plan.space import WORKLOAD_SETTINGS, Deployment
from simulator.sweep.executors import setting_column

TOP = 5
"""Deployments the serve/bench parameter files and the terminal list."""


def row(outcome: Outcome, spec: PlanSpec) -> dict[str, Any]:
    deployment, capacity = outcome.deployment, outcome.capacity
    settings = {setting_column(k): v for k, v in deployment.settings.items() if k not in WORKLOAD_SETTINGS}
    at = capacity.at if capacity is not None else None
    rate = capacity.max_rate if capacity is not None else math.nan
    price = spec.price(deployment)
    tokens = at.output_throughput if at is not None else math.nan
    result: dict[str, Any] = settings | {
        "deployment": deployment.key,
        "kind": "disaggregated" if deployment.disaggregated else "aggregated",
        "gpus": deployment.gpus,
        "max_rate": rate,
        "max_rate_low": rate,
        "max_rate_high": capacity.failed_rate if capacity is not None else None,
        "bound_rate": outcome.bound,
        "probes": len(capacity.probes) if capacity is not None else 0,
        "tokens_per_s_per_gpu": tokens / deployment.gpus,
        "tokens_per_s_per_user": at.tokens_per_user if at is not None else math.nan,
        "cost_per_million_tokens": price / 3600 / tokens * 1e6 if price and tokens > 0 else None,
        "viable": capacity is not None and capacity.at is not None and outcome.reason is None,
        "reason": outcome.reason or (capacity.note if capacity is not None and capacity.at is None else None),
        "how": f"symmetry: {capacity.note}" if outcome.how == "symmetry" and capacity else outcome.how,
        "simulate_args": simulate_args(deployment.settings, rate, outcome.num_requests, spec.slos)
        if at is not None else None,
        "launch": launch(deployment.settings),
    }
    for slo in spec.slos.limits:
        value = at.values[slo.name] if at is not None else math.nan
        result[slo.name] = value * 1e3
    if spec.slos.goodput:
        result["slo_attainment"] = at.values["slo_attainment"] if at is not None else math.nan
    if spec.target_rate is not None:
        result["viable"] = bool(result["viable"] and rate >= spec.target_rate)
    return result


def ranked(rows: list[dict[str, Any]], spec: PlanSpec) -> list[dict[str, Any]]:
    """Viable rows, best first: with a target rate the fewest GPUs (or cheapest), then the most
    headroom; else the most req/s per GPU (or per dollar), then the fewest GPUs."""
    viable = [r for r in rows if r["viable"]]

    def price(r: dict[str, Any]) -> float:
        hourly = spec.price(Deployment(r))  # the row holds the settings under their own names
        return hourly if hourly is not None else math.inf

    def key(r: dict[str, Any]) -> tuple[float, float]:
        if spec.target_rate is not None:
            return (price(r) if spec.hourly_cost else r["gpus"], -r["max_rate"])
        if spec.hourly_cost:
            return (-(r["max_rate"] / price(r)), r["gpus"])
        return (-r["tokens_per_s_per_gpu"], r["gpus"])

    return sorted(viable, key=key)


def write_plan(out: Path, outcomes: list[Outcome], rows: list[dict[str, Any]], spec: PlanSpec,
               metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """plan.parquet and the serve_sla files of the top deployments; returns the top rows."""
    import polars as pl

    from simulator.outputs.run_folder import write_parquet

    out.mkdir(parents=True, exist_ok=True)
    write_parquet(pl.from_dicts(rows, infer_schema_length=None), out / "plan.parquet", metadata)
    top = ranked(rows, spec)[:TOP]
    by_key = {outcome.deployment.key: outcome for outcome in outcomes}
    serve, bench = [], []
    for r in top:
        outcome = by_key[r["deployment"]]
        settings = outcome.deployment.settings
        serve.append({"_benchmark_name": r["deployment"]} | serve_params(settings))
        bench.append({"_benchmark_name": f"{r['deployment']}-at-max-rate"}
                     | bench_params(settings, r["max_rate"], outcome.num_requests))
    (out / "serve_params.json").write_text(dump(serve))
    (out / "bench_params.json").write_text(dump(bench))
    (out / "sla_params.json").write_text(dump(spec.slos.sla_params()))
    return top
