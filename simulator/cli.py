"""The `simulate` command line: one run by default, and the chapter's batch table.

Bad input ends with one line naming the bad value and exit status 2, never a traceback.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from click_default_group import DefaultGroup

from policies import POLICIES
from simulator.config import DEFAULTS, GOODPUT_METRICS, RunConfig, flag, parse_goodput, parse_percentiles
from simulator.cost import COST_MODELS
from simulator.errors import InputError
from simulator.hardware import available_gpus
from simulator.metrics import LATENCIES
from simulator.model import BUILTIN_MODELS
from simulator.options import deployment_options
from simulator.simulate import DEFAULT_NUM_REQUESTS
from simulator.vllm_result import result_path, vllm_result, write_result
from workloads.lengths import SPECS as LENGTH_SPECS

RESULTS_DIR = Path("results")


def parse_int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{option} takes integers separated by commas, got {text!r}") from None
    if not values or min(values) < 1:
        raise InputError(f"{option} takes positive integers, got {text!r}")
    return values


def ms(seconds: float | None) -> str:
    return "-" if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)) else f"{seconds * 1e3:.2f}"


def per_s(value: float, digits: int) -> str:
    """A throughput; "-" when no request finished (no duration to divide by)."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def format_summary(summary: dict[str, Any], config: RunConfig, metrics: tuple[str, ...] = LATENCIES) -> str:
    lines = [
        f"{'policy':<40}{config.policy}",
        f"{'model / gpu':<40}{config.model} / {config.gpu}",
        f"{'completed / arrived requests':<40}{summary['completed']} / {summary['arrived']}",
        f"{'duration (s)':<40}{summary['duration']:.3f}",
        f"{'total input / output tokens':<40}{summary['total_input_tokens']} / {summary['total_output_tokens']}",
        f"{'request throughput (req/s)':<40}{per_s(summary['request_throughput'], 3)}",
        f"{'output token throughput (tok/s)':<40}{per_s(summary['output_throughput'], 1)}",
        f"{'total token throughput (tok/s)':<40}{per_s(summary['total_token_throughput'], 1)}",
        f"{'preemptions':<40}{summary['preemptions']}",
        f"{'GPU busy (share of the run)':<40}{summary['utilisation']:.1%}",
    ]
    if "request_goodput" in summary:
        lines.append(f"{'request goodput (req/s)':<40}{per_s(summary['request_goodput'], 3)}")
    stats = ["mean", "median", "std"] + [f"p{q:g}" for q in config.percentiles]
    lines.append("")
    lines.append(f"{'latency (ms)':<14}" + "".join(f"{s:>11}" for s in stats))
    for name in metrics:
        label = name if name == "queue" else name.upper()
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
    elif summary["load"] in ("empty", "none finished"):
        cut = f" (the clock stopped at --time-limit {config.time_limit} s)" if summary["unfinished"] else ""
        lines.append(f"No request finished{cut}, so there is nothing to tell whether the server keeps up.")
    elif summary["kept_up"] is None and summary["load"] == "open loop":
        lines.append("Too short to tell whether the server keeps up at this rate: the second half of the "
                     "arrivals lasted less than twice a typical request's latency. Send more requests.")
    elif summary["load"] == "all at once":
        lines.append("All requests arrived at once (--rate inf): a burst, not a steady load.")
    elif summary["kept_up"]:
        lines.append(f"The server kept up ({summary['load']}).")
    return "\n".join(lines)


def aligned(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns as wide as their widest cell, two spaces apart: wide values never touch."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    return "\n".join("".join(f"{cell:>{width + 2}}" for cell, width in zip(line, widths, strict=True))
                     for line in [headers, *rows])


@click.group(cls=DefaultGroup, default="run", default_if_no_args=True)
def main() -> None:
    """servesim: a discrete-event simulator of LLM inference serving.

    `run` (starred below) is the default command: `simulate --rate 12` is `simulate run --rate 12`,
    and `simulate` alone runs the default configuration. `simulate COMMAND --help` lists a
    command's options with their defaults.
    """


def setting(name: str, *aliases: str, help: str, **kwargs: Any) -> Callable[[Callable[..., Any]], Any]:
    """The option of RunConfig field `name` (any vLLM names as aliases), its default taken from RunConfig."""
    default = DEFAULTS[name]
    kwargs.setdefault("show_default", default is not None)
    return click.option(flag(name), *aliases, name, default=default, help=help, **kwargs)


