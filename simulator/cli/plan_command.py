"""`simulate plan`: the deployment that serves the most per GPU (or per dollar), or the fewest GPUs
that serve `--rate`, within latency SLOs with their tails. The search is `simulator.plan`.

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import click

from simulator.cli.options import RESULTS_DIR, Choice, SettingType, aligned
from simulator.cli.sweep_command import setting_options
from simulator.errors import InputError
from simulator.ranges import Range, quote
from simulator.sweep.grid import SweepSpec, parse_value, read_spec_file

SHOWN = 8
"""Deployments listed on the terminal; the rest are in plan.parquet."""
SELF_SIZED = ("num_requests", "duration", "percentiles", "goodput")


def hourly_costs(texts: tuple[str, ...]) -> dict[str, float]:
    """--gpu-hourly-cost PROFILE=USD, repeatable."""
    costs: dict[str, float] = {}
    for text in texts:
        profile, _, usd = text.partition("=")
        try:
            value = float(usd)
        except ValueError:
            raise InputError(f"--gpu-hourly-cost takes PROFILE=USD such as h100_sxm=2.5, got {quote(text)}") from None
        if not profile or not 0 < value < 1e6:
            raise InputError(f"--gpu-hourly-cost takes PROFILE=USD (USD > 0), got {quote(text)}")
        costs[profile] = value
    return costs


def published_margin(gpus: list[str], backends: list[str] | None) -> tuple[dict[str, float], str]:
    """The held-out error the profiles a plan runs on publish (`held_out_error` in profile.json: a
    share of TTFT and of TPOT, or one share of both), per SLO metric: TTFT's for ttft, TPOT's for
    tpot and itl, the larger for e2el; the largest over those profiles (each `--gpu`, as each
    `--backend` turns it into its stack's profile). Empty where none publishes one."""
    from simulator.deploy.backends import stack_profile
    from simulator.deploy.hardware import available_gpus, load_profile

    shipped = available_gpus()
    names = sorted({stack_profile(gpu, backend, shipped) for gpu in gpus for backend in backends} if backends
                   else set(gpus))
    found: dict[str, tuple[float, float]] = {}
    for name in names:
        try:
            value = load_profile(name).meta.get("held_out_error")
        except InputError:
            continue
        shares = (value.get("ttft"), value.get("tpot")) if isinstance(value, dict) else (value, value)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1 for v in shares):
            found[name] = (float(shares[0]), float(shares[1]))  # type: ignore[arg-type]
    if not found:
        return {}, f"no held-out error is published for {', '.join(names)}: --margin auto is 0"
    ttft, tpot = max(v[0] for v in found.values()), max(v[1] for v in found.values())
    said = ", ".join(sorted(found))
    return ({"ttft": ttft, "tpot": tpot, "itl": tpot, "e2el": max(ttft, tpot)},
            f"--margin auto: TTFT limits {ttft:.1%} lower, TPOT and ITL {tpot:.1%}, E2EL {max(ttft, tpot):.1%}: the "
            f"held-out error published for {said}")


def describe(row: dict[str, Any]) -> str:
    if row["kind"] == "disaggregated":
        on = {role: f" on {row[f'{role}_gpu']}" if row.get(f"{role}_gpu") else "" for role in ("prefill", "decode")}
        return (f"{row['prefill_replicas']}xTP{row['prefill_tensor_parallel_size']} prefill{on['prefill']} + "
                f"{row['decode_replicas']}xTP{row['decode_tensor_parallel_size']} decode{on['decode']}")
    fleet = f"{row['num_replicas']}x" if row["num_replicas"] > 1 else ""
    router = f" {row['router']}" if row["num_replicas"] > 1 else ""
    return f"{fleet}TP{row['tensor_parallel_size']}{router}"


def table(rows: list[dict[str, Any]], slo_names: list[str]) -> str:
    headers = ["deployment", "gpu", "policy", "budget", "seqs", "fp8", "GPUs", "max req/s", "bracket", "tok/s/GPU",
               "tok/s/user", *slo_names, "how"]
    lines = []
    for r in rows:
        high = r["max_rate_high"]
        bracket = f"[{r['max_rate_low']:.2f}, {high:.2f})" if high is not None else f"[{r['max_rate_low']:.2f}, -)"
        lines.append([describe(r), r["gpu"], r["policy"], str(r["max_num_batched_tokens"]), str(r["max_num_seqs"]),
                      "yes" if r["quantization"] else "no", str(r["gpus"]), f"{r['max_rate']:.2f}", bracket,
                      f"{r['tokens_per_s_per_gpu']:.0f}", f"{r['tokens_per_s_per_user']:.1f}",
                      *(f"{r[name]:.1f}" for name in slo_names), r["how"].split(":")[0]])
    return aligned(headers, lines)


