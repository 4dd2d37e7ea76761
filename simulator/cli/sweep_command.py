"""`servesim sweep`: its command line (one option per run setting); the sweep itself is `simulator.sweep.grid`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from simulator.cli.options import Choice, SettingType, aligned
from simulator.ranges import Range, parse_percentiles
from simulator.sweep.executors import setting_column
from simulator.sweep.files import AXIS_NAMES, SETTING_TYPES
from simulator.sweep.grid import SweepSpec, flag, parse_value, read_spec_file, run_sweep


def setting_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One option per run setting, taking one value or a comma-separated list."""
    for name in reversed(AXIS_NAMES):
        kind, optional = SETTING_TYPES[name]
        help_text = f"{kind.__name__} values" + (" ('none' for unset)" if optional else "") + ", comma-separated."
        command = click.option(flag(name), name, default=None, metavar="V[,V...]", help=help_text)(command)
    return command


MAX_JOBS = 1024
"""Most worker processes: a machine's cores, at the most."""
SHOWN_ROWS = 30
"""Configurations the table printed after a sweep shows; the rest are in --out."""


def found_table(spec: SweepSpec, rows: list[dict[str, Any]], out: Path) -> str:
    """What the sweep found, one line per configuration: the settings that vary, throughput, the
    highest percentile's TTFT and TPOT (p99 by default; none when no percentile was asked for), and
    whether the server kept up."""
    varying = [name for name in AXIS_NAMES if len(spec.axes.get(name, ())) > 1]
    tails = [f"p{max(parse_percentiles(spec.percentiles)):g}"] if spec.percentiles else []
    headers = [*varying, "req/s", *(f"{p} {name} ms" for p in tails for name in ("TTFT", "TPOT")), "kept up"]
    lines = []
    for row in rows[:SHOWN_ROWS]:
        shown = [cell(row[setting_column(name)]) for name in varying]
        if row.get("error") is not None:
            lines.append([*shown, *["-"] * (len(headers) - len(shown) - 1), "failed"])
            continue
        latencies = [number(row[f"{p}_{name}"], 1e3, 1) for p in tails for name in ("ttft", "tpot")]
        lines.append([*shown, number(row["request_throughput"], 1.0, 2), *latencies,
                      kept_up(row["kept_up"], row["load"])])
    more = f"\n... and {len(rows) - SHOWN_ROWS} more configurations in {out}" if len(rows) > SHOWN_ROWS else ""
    return aligned(headers, lines) + more


def cell(value: Any) -> str:
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def number(value: float | None, scale: float, digits: int) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * scale:.{digits}f}"


def kept_up(kept: bool | None, load: str) -> str:
    """The load verdict in a word (`simulator.metrics.summary.load_state`)."""
    if kept is not None:
        return "yes" if kept else "no"
    return {"all at once": "burst", "open loop": "too short"}.get(load, "-")


@click.command("sweep")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Parquet file, one row per configuration; an existing sweep file is extended.")
@click.option("--file", "spec_file", type=click.Path(path_type=Path), default=None,
              help="YAML or TOML file with 'axes' (setting: [values]) and 'fixed' (setting: value).")
@click.option("--jobs", type=SettingType("jobs", Range(int, 1, MAX_JOBS, "workers")), default=None,
              help="Configurations run at once [default: all cores].")
@click.option("--executor", type=Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--address", default=None, help="Ray cluster to run on [default: start a local Ray instance].")
@click.option("--tables", "tables_dir", type=click.Path(path_type=Path), default=None,
              help="Also write every configuration's requests, tokens and steps here, Hive-partitioned by "
                   "config_id.")
@click.option("--retry-failed", is_flag=True, help="Run again the configurations whose row holds an error.")
@click.option("--percentiles", default=None, help="Latency percentiles of every summary [default: 50,90,99].")
@click.option("--goodput", multiple=True, help="SLOs in ms, e.g. 'ttft:500 tpot:50'.")
@click.option("--quiet", is_flag=True, help="No progress bar on stderr (there is none unless stderr is a terminal).")
@click.option("--force", is_flag=True, help="Run even configurations estimated to need more memory than this "
                                            "machine has.")
@setting_options
def sweep_command(out: Path, spec_file: Path | None, jobs: int | None, executor: str, address: str | None,
                  tables_dir: Path | None, retry_failed: bool, percentiles: str | None, goodput: tuple[str, ...],
                  quiet: bool, force: bool, **settings: str | None) -> None:
    """Run the cartesian product of run settings: `--rate 2,4,8 --policy static,chunked`.

    Exits 1 when every configuration failed (the rows, with their errors, are written)."""
    from simulator.progress import progress_enabled

    axes, sweep_wide = read_spec_file(spec_file) if spec_file is not None else ({}, {})
    for name, text in settings.items():
        if text is not None:
            axes[name] = [parse_value(name, value) for value in text.split(",")]
    if percentiles is not None:
        sweep_wide["percentiles"] = percentiles
    if goodput:
        sweep_wide["goodput"] = " ".join(goodput)
    spec = SweepSpec(axes, **sweep_wide)
    workers = jobs if jobs is not None else len(os.sched_getaffinity(0))
    outcome = run_sweep(spec, out, jobs=workers, executor=executor, address=address, tables_dir=tables_dir,
                        retry_failed=retry_failed, progress=progress_enabled(quiet), force=force)
    click.echo(f"wrote {out}: {outcome.total} configurations, {outcome.ran} run now, {outcome.skipped} already done, "
               f"{len(outcome.failed)} failed")
    click.echo(found_table(spec, outcome.rows, out))
    for cid, error in outcome.failed[:5]:
        click.echo(f"  {cid}: {error}")
    if len(outcome.failed) > 5:
        click.echo(f"  ... and {len(outcome.failed) - 5} more; see the 'error' column")
    if outcome.succeeded == 0:
        raise click.ClickException(f"every configuration failed; {out} holds their errors in its 'error' column")