@main.command("run")
@setting("policy", type=click.Choice(list(POLICIES)), help="Scheduling policy.")
@setting("model", help=f"Built-in model ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face config.json.")
@setting("gpu", help=f"Shipped GPU profile ({', '.join(available_gpus())}) or a profile folder.")
@setting("cost", type=click.Choice(COST_MODELS),
         help="Step times from the roofline over the profile's fitted rates, or from its measured kernels.")
@deployment_options
@setting("rate", "--request-rate", type=float,
         help="Open loop: requests/s, gamma-distributed gaps (see --burstiness) [default: inf: all at once].")
@setting("burstiness", type=float, help="Gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 smoother.")
@setting("concurrency", "--max-concurrency", type=int,
         help="Closed loop: this many clients, each sending its next request when the last finishes "
              "[default: none, an open loop].")
@setting("num_requests", "--num-prompts", type=int,
         help=f"Requests to send [default: {DEFAULT_NUM_REQUESTS}, or all that arrive within --duration].")
@setting("duration", type=float,
         help="Open loop: send requests for this many seconds (with --rate) [default: none, --num-requests].")
@setting("input_len", "--random-input-len", type=int, help="Prompt tokens (the mean, with --input-len-dist).")
@setting("output_len", "--random-output-len", type=int, help="Output tokens (the mean, with --output-len-dist).")
@setting("input_len_dist", help=f"Prompt lengths: {LENGTH_SPECS} (uniform's range ratio, lognormal's sigma).")
@setting("output_len_dist", help="Output lengths, as --input-len-dist.")
@click.option("--random-range-ratio", type=float, default=None,
              help="As vllm bench serve: prompt and output lengths uniform in [len*(1-R), len*(1+R)] "
                   "(--input-len-dist and --output-len-dist uniform:R) [default: none].")
@setting("trace", help="Replay a trace (CSV, JSONL or Parquet; Azure and Mooncake as published) [default: none, a "
              "synthetic workload].")
@setting("trace_speed", type=float, help="Replay speed of --trace: 2 replays it twice as fast.")
@setting("seed", type=int, help="Seed of arrivals and lengths; a seed always gives the same run.")
@setting("priority_levels", type=int, help="priority: requests get priorities uniform over 0..N-1, lower first "
                                           "(a trace's own `priority` column otherwise) [default: all 0].")
@setting("max_num_seqs", type=int, help="Most sequences in one step (continuous, chunked) or KV logits (static).")
@setting("max_num_batched_tokens", type=int, help="Token budget of one step (continuous, chunked).")
@setting("long_prefill_token_threshold", type=int, help="chunked: most prompt tokens one step gives a request "
                                                        "(0: no limit beyond the budget).")
@setting("max_batch_size", type=int, help="static: requests in one batch.")
@setting("max_queue_delay", type=float, help="static: seconds to wait for a batch to fill.")
@click.option("--enable-chunked-prefill", is_flag=True, help="As vllm serve: the chunked policy (--policy chunked).")
@setting("max_model_len", type=int, help="As vllm serve: refuse a request longer than this many tokens "
                                         "(prompt + output) [default: the model's context length].")
@setting("block_size", type=int, help="KV block size in tokens.")
@setting("gpu_memory_utilization", type=float, help="Share of GPU memory for weights, activations and KV cache.")
@setting("num_gpu_blocks_override", type=int, help="Exactly this many KV blocks [default: sized from memory].")
@setting("time_limit", type=float, help="Stop the simulated clock at this many seconds; requests still in flight "
                                        "are reported unfinished [default: run to the end].")
@click.option("--percentiles", "--metric-percentiles", "percentiles", show_default=True,
              default=",".join(f"{q:g}" for q in DEFAULTS["percentiles"]), help="Latency percentiles to report.")
@click.option("--percentile-metrics", default=",".join(LATENCIES), show_default=True,
              help="Latencies to print (and to save with --save-result).")
@click.option("--goodput", multiple=True, help="SLOs in ms as vllm bench serve, e.g. 'ttft:500 tpot:50'; "
                                               f"metrics {', '.join(GOODPUT_METRICS)} [default: none].")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run folder [default: a new folder under results/].")
@click.option("--tokens/--no-tokens", default=True, show_default=True,
              help="Write tokens.parquet, one row per output token (large: 300M rows for 1M requests).")