@click.command("plan")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Plan folder (plan.parquet, serve_params.json, bench_params.json, sla_params.json) "
                   "[default: a new folder under results/].")
@click.option("--file", "spec_file", type=click.Path(path_type=Path), default=None,
              help="YAML or TOML file in the sweep file's format ('axes', 'fixed').")
@click.option("--max-gpus", type=SettingType("max_gpus", Range(int, 1, 4096, "GPUs")), default=8, show_default=True,
              help="GPUs a deployment may take at the most.")
@click.option("--gpu-hourly-cost", multiple=True, help="PROFILE=USD per GPU-hour (repeatable): the plan then "
                                                       "maximises req/s per dollar and prices each token.")
@click.option("--slo", multiple=True, help="An SLO as vLLM's serve_sla writes it: 'p99_ttft_ms<=500' (mean_, median_ "
                                           "or pNN_ of ttft, tpot, itl, e2el); repeatable.")
@click.option("--sla-params", type=click.Path(path_type=Path), default=None,
              help="vLLM bench sweep's --sla-params JSON: [{\"p99_ttft_ms\": \"<=500\"}].")
@click.option("--goodput", multiple=True, help="Goodput SLOs in ms as vllm bench serve: 'ttft:500 tpot:50'.")
@click.option("--slo-attainment", type=float, default=None,
              help="Share of requests that must meet every --goodput SLO [default: 0.99].")
@click.option("--margin", default="0", show_default=True,
              help="Tighten every SLO by this share, or 'auto': the held-out error the GPU profile publishes.")
@click.option("--precision", type=float, default=None, help="Width of each capacity's bracket, a share of it "
                                                             "[default: 0.05].")
@click.option("--seeds", type=SettingType("seeds", Range(int, 1, 100, "seeds")), default=1, show_default=True,
              help="A probe within 10% of a limit is rerun on this many seeds in all and passes only if each does.")
@click.option("--exhaustive", is_flag=True, help="Search every deployment's capacity, for the whole frontier "
                                                 "[default: skip what its bound or one probe shows cannot beat "
                                                 "the best found].")
@click.option("--jobs", type=SettingType("jobs", Range(int, 1, 1024, "workers")), default=None,
              help="Deployments searched at once [default: all cores].")
@click.option("--executor", type=Choice(["local", "ray"]), default="local", show_default=True,
              help="Worker processes on this machine, or Ray (for large spaces).")
