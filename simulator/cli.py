"""The `simulate` command line: one run by default, and the chapter's batch table.

Bad input ends with one line naming the bad value and exit status 2, never a traceback.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click_default_group import DefaultGroup

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.options import deployment_options

RESULTS_DIR = Path("results")


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise InputError(f"--percentiles takes numbers separated by commas, got {text!r}") from None


def parse_goodput(specs: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """`ttft:500 tpot:50` (milliseconds, as `vllm bench serve --goodput`) to seconds."""
    slos = []
    for spec in " ".join(specs).replace(",", " ").split():
        metric, _, value = spec.partition(":")
        try:
            slos.append((metric, float(value) / 1e3))
        except ValueError:
            raise InputError(f"--goodput takes METRIC:MILLISECONDS, got {spec!r}") from None
    return tuple(slos)


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{flag} takes integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} takes positive integers, got {text!r}")
    return values


def ms(seconds: float | None) -> str:
    return "-" if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)) else f"{seconds * 1e3:.2f}"


def format_summary(summary: dict[str, Any], config: RunConfig) -> str:
    lines = [
        f"{'policy':<40}{config.policy}",
        f"{'model / gpu':<40}{config.model} / {config.gpu}",
        f"{'completed / arrived requests':<40}{summary['completed']} / {summary['arrived']}",
        f"{'duration (s)':<40}{summary['duration']:.3f}",
        f"{'total input / output tokens':<40}{summary['total_input_tokens']} / {summary['total_output_tokens']}",
        f"{'request throughput (req/s)':<40}{summary['request_throughput']:.3f}",
        f"{'output token throughput (tok/s)':<40}{summary['output_throughput']:.1f}",
        f"{'total token throughput (tok/s)':<40}{summary['total_token_throughput']:.1f}",
        f"{'preemptions':<40}{summary['preemptions']}",
        f"{'GPU busy (share of the run)':<40}{summary['utilisation']:.1%}",
    ]
    if "request_goodput" in summary:
        lines.append(f"{'request goodput (req/s)':<40}{summary['request_goodput']:.3f}")
    stats = ["mean", "median", "std"] + [f"p{q:g}" for q in config.percentiles]
    lines.append("")
    lines.append(f"{'latency (ms)':<14}" + "".join(f"{s:>11}" for s in stats))
    for name, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"), ("queue", "queue")):
        lines.append(f"{label:<14}" + "".join(f"{ms(summary[f'{s}_{name}']):>11}" for s in stats))
    lines.append("")
    if summary["cost_extrapolations"]:
        lines.append(f"The {config.cost} cost model extrapolated beyond its measured range (operator, steps): "
                     f"{summary['cost_extrapolated']}.")
    if summary["unfinished"]:
        lines.append(f"{summary['unfinished']} requests were still in flight at --time-limit "
                     f"{config.time_limit} s and are reported unfinished.")
    if summary["kept_up"] is False:
        lines.append(
            f"OVERLOADED: the server did not keep up with {summary['offered_rate']:.2f} req/s (requests in the "
            f"system grew by {summary['queue_growth']:.2f}/s in the second half of the arrivals). Queues grow "
            "without bound at this rate, so TTFT and queue time measure the run's length, not the server.")
    elif summary["kept_up"] is None and summary["load"] == "open loop":
        lines.append("Too short to tell whether the server keeps up at this rate: the second half of the "
                     "arrivals lasted less than twice a typical request's latency. Send more requests.")
    elif summary["load"] == "all at once":
        lines.append("All requests arrived at once (--rate inf): a burst, not a steady load.")
    else:
        lines.append(f"The server kept up ({summary['load']}).")
    return "\n".join(lines)


@click.group(cls=DefaultGroup, default="run", default_if_no_args=True)
def main() -> None:
    """servesim: a discrete-event simulator of LLM inference serving."""


@main.command("run")
@click.option("--policy", default="continuous", show_default=True, help="static, continuous or chunked.")
@click.option("--model", default="llama-3.1-8b", show_default=True, help="Built-in name or a local config.json.")
@click.option("--gpu", default="h100_sxm", show_default=True, help="Shipped profile name or a profile path.")
@click.option("--cost", type=click.Choice(["measured", "roofline"]), default="roofline", show_default=True,
              help="Step times from the profile's measured kernels, or from the roofline alone.")
@click.option("--engine", type=click.Choice(["fast", "reference"]), default="fast", show_default=True,
              help="fast, or the one-event-per-step reference engine (identical results, ~30-100x slower).")
@deployment_options
@click.option("--rate", type=float, default=None, help="Open loop: requests/s (Poisson; inf = all at once).")
@click.option("--burstiness", type=float, default=1.0, show_default=True,
              help="Gamma shape of inter-arrival gaps (1 = Poisson), as vllm bench serve.")
@click.option("--concurrency", type=int, default=None, help="Closed loop: number of clients.")
@click.option("--num-requests", type=int, default=None, help="Requests to send [default: 1000].")
@click.option("--duration", type=float, default=None, help="Open loop: send arrivals for this many seconds.")
@click.option("--input-len", type=int, default=2000, show_default=True, help="Prompt tokens (mean).")
@click.option("--output-len", type=int, default=300, show_default=True, help="Output tokens (mean).")
@click.option("--input-len-dist", default="fixed", show_default=True,
              help="fixed, uniform[:RANGE_RATIO], lognormal[:SIGMA] or exponential.")
@click.option("--output-len-dist", default="fixed", show_default=True, help="As --input-len-dist.")
@click.option("--trace", type=str, default=None, help="Replay a trace file (CSV, JSONL or Parquet).")
@click.option("--trace-speed", type=float, default=1.0, show_default=True, help="Time scale of the replay.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-num-seqs", type=int, default=1024, show_default=True)
@click.option("--max-num-batched-tokens", type=int, default=8192, show_default=True,
              help="Token budget of one step (continuous, chunked).")
@click.option("--long-prefill-token-threshold", type=int, default=0, show_default=True)
@click.option("--max-batch-size", type=int, default=64, show_default=True, help="static: batch size.")
@click.option("--max-queue-delay", type=float, default=0.0, show_default=True,
              help="static: seconds to wait for a batch to fill.")
@click.option("--block-size", type=int, default=16, show_default=True, help="KV block size in tokens.")
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True)
@click.option("--num-gpu-blocks-override", type=int, default=None, help="Exactly this many KV blocks.")
@click.option("--time-limit", type=float, default=None, help="Stop the simulated clock at this time (s).")
@click.option("--percentiles", default="50,90,99", show_default=True)
@click.option("--goodput", multiple=True, help="SLOs in ms, e.g. 'ttft:500 tpot:50'.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run folder [default: a new folder under results/].")
@click.option("--tokens/--no-tokens", default=True, show_default=True,
              help="Write tokens.parquet, one row per output token (large: 300M rows for 1M requests).")
def run_command(percentiles: str, goodput: tuple[str, ...], out: Path | None, tokens: bool, **settings: Any) -> None:
    """Simulate one configuration and print its summary."""
    from simulator.metrics import build_tables, summarize
    from simulator.outputs import check_out_dir, default_run_dir, write_run
    from simulator.simulate import simulate

    config = RunConfig(percentiles=parse_percentiles(percentiles), goodput=parse_goodput(goodput), **settings)
    if out is not None:
        check_out_dir(out)
    result = simulate(config)
    tables = build_tables(result, tokens=tokens)
    summary = summarize(result, tables)
    label = f"{config.policy}-rate{config.rate:g}" if config.rate is not None else config.policy
    out = out or default_run_dir(RESULTS_DIR, label)
    settings_dict = config.to_dict() | {"kv_blocks": result.kv_blocks}
    written = {"requests": tables.requests, "steps": tables.steps} | ({"tokens": tables.tokens} if tokens else {})
    write_run(out, written, summary, settings_dict)
    click.echo(format_summary(summary, config))
    click.echo(f"wrote {out}/ ({', '.join(sorted(written))} .parquet; summary.json)")


@main.command("batch-table")
@click.option("--context", type=int, default=2300, show_default=True, help="Tokens each sequence attends to.")
@click.option("--batch", "batches", default="1,2,4,8,16,32,64,128", show_default=True)
@click.option("--model", default="llama-3.1-8b", show_default=True)
@click.option("--gpu", default="h100_sxm", show_default=True)
@click.option("--cost", type=click.Choice(["measured", "roofline"]), default="roofline", show_default=True)
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True)
@deployment_options
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write the table as Parquet.")
@click.option("--plot", default=None, is_flag=False, flag_value="", metavar="[FILE.html]",
              help="Draw the table [default file: --out's name as .html, or results/batch-table-CONTEXT.html].")
def batch_table_command(context: int, batches: str, model: str, gpu: str, cost: str, gpu_memory_utilization: float,
                        tensor_parallel_size: int, quantization: str | None, kv_cache_dtype: str, out: Path | None,
                        plot: str | None) -> None:
    """The chapter's table: decode step time and tokens/s against batch size."""
    from simulator.batch_table import batch_table
    from simulator.cost import build_cost_model
    from simulator.hardware import load_gpu
    from simulator.model import load_model
    from simulator.outputs import write_parquet
    from simulator.simulate import gpu_shard, kv_cache_blocks

    if context < 1:
        raise InputError(f"--context must be a positive number of tokens, got {context}")
    sizes = parse_int_list(batches, "--batch")
    spec, hardware = load_model(model), load_gpu(gpu)
    # KV capacity as a default continuous-batching server of this memory share would have it.
    config = RunConfig(model=model, gpu=gpu, cost=cost, gpu_memory_utilization=gpu_memory_utilization,
                       tensor_parallel_size=tensor_parallel_size, quantization=quantization,
                       kv_cache_dtype=kv_cache_dtype)
    capacity = kv_cache_blocks(config, spec, hardware, context) * config.block_size
    shard = gpu_shard(config, spec)
    table = batch_table(shard, build_cost_model(config, spec, hardware), context, sizes, capacity)
    rows = table.rows
    parallel = tensor_parallel_size > 1
    dtypes = (shard.weight_dtype or shard.dtype, shard.kv_cache_dtype or shard.dtype)
    click.echo(f"{spec.name} on {hardware.name}, {context}-token contexts, decode steps"
               + (f"; weights {dtypes[0]}, KV {dtypes[1]}" if dtypes != (shard.dtype, shard.dtype) else "")
               + (f"; per GPU of {tensor_parallel_size} (tensor parallel)" if parallel else ""))
    click.echo(f"{'batch':>6}{'step ms':>10}" + (f"{'all-reduce ms':>15}" if parallel else "")
               + f"{'weights GB':>12}{'KV GB':>9}{'GB/s':>8}{'tok/s/req':>11}{'tok/s total':>13}")
    for r in rows.iter_rows(named=True):
        click.echo(f"{r['batch']:>6}{r['step_time'] * 1e3:>10.2f}"
                   + (f"{r['all_reduce_time'] * 1e3:>15.2f}" if parallel else "")
                   + f"{r['weight_bytes'] / 1e9:>12.2f}"
                   f"{r['kv_bytes'] / 1e9:>9.2f}{r['achieved_bandwidth'] / 1e9:>8.0f}"
                   f"{r['per_request_tokens_per_s']:>11.1f}{r['aggregate_tokens_per_s']:>13.0f}")
    click.echo(f"knee (KV bytes = weight bytes): batch {table.knee_batch:.1f}")
    click.echo(f"ceiling (KV cache full at --gpu-memory-utilization {gpu_memory_utilization}): "
               f"{table.max_batch} sequences")
    if out is not None:
        write_parquet(rows, out, {"model": spec.name, "gpu": hardware.name, "context": context,
                                  "knee_batch": table.knee_batch, "max_batch": table.max_batch})
        click.echo(f"wrote {out}")
    if plot is not None:
        from simulator.figures import batch_table_figure, write_page

        page = Path(plot) if plot else out.with_suffix(".html") if out else RESULTS_DIR / f"batch-table-{context}.html"
        title = f"{spec.name} on {hardware.name}: decode steps at {context}-token contexts"
        write_page(page, title, "", {"batch-table": batch_table_figure(table, title)})
        click.echo(f"wrote {page}")