@click.option("--save-result", is_flag=True, help="Also write vllm bench serve's result JSON.")
@click.option("--save-detailed", is_flag=True, help="With --save-result: per-request lengths, TTFTs and ITLs too.")
@click.option("--result-dir", type=click.Path(path_type=Path), default=None,
              help="Folder of the --save-result JSON [default: the current folder].")
@click.option("--result-filename", default=None,
              help="Name of the --save-result JSON [default: servesim-RATEqps-MODEL-DATE.json, as vLLM].")
@click.option("--quiet", is_flag=True, help="No progress bar on stderr (there is none unless stderr is a terminal).")
def run_command(percentiles: str, percentile_metrics: str, goodput: tuple[str, ...], out: Path | None, tokens: bool,
                random_range_ratio: float | None, enable_chunked_prefill: bool, save_result: bool,
                save_detailed: bool, result_dir: Path | None, result_filename: str | None, quiet: bool,
                **settings: Any) -> None:
    """Simulate one configuration and print its summary."""
    from simulator.metrics import build_tables, summarize
    from simulator.outputs import check_out_dir, default_run_dir, write_run
    from simulator.progress import progress_enabled, working
    from simulator.simulate import simulate
    from simulator.tokens import TokensTable

    given = typed_options()
    settings |= vllm_settings(given, settings["policy"], random_range_ratio, enable_chunked_prefill)
    config = RunConfig(percentiles=parse_percentiles(percentiles), goodput=parse_goodput(goodput), **settings)
    unused = config.unused_settings()
    if unused:
        raise InputError(f"--policy {config.policy} does not use {', '.join(flag(name) for name in unused)}")
    metrics = parse_percentile_metrics(percentile_metrics)
    saved = given & {"save_detailed", "result_dir", "result_filename"}
    if saved and not save_result:
        raise InputError(f"{', '.join(flag(name) for name in sorted(saved))} applies only with --save-result")
    now = dt.datetime.now()
    result_file = result_path(config, result_dir, result_filename, now) if save_result else None
    if out is not None:
        check_out_dir(out)
    progress = progress_enabled(quiet)
    result = simulate(config, progress=progress)
    with working("building tables", enabled=progress):
        tables = build_tables(result, tokens=save_result)  # a run folder's tokens table is streamed below
    summary = summarize(result, tables)
    label = f"{config.policy}-rate{config.rate:g}" if config.rate is not None else config.policy
    out = out or default_run_dir(RESULTS_DIR, label)
    settings_dict = config.to_dict() | {"kv_blocks": result.kv_blocks}
    written: dict[str, Any] = {"requests": tables.requests, "steps": tables.steps}
    if tokens:
        written["tokens"] = TokensTable(result.log)
    write_run(out, written, summary, settings_dict, progress=progress)
    click.echo(format_summary(summary, config, metrics))
    click.echo(f"wrote {out}/ ({', '.join(sorted(written))} .parquet; summary.json)")
    if result_file is not None:
        write_result(result_file, vllm_result(summary, config, tables, metrics, save_detailed, now))
        click.echo(f"wrote {result_file}")


def typed_options() -> set[str]:
    """The run's parameters the user gave on the command line."""
    context = click.get_current_context()
    return {name for name in context.params if context.get_parameter_source(name) is ParameterSource.COMMANDLINE}


def vllm_settings(given: set[str], policy: str, random_range_ratio: float | None,
                  enable_chunked_prefill: bool) -> dict[str, Any]:
    """RunConfig settings that vLLM's flags without a servesim twin stand for."""
    settings: dict[str, Any] = {}
    if enable_chunked_prefill:
        if "policy" in given and policy != "chunked":
            raise InputError(f"--enable-chunked-prefill is the chunked policy; it contradicts --policy {policy}")
        settings["policy"] = "chunked"
    if random_range_ratio is not None:
        both = sorted(given & {"input_len_dist", "output_len_dist"})
        if both:
            raise InputError(f"--random-range-ratio sets both length distributions; drop {flag(both[0])}")
        if not 0 <= random_range_ratio < 1:
            raise InputError(f"--random-range-ratio must be in [0, 1), got {random_range_ratio}")
        settings["input_len_dist"] = settings["output_len_dist"] = f"uniform:{random_range_ratio:g}"
    return settings


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LATENCIES]
    if unknown or not names or len(set(names)) < len(names):
        raise InputError(f"--percentile-metrics takes distinct names from {', '.join(LATENCIES)}, got {text!r}")
    return names


