"""`simulate batch-table`: the chapter's table of decode step time against batch size, printed and drawn.

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from simulator.cli.options import RESULTS_DIR, deployment_options, parallel_options, setting
from simulator.config import RunConfig
from simulator.cost import COST_MODELS
from simulator.deploy.hardware import available_gpus
from simulator.deploy.model import BUILTIN_MODELS
from simulator.errors import InputError, clip

if TYPE_CHECKING:
    from simulator.cost.batch_table import BatchTable
    from simulator.deploy.hardware import GpuSpec
    from simulator.deploy.model import ModelSpec


def parse_int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{option} takes integers separated by commas, got {clip(repr(text))}") from None
    if not values or min(values) < 1:
        raise InputError(f"{option} takes positive integers, got {clip(repr(text))}")
    return values


def aligned(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns as wide as their widest cell, two spaces apart: wide values never touch."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return "\n".join("".join(f"{cell:>{width + 2}}" for cell, width in zip(line, widths, strict=True))
                     for line in [headers, *rows])


def warn_past_limits(spec: ModelSpec, table: BatchTable, sizes: list[int]) -> None:
    """Say on stderr which rows no server could run: past the model's context, or past the KV ceiling."""
    context = table.context
    if context > spec.max_model_len:
        click.echo(f"warning: --context {context} is past {spec.name}'s {spec.max_model_len}-token context: "
                   "no request could attend to that many tokens", err=True)
    too_big = [b for b in sizes if b > table.max_batch]
    if too_big:
        click.echo(f"warning: --batch {','.join(map(str, too_big))} is past the KV ceiling of {table.max_batch} "
                   f"sequences of {context} tokens: those rows (marked *) could not run on this GPU", err=True)


def print_table(spec: ModelSpec, hardware: GpuSpec, shard: ModelSpec, table: BatchTable, tensor_parallel_size: int,
                gpu_memory_utilization: float, data_parallel_size: int = 1) -> None:
    """The deployment in a line, the table (with the all-reduce time under tensor parallelism), the knee
    and the ceiling."""
    parallel = tensor_parallel_size > 1 or shard.expert_parallel > 1
    dtypes = (shard.weight_dtype or shard.dtype, shard.kv_cache_dtype or shard.dtype)
    experts = f", experts {shard.expert_dtype}" if shard.expert_dtype else ""
    layout = (f"; per GPU of {tensor_parallel_size} (tensor parallel)" if tensor_parallel_size > 1 else "")
    if shard.expert_parallel > 1:
        layout = (f"; per GPU of {tensor_parallel_size * data_parallel_size} (tensor parallel {tensor_parallel_size}"
                  + (f" x data-parallel attention {data_parallel_size}, batch per rank" if data_parallel_size > 1
                     else "") + f", experts over {shard.expert_parallel})")
    click.echo(f"{spec.name} on {hardware.name}, {table.context}-token contexts, decode steps"
               + (f"; weights {dtypes[0]}, KV {dtypes[1]}{experts}" if dtypes != (shard.dtype, shard.dtype) or experts
                  else "") + layout)
    cells = [[f"{r['batch']}{'*' if r['batch'] > table.max_batch else ''}", f"{r['step_time'] * 1e3:.2f}",
              *([f"{r['all_reduce_time'] * 1e3:.2f}"] if parallel else []),
              f"{r['weight_bytes'] / 1e9:.2f}", f"{r['kv_bytes'] / 1e9:.2f}", f"{r['achieved_bandwidth'] / 1e9:.0f}",
              f"{r['per_request_tokens_per_s']:.1f}", f"{r['aggregate_tokens_per_s']:.0f}"]
             for r in table.rows.iter_rows(named=True)]
    communication = "all-reduce ms" if data_parallel_size == 1 else "collectives ms"
    headers = ["batch", "step ms", *([communication] if parallel else []), "weights GB", "KV GB", "GB/s",
               "tok/s/req", "tok/s total"]
    click.echo(aligned(headers, cells))
    click.echo(f"knee (KV bytes = weight bytes): batch {table.knee_batch:.1f}")
    click.echo(f"ceiling (KV cache full at --gpu-memory-utilization {gpu_memory_utilization}): "
               f"{table.max_batch} sequences")