# Further verbs live in their own modules and are registered here, one import and one line each.
from calibration.measure import calibrate_command  # noqa: E402
from calibration.validate import validate_command  # noqa: E402
from simulator.report import report_command  # noqa: E402
from simulator.sweep import sweep_command  # noqa: E402

main.add_command(sweep_command)
main.add_command(calibrate_command)
main.add_command(validate_command)
main.add_command(report_command)


def join_goodput_values(argv: list[str]) -> list[str]:
    """Let `--goodput ttft:500 tpot:50` take several words, as `vllm bench serve` does."""
    joined: list[str] = []
    i = 0
    while i < len(argv):
        joined.append(argv[i])
        i += 1
        if joined[-1] == "--goodput":
            end = i
            while end < len(argv) and not argv[end].startswith("-"):
                end += 1
            if end > i:
                joined.append(" ".join(argv[i:end]))
                i = end
    return joined


def run(argv: list[str] | None = None, exit: Callable[[int], Any] = sys.exit) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit."""
    args = join_goodput_values(sys.argv[1:] if argv is None else argv)
    try:
        main.main(args=args, prog_name="simulate", standalone_mode=False)
    except InputError as exc:
        click.echo(f"error: {exc}", err=True)
        exit(2)
    except click.exceptions.Exit as exc:
        exit(exc.exit_code)
    except click.Abort:
        click.echo("aborted", err=True)
        exit(1)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()}", err=True)
        exit(exc.exit_code)
    else:
        exit(0)
