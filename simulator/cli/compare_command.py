"""`simulate compare`: measured benchmark results rerun in servesim, measured against simulated.

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import click
import polars as pl

from simulator.cli.options import SettingType, deployment_options, setting
from simulator.errors import InputError
from simulator.ranges import Range

if TYPE_CHECKING:
    from simulator.deploy.resolve import ModelResolver


def profile_for(gpus: tuple[str, ...]) -> dict[str, str]:
    """--gpu as {GPU name: profile}: the rows measured on that GPU run on it."""
    from simulator.deploy.hardware import load_gpu

    mapped: dict[str, str] = {}
    for gpu in gpus:
        name = load_gpu(gpu).name
        if name in mapped:
            raise InputError(f"--gpu {gpu} and --gpu {mapped[name]} are both profiles of {name}: give one")
        mapped[name] = gpu
    return mapped


def percent(error: float) -> str:
    """A relative error as a signed percentage; n/a where the measured value is 0 (no error relative to it)."""
    return "n/a" if math.isnan(error) else f"{error:+.1%}"


def print_rows(rows: pl.DataFrame) -> None:
    compact = set(rows["statistic"].unique().to_list()) <= {"ttft_mean", "tpot_mean"}
    if compact:
        click.echo(f"{'point':<44}{'TP':>3}{'conc':>5}{'isl':>6}{'osl':>6}{'TTFT ms':>9}{'sim':>9}{'error':>8}"
                   f"{'TPOT ms':>9}{'sim':>8}{'error':>8}")
    for (name,), point in rows.group_by("point", maintain_order=True):
        stats = {r["statistic"]: r for r in point.iter_rows(named=True)}
        first = point.row(0, named=True)
        if compact:
            cells = "".join(f"{stats[s]['measured'] * 1e3:>9.1f}{stats[s]['simulated'] * 1e3:>9.1f}"
                            f"{percent(stats[s]['error']):>8}" if s in stats else f"{'-':>26}"
                            for s in ("ttft_mean", "tpot_mean"))
            click.echo(f"{str(name)[-43:]:<44}{first['tensor_parallel_size']:>3}{first['concurrency'] or '-':>5}"
                       f"{first['input_len']:>6.0f}{first['output_len']:>6.0f}{cells}")
            continue
        click.echo(f"{name} ({first['model']} on {first['gpu']}, TP {first['tensor_parallel_size']}):")
        click.echo(f"  {'statistic':<22}{'measured':>12}{'simulated':>12}{'error':>9}")
        for statistic, r in stats.items():
            scale, unit = (1.0, "/s") if "throughput" in statistic else (1e3, " ms")
            click.echo(f"  {statistic + unit:<22}{r['measured'] * scale:>12.2f}{r['simulated'] * scale:>12.2f}"
                       f"{percent(r['error']):>9}")


def print_held_out(table: pl.DataFrame) -> None:
    """Median |error| per stack and per group, on the rows no profile's fit used (held out) and on
    those one did."""
    if table.is_empty():
        return
    click.echo("\nmedian |error| per stack and group, rows no fit used (held out) and rows a profile's host fit "
               "used (its stack, GPU, weights and TP sizes):")
    width = group_width(table)
    click.echo(f"  {'stack':<8}{'group':<{width}}{'':<10}{'rows':>6}{'TTFT':>9}{'TPOT':>9}")
    for (backend, group, fitted), part in table.group_by("backend", "group", "fitted", maintain_order=True):
        cells = {r["statistic"]: r for r in part.iter_rows(named=True)}
        values = "".join(f"{cells[s]['median_abs_error']:>9.1%}" if s in cells else f"{'-':>9}"
                         for s in ("ttft_mean", "tpot_mean"))
        count = max(r["points"] for r in cells.values())
        click.echo(f"  {backend:<8}{group:<{width}}{'fitted' if fitted else 'held out':<10}{count:>6}{values}")


def group_width(table: pl.DataFrame) -> int:
    """The group column's width: the longest group's name and a gap, at least 30."""
    return max(30, *(len(group) + 2 for group in table["group"]))


POINTS_SHOWN = 10
"""Points each check of `simulate compare` lists by name (the bandwidth and in-flight ones); the rest are counted."""


def print_bandwidth(rows: pl.DataFrame) -> None:
    """The points whose measured decode needs more memory bandwidth than their GPUs have, as rerun
    (`simulator.sim2real.bandwidth`), the worst first."""
    shares = rows.group_by("point", maintain_order=True).agg(pl.col("bandwidth_share").first(), pl.col("gpu").first())
    checked = shares.filter(pl.col("bandwidth_share").is_not_nan())
    over = checked.filter(pl.col("bandwidth_share") > 1).sort("bandwidth_share", descending=True)
    if checked.is_empty():
        return
    click.echo(f"\ndecode traffic: {over.height} of {checked.height} checked points need more memory bandwidth "
               "than their GPUs have, rerun as they state (a smaller KV cache, speculative decoding or shorter "
               "outputs would explain it)" + (":" if over.height else ""))
    for r in over.head(POINTS_SHOWN).iter_rows(named=True):
        click.echo(f"  {r['point'][-60:]:<60}{r['bandwidth_share']:>7.0%} of {r['gpu']}'s bandwidth")
    if over.height > POINTS_SHOWN:
        click.echo(f"  ... and {over.height - POINTS_SHOWN} more (the `bandwidth_share` column of --out)")


def print_in_flight(rows: pl.DataFrame) -> None:
    """The closed-loop points whose measured server decoded under half the requests at once that
    their rerun did, by Little's law (`simulator.sim2real.inflight`), the fewest first."""
    from simulator.sim2real.inflight import SHARE, fewer_at_once

    fewer, checked = fewer_at_once(rows)
    if not checked:
        return
    click.echo(f"\nrequests decoding at once: {fewer.height} of {checked} closed-loop points ran under {SHARE:.0%} "
               "as many as their rerun (Little's law on the mean TTFT and TPOT; a smaller KV cache, a lower "
               "max-num-seqs or a capped client would explain it)" + (":" if fewer.height else ""))
    for r in fewer.head(POINTS_SHOWN).iter_rows(named=True):
        click.echo(f"  {r['point'][-60:]:<60}{r['measured']:>7.1f} at once of {r['concurrency']} clients "
                   f"(rerun {r['simulated']:.1f})")
    if fewer.height > POINTS_SHOWN:
        click.echo(f"  ... and {fewer.height - POINTS_SHOWN} more")