def draw_table(spec: ModelSpec, hardware: GpuSpec, table: BatchTable, out: Path | None, plot: str) -> None:
    """The table's page: at --plot's file, else beside --out, else in the results folder."""
    from simulator.report.figures import batch_table_figure
    from simulator.report.html import write_page

    default = out.with_suffix(".html") if out else RESULTS_DIR / f"batch-table-{table.context}.html"
    page = Path(plot) if plot else default
    title = f"{spec.name} on {hardware.name}: decode steps at {table.context}-token contexts"
    write_page(page, title, "", {"batch-table": batch_table_figure(table, title)})
    click.echo(f"wrote {page}")


@click.command("batch-table")
@click.option("--context", type=int, default=2300, show_default=True, help="Tokens each sequence attends to.")
@click.option("--batch", "batches", default="1,2,4,8,16,32,64,128", show_default=True,
              help="Batch sizes, one row each.")
@setting("model", help=f"Built-in model ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face config.json.")
@setting("gpu", help=f"Shipped GPU profile ({', '.join(available_gpus())}) or a profile folder.")
@setting("cost", type=click.Choice(COST_MODELS), help="Step times from the roofline or the measured kernels.")
@setting("gpu_memory_utilization", type=float, help="Share of GPU memory that sets the KV ceiling.")
@deployment_options
@parallel_options
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write the table as Parquet.")
@click.option("--plot", default=None, is_flag=False, flag_value="", metavar="[FILE.html]",
              help="Draw the table [default file: --out's name as .html, or results/batch-table-CONTEXT.html].")
def batch_table_command(context: int, batches: str, model: str, gpu: str, cost: str, gpu_memory_utilization: float,
                        tensor_parallel_size: int, quantization: str | None, kv_cache_dtype: str,
                        enable_expert_parallel: bool, data_parallel_size: int, disable_custom_all_reduce: bool,
                        out: Path | None, plot: str | None) -> None:
    """The chapter's table: decode step time and tokens/s against batch size."""
    from simulator.cost import build_cost_model
    from simulator.cost.batch_table import batch_table
    from simulator.deploy.hardware import load_gpu
    from simulator.deploy.model import load_model
    from simulator.outputs.run_folder import check_output_file, write_parquet
    from simulator.run.estimate import check_batch_table
    from simulator.run.sizing import gpu_shard, kv_cache_blocks

    sizes = parse_int_list(batches, "--batch")
    check_batch_table(context, sizes)
    for path, flag_name in ((out, "--out"), (Path(plot) if plot else None, "--plot")):
        if path is not None:
            check_output_file(path, flag_name)
    spec, hardware = load_model(model), load_gpu(gpu)
    # KV capacity as a default continuous-batching server of this memory share would have it.
    config = RunConfig(model=model, gpu=gpu, cost=cost, gpu_memory_utilization=gpu_memory_utilization,
                       tensor_parallel_size=tensor_parallel_size, quantization=quantization,
                       kv_cache_dtype=kv_cache_dtype, enable_expert_parallel=enable_expert_parallel,
                       data_parallel_size=data_parallel_size, num_replicas=data_parallel_size,
                       disable_custom_all_reduce=disable_custom_all_reduce)
    capacity = kv_cache_blocks(config, spec, hardware, context) * config.block_size
    shard = gpu_shard(config, spec)
    table = batch_table(shard, build_cost_model(config, spec, hardware), context, sizes, capacity, data_parallel_size)
    warn_past_limits(spec, table, sizes)
    print_table(spec, hardware, shard, table, tensor_parallel_size, gpu_memory_utilization, data_parallel_size)
    if out is not None:
        write_parquet(table.rows, out, {"model": spec.name, "gpu": hardware.name, "context": context,
                                        "knee_batch": table.knee_batch, "max_batch": table.max_batch})
        click.echo(f"wrote {out}")
    if plot is not None:
        draw_table(spec, hardware, table, out, plot)