@main.command("batch-table")
@click.option("--context", type=int, default=2300, show_default=True, help="Tokens each sequence attends to.")
@click.option("--batch", "batches", default="1,2,4,8,16,32,64,128", show_default=True,
              help="Batch sizes, one row each.")
@setting("model", help=f"Built-in model ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face config.json.")
@setting("gpu", help=f"Shipped GPU profile ({', '.join(available_gpus())}) or a profile folder.")
@setting("cost", type=click.Choice(COST_MODELS), help="Step times from the roofline or the measured kernels.")
@setting("gpu_memory_utilization", type=float, help="Share of GPU memory that sets the KV ceiling.")
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
    from simulator.outputs import check_writable, write_parquet
    from simulator.simulate import gpu_shard, kv_cache_blocks

    if context < 1:
        raise InputError(f"--context must be a positive number of tokens, got {context}")
    sizes = parse_int_list(batches, "--batch")
    for path, flag_name in ((out, "--out"), (Path(plot) if plot else None, "--plot")):
        if path is not None:
            check_writable(path, flag_name)
    spec, hardware = load_model(model), load_gpu(gpu)
    # KV capacity as a default continuous-batching server of this memory share would have it.
    config = RunConfig(model=model, gpu=gpu, cost=cost, gpu_memory_utilization=gpu_memory_utilization,
                       tensor_parallel_size=tensor_parallel_size, quantization=quantization,
                       kv_cache_dtype=kv_cache_dtype)
    capacity = kv_cache_blocks(config, spec, hardware, context) * config.block_size
    shard = gpu_shard(config, spec)
    table = batch_table(shard, build_cost_model(config, spec, hardware), context, sizes, capacity)
    rows = table.rows
    if context > spec.max_model_len:
        click.echo(f"warning: --context {context} is past {spec.name}'s {spec.max_model_len}-token context: "
                   "no request could attend to that many tokens", err=True)
    too_big = [b for b in sizes if b > table.max_batch]
    if too_big:
        click.echo(f"warning: --batch {','.join(map(str, too_big))} is past the KV ceiling of {table.max_batch} "
                   f"sequences of {context} tokens: those rows (marked *) could not run on this GPU", err=True)
    parallel = tensor_parallel_size > 1
    dtypes = (shard.weight_dtype or shard.dtype, shard.kv_cache_dtype or shard.dtype)
    click.echo(f"{spec.name} on {hardware.name}, {context}-token contexts, decode steps"
               + (f"; weights {dtypes[0]}, KV {dtypes[1]}" if dtypes != (shard.dtype, shard.dtype) else "")
               + (f"; per GPU of {tensor_parallel_size} (tensor parallel)" if parallel else ""))
    cells = [[f"{r['batch']}{'*' if r['batch'] > table.max_batch else ''}", f"{r['step_time'] * 1e3:.2f}",
              *([f"{r['all_reduce_time'] * 1e3:.2f}"] if parallel else []),
              f"{r['weight_bytes'] / 1e9:.2f}", f"{r['kv_bytes'] / 1e9:.2f}", f"{r['achieved_bandwidth'] / 1e9:.0f}",
              f"{r['per_request_tokens_per_s']:.1f}", f"{r['aggregate_tokens_per_s']:.0f}"]
             for r in rows.iter_rows(named=True)]
    headers = ["batch", "step ms", *(["all-reduce ms"] if parallel else []), "weights GB", "KV GB", "GB/s",
               "tok/s/req", "tok/s total"]
    click.echo(aligned(headers, cells))
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


def as_typed(message: str, args: list[str]) -> str:
    """Name each flag in `message` as the user typed it: --num-prompts where they wrote that, not --num-requests."""
    for command in (run_command, batch_table_command):
        for option in command.params:
            canonical, *aliases = option.opts
            for alias in aliases:
                if any(arg == alias or arg.startswith(f"{alias}=") for arg in args):
                    message = re.sub(rf"{re.escape(canonical)}(?![\w-])", alias, message)
    return message


def run(argv: list[str] | None = None, exit: Callable[[int], Any] = sys.exit) -> None:
    """Entry point: user errors become one line on stderr and a non-zero exit."""
    args = join_goodput_values(sys.argv[1:] if argv is None else argv)
    try:
        main.main(args=args, prog_name="simulate", standalone_mode=False)
    except InputError as exc:
        click.echo(f"error: {as_typed(str(exc), args)}", err=True)
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