def print_skips(skipped: list[tuple[str, str]], total: int) -> None:
    """The skipped rows counted by reason, most first."""
    if not skipped:
        return
    counts: dict[str, int] = {}
    for _, reason in skipped:
        counts[reason] = counts.get(reason, 0) + 1
    click.echo(f"\nskipped {len(skipped)} of {total} rows (--strict makes a skip an error):")
    for reason, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        click.echo(f"  {count:>6}  {reason}")


def print_models(resolver: ModelResolver) -> None:
    """How each model id was resolved, and from where."""
    models = resolver.resolved()
    if models:
        click.echo("\nmodels:")
        for found in models:
            dtype = ("weights as the row's quant mode or --quantization says" if found.variant
                     else f"its config: {found.weight_dtype} weights" if found.weight_dtype
                     else "its config: unquantized weights, fp8 where a row's quant mode says so")
            click.echo(f"  {found.hub_id} -> {found.name} ({found.found}; {dtype})")


def print_notes(notes: dict[str, int]) -> None:
    """The cost model's notes (shapes past its measured tables), once each, with how many rows met them."""
    if notes:
        click.echo("\nshapes past the measured kernel tables, extrapolated (rows that met each):")
        for note, count in sorted(notes.items(), key=lambda item: (-item[1], item[0]))[:NOTES_SHOWN]:
            click.echo(f"  {count:>6}  {note.removeprefix('measured cost extrapolated: ')}")
        if len(notes) > NOTES_SHOWN:
            click.echo(f"  ... and {len(notes) - NOTES_SHOWN} more shapes")