@click.option("--address", default=None, help="Ray cluster to run on [default: start a local Ray instance].")
@setting_options
def plan_command(out: Path | None, spec_file: Path | None, max_gpus: int, gpu_hourly_cost: tuple[str, ...],
                 slo: tuple[str, ...], sla_params: Path | None, goodput: tuple[str, ...],
                 slo_attainment: float | None, margin: str, precision: float | None, seeds: int,
                 exhaustive: bool, jobs: int | None, executor: str, address: str | None,
                 **settings: str | None) -> None:
    """Plan a deployment: the most load per GPU, or the fewest GPUs for --rate, within latency SLOs."""
    from simulator.outputs.run_folder import check_out_dir, default_run_dir
    from simulator.plan.capacity import PRECISION
    from simulator.plan.resume import PROBES
    from simulator.plan.rows import TOP, ranked, row, write_plan
    from simulator.plan.search import PlanSpec, search
    from simulator.plan.slo import build_slos

    axes, sweep_wide = read_spec_file(spec_file) if spec_file is not None else ({}, {})
    for name, text in settings.items():
        if text is not None:
            axes[name] = [parse_value(name, value) for value in text.split(",")]
    SweepSpec(axes)  # names checked as a sweep checks them
    given = [name for name in SELF_SIZED if name in axes or name in sweep_wide]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')}: a plan sizes its own runs (requests enough for each "
                         "SLO's tail)")
    target = None
    if "rate" in axes:
        if len(axes["rate"]) != 1 or axes["rate"][0] is None or not math.isfinite(axes["rate"][0]):
            raise InputError(f"--rate takes one finite rate to serve (req/s), got {quote(axes['rate'])}")
        target = axes.pop("rate")[0]
    if address is not None and executor != "ray":
        raise InputError(f"--address {quote(address)} is a Ray cluster's: it needs --executor ray")
    slos = build_slos(slo, sla_params, goodput, slo_attainment)
    gpus = [str(g) for g in axes.get("gpu", ["h100_sxm"])]
    share: float | dict[str, float]
    if margin == "auto":
        share, said = published_margin(gpus, [str(b) for b in axes["backend"]] if "backend" in axes else None)
        click.echo(said)
    else:
        share = SettingType("margin", Range(float, 0.0, 0.99, "of each limit")).convert(margin, None, None)
    fixed = {name: values[0] for name, values in axes.items() if len(values) == 1}
    lists = {name: values for name, values in axes.items() if len(values) > 1}
    resuming = out is not None and (out / PROBES).is_dir() and not (out / "plan.parquet").exists()
    if out is not None and not resuming:
        check_out_dir(out)
    out = out or default_run_dir(RESULTS_DIR, "plan")
    if resuming:
        click.echo(f"resuming the plan interrupted in {out}/: its probes are read back, not simulated again")
    spec = PlanSpec(fixed, lists, slos.tightened(share) if share else slos, max_gpus, hourly_costs(gpu_hourly_cost),
                    target, precision if precision is not None else PRECISION,
                    jobs if jobs is not None else len(os.sched_getaffinity(0)), exhaustive, seeds, str(out),
                    executor, address)
    outcomes = search(spec)
    rows = [row(outcome, spec) for outcome in outcomes]
    metadata = {"plan": {"axes": {k: [str(v) for v in vs] for k, vs in axes.items()}, "slos": slos.sla_params(),
                         "margin": share, "max_gpus": max_gpus, "target_rate": target, "precision": spec.precision}}
    top = write_plan(out, outcomes, rows, spec, metadata)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["how"].split(":")[0]] = counts.get(r["how"].split(":")[0], 0) + 1
    click.echo(f"{len(rows)} deployments: " + ", ".join(f"{n} {how}" for how, n in sorted(counts.items())))
    good_limits = [f"{metric}<={limit * 1e3:g} ms" for metric, limit in spec.slos.goodput]
    slo_texts = [s.text() for s in spec.slos.limits]
    if good_limits:
        slo_texts.append(f"{spec.slos.attainment:.3g} of requests meeting {' and '.join(good_limits)}")
    tightened = "" if not share else " (tightened as above)" if isinstance(share, dict) else f" (tightened {share:.0%})"
    click.echo(f"SLOs: {', '.join(slo_texts)}{tightened}"
               + f"; capacities within {spec.precision:.0%} (the bracket: highest rate met, lowest missed)")
    if not top:
        click.echo(f"no deployment meets the SLOs{' at --rate ' + format(target, 'g') if target else ''}; "
                   f"see the reason column of {out / 'plan.parquet'}")
    else:
        click.echo(table(ranked(rows, spec)[:SHOWN], [s.name for s in spec.slos.limits]))
        pick = top[0]
        cost = (f", ${pick['cost_per_million_tokens']:.3f} per million output tokens"
                if pick["cost_per_million_tokens"] is not None else "")
        click.echo(f"\npick: {describe(pick)} on {pick['gpus']} {pick['gpu']}, {pick['max_rate']:.2f} req/s, "
                   f"{pick['tokens_per_s_per_gpu']:.0f} tokens/s/GPU at {pick['tokens_per_s_per_user']:.1f} "
                   f"tokens/s/user{cost}")
        click.echo(pick["launch"])
        click.echo(f"rerun: {pick['simulate_args']}")
    if share:
        base = PlanSpec(fixed, lists, slos, max_gpus, spec.hourly_cost, target, spec.precision, spec.jobs, exhaustive,
                        seeds, str(out), executor, address)
        plain = ranked([row(o, base) for o in search(base)], base)
        without = f"{describe(plain[0])}, {plain[0]['max_rate']:.2f} req/s" if plain else "none"
        click.echo(f"without the margin the pick would be: {without}")
    shutil.rmtree(out / PROBES, ignore_errors=True)  # the plan is whole: nothing left to resume
    click.echo(f"wrote {out}/ (plan.parquet; serve_params.json, bench_params.json for the top {TOP}; sla_params.json)")
