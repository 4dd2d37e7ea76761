"""`simulate compare`: measured benchmark results rerun in servesim, measured against simulated.

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

import math
from pathlib import Path

import click
import polars as pl

from simulator.cli.options import deployment_options, setting
from simulator.errors import InputError


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


@click.command("compare")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--gpu", multiple=True, help="Profile to rerun on (repeat for several GPUs): the first is the GPU of "
                                            "a vLLM result (its file does not say); for a CSV, the rows measured on "
                                            "a profile's GPU run on it [default: each row's shipped vLLM-fitted "
                                            "profile, <gpu>_vllm].")
@deployment_options
@click.option("--model", default=None, help="A vLLM result's model, if its model_id names none servesim knows.")
@setting("max_num_batched_tokens", type=int, help="The servers' token budget per step (vLLM's default on an "
                                                  "H100-class GPU).")
@setting("max_num_seqs", type=int, help="The servers' most sequences per step (vLLM's default there).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of arrivals and client times.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Write the rows (one per point and statistic) as Parquet here [default: none].")
def compare_command(results: tuple[Path, ...], gpu: tuple[str, ...], tensor_parallel_size: int,
                    quantization: str | None, kv_cache_dtype: str, model: str | None, max_num_batched_tokens: int,
                    max_num_seqs: int, seed: int, out: Path | None) -> None:
    """Rerun measured results (vLLM bench serve JSON, silicon CSV) and print measured against simulated."""
    from simulator.outputs.run_folder import check_output_file, write_parquet
    from simulator.sim2real.compare import Scheduler, compare_points, summary, with_deployment
    from simulator.sim2real.measured import read_points

    if kv_cache_dtype != "auto":
        raise InputError(f"--kv-cache-dtype {kv_cache_dtype} is not replayed: the measured servers ran the "
                         "model's own KV dtype")
    if model is not None:
        from simulator.deploy.model import load_model

        load_model(model)
    if seed < 0:
        raise InputError(f"--seed must be an integer >= 0, got {seed}")
    if out is not None:
        check_output_file(out, "--out")
    points = []
    for path in results:
        for point in read_points(path, model):
            if not point.gpu:
                if not gpu:
                    raise InputError(f"{path.name} is a vLLM result, which does not record its GPU: give --gpu")
                point = with_deployment(point, gpu[0], tensor_parallel_size, quantization)
            points.append(point)
    rows = compare_points(points, profile_for(gpu), seed, Scheduler(max_num_batched_tokens, max_num_seqs))
    print_rows(rows)
    table = summary(rows)
    click.echo("\nmedian |error|:")
    for r in table.iter_rows(named=True):
        click.echo(f"  {r['group']:<24}{r['statistic']:<22}{r['median_abs_error']:>8.1%}  ({r['points']} points)")
    from simulator.sim2real.regret import regret_lines

    click.echo("\n" + "\n".join(regret_lines(rows)))
    if out is not None:
        write_parquet(rows, out, {"results": [str(p) for p in results], "gpu": list(gpu), "seed": seed,
                                  "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs})
        click.echo(f"wrote {out}")