NOTES_SHOWN = 5
MAX_JOBS = 1024
CLIENTS = ("supported", "plain")


def is_silicon(path: Path) -> bool:
    """Whether `path` is read as aiconfigurator's silicon table (a CSV that is not an aiperf export,
    `simulator.sim2real.measured.read_measured`): the rows the supported rerun rules are of."""
    if path.suffix.lower() != ".csv":
        return False
    with path.open(encoding="utf-8", errors="replace") as file:
        return file.readline().lstrip("\ufeff").split(",", 1)[0].strip() != "Metric"


@click.command("compare")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--gpu", multiple=True, help="Profile to rerun on (repeat for several GPUs): the first is the GPU of "
                                            "a vLLM or aiperf result (its file does not say); for a CSV, the rows "
                                            "measured on a profile's GPU run on it [default: each row's shipped "
                                            "vLLM-fitted profile, <gpu>_vllm].")
@deployment_options
@click.option("--model", default=None, help="A vLLM or aiperf result's model (a built-in name or a config.json), "
                                            "if its model id resolves to none.")
@click.option("--models", "models_dir", type=click.Path(path_type=Path), default=None,
              help="Folder of model configs to resolve hub ids in: org--name.config.json or org/name/config.json "
                   "[default: the built-in models and the Hugging Face cache only].")
@setting("max_num_batched_tokens", type=int, help="The servers' token budget per step (vLLM's default on an "
                                                  "H100-class GPU).")
@setting("max_num_seqs", type=int, help="The servers' most sequences per step (vLLM's default there).")
@click.option("--disable-custom-all-reduce", "disable_custom_all_reduce", is_flag=True,
              help="The servers ran every all-reduce by NCCL, their custom all-reduce off (as --max-num-batched-"
                   "tokens: a silicon row's only under plain).")
@click.option("--client", type=click.Choice(CLIENTS), default="supported", show_default=True,
              help="How a silicon CSV's rows are rerun: `supported`, as the data supports they ran, per stack "
                   "(vLLM and TensorRT-LLM with aiconfigurator's token budget max batch + isl + 1500, SGLang "
                   "with its stock scheduler and NCCL's all-reduce; docs/validation/stack-fidelity.md), or "
                   "`plain`, on the stack's stock scheduler as --max-num-batched-tokens and --max-num-seqs give "
                   "it (which apply to a silicon row only under plain, and to a vLLM or aiperf result always).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of arrivals and client times.")
@click.option("--strict", is_flag=True, help="A row servesim cannot express is an error, not a skip.")
@click.option("--jobs", type=SettingType("jobs", Range(int, 1, MAX_JOBS, "workers")), default=None,
              help="Points rerun at once [default: all cores].")
@click.option("--quiet", is_flag=True, help="No progress bar on stderr (there is none unless stderr is a terminal).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the rows (one per point and statistic) as Parquet here [default: none].")
def compare_command(results: tuple[Path, ...], gpu: tuple[str, ...], tensor_parallel_size: int,
                    quantization: str | None, kv_cache_dtype: str, model: str | None, models_dir: Path | None,
                    max_num_batched_tokens: int, max_num_seqs: int, disable_custom_all_reduce: bool, client: str,
                    seed: int, strict: bool, jobs: int | None, quiet: bool, out: Path | None) -> None:
    """Rerun measured results (silicon CSV, vLLM bench serve JSON, aiperf export) and print measured against
    simulated; rows servesim cannot express are skipped and counted by reason."""
    import os

    from simulator.deploy.resolve import ModelResolver
    from simulator.outputs.run_folder import check_output_file, write_parquet
    from simulator.progress import Bar, progress_enabled
    from simulator.sim2real.compare import ROW_SCHEMA, Scheduler, held_out_summary, summary, with_deployment
    from simulator.sim2real.measured import read_measured
    from simulator.sim2real.regret import regret_lines
    from simulator.sim2real.sweeps import SUPPORTED, Hypothesis
    from simulator.sim2real.units import run_units, units_of
    from simulator.sweep.executors import WorkerDied

    if kv_cache_dtype != "auto":
        raise InputError(f"--kv-cache-dtype {kv_cache_dtype} is not replayed: each row reruns with the KV dtype its "
                         "stack and weights give (TensorRT-LLM's fp8 over fp8 weights, else the model's)")
    if model is not None:
        from simulator.deploy.model import load_model

        load_model(model)
    if seed < 0:
        raise InputError(f"--seed must be an integer >= 0, got {seed}")
    if out is not None:
        check_output_file(out, "--out")
    resolver = ModelResolver(models_dir)
    points, skipped, total = [], [], 0
    rules: list[Hypothesis | None] = []
    for path in results:
        reading = read_measured(path, model, resolver, strict)
        silicon = client == "supported" and is_silicon(path)
        rules += [SUPPORTED.get(p.backend) if silicon else None for p in reading.points]
        total += len(reading.points) + len(reading.skipped)
        skipped += reading.skipped
        for point in reading.points:
            if not point.gpu:
                if not gpu:
                    raise InputError(f"{path.name} does not record its GPU (a vLLM or aiperf result): give --gpu")
                point = with_deployment(point, gpu[0], tensor_parallel_size, quantization)
            points.append(point)
    units = units_of(points)  # one point each, so rules[i] is unit i's
    results_by_unit: dict[int, list[dict[str, object]]] = {}
    notes: dict[str, int] = {}
    bar = Bar(len(units), desc="compare", unit="point", enabled=progress_enabled(quiet))
    try:
        for done, result in enumerate(run_units(units, profile_for(gpu), seed,
                                                Scheduler(max_num_batched_tokens, max_num_seqs,
                                                          disable_custom_all_reduce=disable_custom_all_reduce),
                                                jobs if jobs is not None else len(os.sched_getaffinity(0)),
                                                rules), 1):
            bar.advance(done)
            if result.skipped and strict:
                raise InputError(f"{result.skipped[0][0]}: cannot be rerun (--strict): {result.skipped[0][1]}")
            results_by_unit[result.index] = result.rows
            skipped += result.skipped
            for note in result.notes:
                notes[note] = notes.get(note, 0) + 1
    except WorkerDied as exc:
        raise InputError(f"{exc} after {len(results_by_unit)} of {len(units)} points were rerun; nothing was "
                         "written: rerun with --jobs 1 to see the point it died on") from None
    finally:
        bar.close()
    rows = pl.DataFrame([row for index in sorted(results_by_unit) for row in results_by_unit[index]],
                        schema=ROW_SCHEMA)
    if rows.height:
        print_rows(rows)
        table = summary(rows)
        click.echo("\nmedian |error|:")
        width = group_width(table)
        for r in table.iter_rows(named=True):
            click.echo(f"  {r['group']:<{width}}{r['statistic']:<22}{r['median_abs_error']:>8.1%}"
                       f"  ({r['points']} points)")
        print_held_out(held_out_summary(rows))
        click.echo("\n" + "\n".join(regret_lines(rows)))
        print_bandwidth(rows)
        print_in_flight(rows)
    print_models(resolver)
    print_notes(notes)
    print_skips(skipped, total)
    if not rows.height:
        raise InputError(f"nothing to rerun: {skipped[0][0]}: {skipped[0][1]}" if len(skipped) == 1
                         else f"nothing to rerun: all {total} rows were skipped")
    if out is not None:
        write_parquet(rows, out, {"results": [str(p) for p in results], "gpu": list(gpu), "seed": seed,
                                  "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                                  "client": client,
                                  "skipped": [f"{where}: {reason}" for where, reason in skipped]})
        click.echo(f"wrote {out}")
