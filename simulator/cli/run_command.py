"""`simulate run`: one configuration simulated, its summary printed and its tables written.

Imported only when the verb runs or shows its help (simulator.cli.main loads verbs lazily).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from policies import ENABLE_CHUNKED_PREFILL, POLICIES, readers
from simulator.cli.options import (
    RESULTS_DIR,
    Choice,
    deployment_options,
    parallel_options,
    setting,
    speculative_options,
)
from simulator.config import DEFAULTS, GOODPUT_METRICS, RunConfig, flag, quote
from simulator.cost import COST_MODELS
from simulator.deploy.backends import BACKENDS, stack_settings
from simulator.deploy.hardware import available_gpus
from simulator.deploy.model import BUILTIN_MODELS
from simulator.errors import InputError
from simulator.fleet.routers import ROUTERS
from simulator.metrics.fleet import format_servers
from simulator.metrics.summary import LATENCIES, load_verdict
from simulator.outputs.vllm_result import result_path, vllm_result, write_result
from simulator.ranges import parse_goodput, parse_percentiles
from simulator.run.estimate import check_run_size
from simulator.run.simulate import DEFAULT_NUM_REQUESTS
from workloads.lengths import SPECS as LENGTH_SPECS


def ms(seconds: float | None) -> str:
    return "-" if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)) else f"{seconds * 1e3:.2f}"


def per_s(value: float, digits: int) -> str:
    """A throughput; "-" when no request finished (no duration to divide by)."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def pool_gpus(config: RunConfig) -> str:
    """The pools on another GPU type than --gpu, as ` (prefill X, decode Y)`."""
    other = [f"{role} {gpu}" for role, gpu in (("prefill", config.prefill_gpu), ("decode", config.decode_gpu))
             if gpu is not None and gpu != config.gpu]
    return f" ({', '.join(other)})" if other else ""


def format_summary(summary: dict[str, Any], config: RunConfig, metrics: tuple[str, ...] = LATENCIES) -> str:
    lines = [
        f"{'policy':<40}{config.policy}",
        f"{'model / gpu':<40}{config.model} / {config.gpu}{pool_gpus(config)}",
        f"{'completed / arrived requests':<40}{summary['completed']} / {summary['arrived']}",
        f"{'duration (s)':<40}{summary['duration']:.3f}",
        f"{'total input / output tokens':<40}{summary['total_input_tokens']} / {summary['total_output_tokens']}",
        f"{'request throughput (req/s)':<40}{per_s(summary['request_throughput'], 3)}",
        f"{'output token throughput (tok/s)':<40}{per_s(summary['output_throughput'], 1)}",
        f"{'total token throughput (tok/s)':<40}{per_s(summary['total_token_throughput'], 1)}",
        f"{'preemptions':<40}{summary['preemptions']}",
        *([f"{'prefix cache hit rate':<40}{summary['prefix_cache_hit_rate']:.2%}"]
          if summary["prefix_cache_queried_tokens"] else []),
        *([f"{'  of it on GPU / host (KV offload)':<40}{summary['prefix_cache_hit_rate_gpu']:.2%} / "
           f"{summary['prefix_cache_hit_rate_host']:.2%}"]
          if summary["prefix_cache_queried_tokens"] and "kv_offload_blocks" in summary else []),
        f"{'GPU busy (share of the run)':<40}{summary['utilisation']:.1%}",
    ]
    if "request_goodput" in summary:
        lines.append(f"{'request goodput (req/s)':<40}{per_s(summary['request_goodput'], 3)}")
    if "spec_num_drafts" in summary:
        lines += speculation_lines(summary, config)
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
    if summary["load"] in ("empty", "none finished"):
        cut = f" (the clock stopped at --time-limit {config.time_limit} s)" if summary["unfinished"] else ""
        lines.append(f"No request finished{cut}, so there is nothing to tell whether the server keeps up.")
    else:
        rates = [f"{summary[key]:.2f}" if summary[key] is not None else "-" for key in ("offered_rate", "queue_growth")]
        said = load_verdict(summary["kept_up"], summary["load"], *rates)
        if said is not None:
            lines.append(said[1])
    return "\n".join(lines)


def speculation_lines(summary: dict[str, Any], config: RunConfig) -> list[str]:
    """Speculative decoding's metrics as vLLM logs them."""
    label = f"speculative decoding ({config.speculative_method}, k={config.num_speculative_tokens})"
    if not summary["spec_num_drafts"]:
        return [f"{label:<40}no drafts"]
    positions = ", ".join(f"{rate:.3f}" for rate in summary["spec_acceptance_per_position"])
    return [f"{label:<40}{summary['spec_num_drafts']} drafts, {summary['spec_num_draft_tokens']} draft tokens, "
            f"{summary['spec_num_accepted_tokens']} accepted",
            f"{'draft acceptance rate':<40}{summary['spec_acceptance_rate']:.1%}",
            f"{'mean acceptance length':<40}{summary['spec_mean_acceptance_length']:.3f}",
            f"{'per-position acceptance rate':<40}{positions}"]


def read_by(setting: str) -> str:
    """The policies that read `setting`, as its help starts."""
    return ", ".join(readers(setting))


@click.command("run")
@setting("policy", type=Choice(list(POLICIES)), help="Scheduling policy.")
@setting("model", help=f"Built-in model ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face config.json.")
@setting("gpu", help=f"Shipped GPU profile ({', '.join(available_gpus())}) or a profile folder.")
@setting("cost", type=Choice(COST_MODELS),
         help="Step times from the roofline over the profile's fitted rates, or from its measured kernels.")
@setting("backend", type=Choice(list(BACKENDS)),
         help="Serving stack: given, it picks the stack's profile (<gpu>_<backend>) and its stock scheduler "
              "(policy, token budget, max sequences, prefix cache) where those flags are not given.")
@deployment_options
@parallel_options
@setting("rate", "--request-rate",
         help="Open loop: requests/s, gamma-distributed gaps (see --burstiness) [default: inf: all at once].")
@setting("burstiness", help="Gamma shape of the gaps: 1 = Poisson, < 1 burstier, > 1 smoother.")
@setting("concurrency", "--max-concurrency",
         help="Closed loop: this many clients, each sending its next request when the last finishes; "
              "with a finite --rate, at most this many requests in flight, as vllm bench serve caps an open "
              "loop [default: none, an open loop].")
@setting("num_requests", "--num-prompts",
         help=f"Requests to send [default: {DEFAULT_NUM_REQUESTS}, or all that arrive within --duration].")
@setting("duration",
         help="Open loop: send requests for this many seconds (with --rate) [default: none, --num-requests].")
@setting("input_len", "--random-input-len", help="Prompt tokens (the mean, with --input-len-dist).")
@setting("output_len", "--random-output-len", help="Output tokens (the mean, with --output-len-dist).")
@setting("input_len_dist", help=f"Prompt lengths: {LENGTH_SPECS} (uniform's range ratio, lognormal's sigma).")
@setting("output_len_dist", help="Output lengths, as --input-len-dist.")
@setting("num_dataset_entries", help="aiperf's prompt pool: every request is one of this many whole prompts, "
                                     "drawn with replacement by --seed, so repeats hit the prefix cache "
                                     "[default: none, every prompt its own].")
@click.option("--random-range-ratio", type=float, default=None,
              help="As vllm bench serve: prompt and output lengths uniform in [len*(1-R), len*(1+R)] "
                   "(--input-len-dist and --output-len-dist uniform:R) [default: none].")
@setting("trace", help="Replay a trace (CSV, JSONL or Parquet; Azure and Mooncake as published) [default: none, a "
                       "synthetic workload].")
@setting("trace_speed", help="Replay speed of --trace: 2 replays it twice as fast.")
@setting("prefix_len", help="Each prompt starts with one of --num-prefixes shared prefixes of this many "
                            "tokens, then its --input-len own tokens (0: none).")
@setting("num_prefixes", help="How many shared prefixes --prefix-len draws from, uniformly by seed.")
@setting("num_turns", help="Multi-turn sessions of this many requests: each turn's prompt is the "
                           "conversation so far and a new --input-len question (--rate then counts sessions).")
@setting("think_time", help="Seconds between a turn's answer and the session's next turn.")
@setting("seed", help="Seed of arrivals and lengths; a seed always gives the same run.")
@setting("priority_levels", help=f"{read_by('priority_levels')}: requests get priorities uniform over "
                                 "0..N-1, lower first (a trace's own `priority` column otherwise) "
                                 "[default: all 0].")
@setting("max_num_seqs", help="Most sequences in one step (and the logits the activation memory holds).")
@setting("max_num_batched_tokens", help=f"{read_by('max_num_batched_tokens')}: token budget of one step.")
@setting("long_prefill_token_threshold", help=f"{read_by('long_prefill_token_threshold')}: most prompt "
                                              "tokens one step gives a request (0: no limit beyond the "
                                              "budget).")
@setting("max_batch_size", help=f"{read_by('max_batch_size')}: requests in one batch.")
@setting("max_queue_delay", help=f"{read_by('max_queue_delay')}: seconds to wait for a batch to fill.")
@click.option("--enable-chunked-prefill", is_flag=True,
              help=f"As vllm serve: the {ENABLE_CHUNKED_PREFILL} policy (--policy {ENABLE_CHUNKED_PREFILL}).")
@setting("max_model_len", help="As vllm serve: refuse a request longer than this many tokens "
                               "(prompt + output) [default: the model's context length].")
@setting("block_size", help="KV block size in tokens.")
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", "enable_prefix_caching",
              default=DEFAULTS["enable_prefix_caching"], show_default=True,
              help="As vllm serve: automatic prefix caching of full KV blocks (acts on workloads with prefix "
                   "identity: --prefix-len, Mooncake hash_ids).")
@click.option("--async-scheduling/--no-async-scheduling", "async_scheduling",
              default=DEFAULTS["async_scheduling"], show_default=True,
              help="As vllm serve (and SGLang's and TensorRT-LLM's overlap scheduler): plan each step while the "
                   "one before it runs, so a request that arrives after a step started joins the step after "
                   "the next [default with --backend: the stack's, on].")
@click.option("--output-lag/--no-output-lag", "output_lag", default=DEFAULTS["output_lag"], show_default=True,
              help="With --async-scheduling, as TensorRT-LLM's overlap loop: a step's tokens reach the client when "
                   "the next step ends if that one computes prompt tokens [default with --backend: the stack's, on "
                   "for trtllm].")
@setting("gpu_memory_utilization", help="Share of GPU memory for weights, activations and KV cache.")
@setting("num_gpu_blocks_override", help="Exactly this many KV blocks [default: sized from memory].")
@setting("kv_offload_gb", help="KV offload: GB of host memory per server holding the KV blocks the prefix "
                               "cache evicts, loaded back over the host link on a hit (vLLM's CPU offloading "
                               "connector) [default: 0, none].")
@setting("kv_offload_bandwidth", help="KV offload: GB/s per GPU of the host link that hits load over "
                                      "[default: the GPU profile's PCIe, 64 on the H100].")
@setting("num_replicas", help="Identical servers, each its own GPUs, KV cache and scheduler, behind "
                              "--router.")
@setting("router", type=Choice(ROUTERS), help="Which server takes each arrival, from the servers' state "
                                                    "then: in turn, at random, fewest requests, least KV in use, "
                                                    "longest cached prefix.")
@setting("prefill_replicas", help="Disaggregated serving: servers that only prefill (and emit the first "
                                  "token), with --decode-replicas [default: none, colocated].")
@setting("decode_replicas", help="Disaggregated serving: servers that decode what the prefill pool sent "
                                 "[default: none].")
@setting("prefill_tensor_parallel_size", help="GPUs of each prefill server "
                                              "[default: --tensor-parallel-size].")
@setting("decode_tensor_parallel_size", help="GPUs of each decode server [default: --tensor-parallel-size].")
@setting("prefill_data_parallel_size", help="Data-parallel attention ranks of each prefill worker, each rank a "
                                            "server of the pool, their experts one group (as "
                                            "--data-parallel-size) [default: --data-parallel-size].")
@setting("decode_data_parallel_size", help="Data-parallel attention ranks of each decode worker "
                                           "[default: --data-parallel-size].")
@click.option("--prefill-enable-expert-parallel/--prefill-no-expert-parallel", "prefill_enable_expert_parallel",
              default=None, help="Each prefill worker's experts spread whole over its GPUs, or split "
                                 "[default: --enable-expert-parallel].")
@click.option("--decode-enable-expert-parallel/--decode-no-expert-parallel", "decode_enable_expert_parallel",
              default=None, help="Each decode worker's experts spread whole over its GPUs, or split "
                                 "[default: --enable-expert-parallel].")
@setting("prefill_gpu", help="GPU profile of the prefill servers: their memory, KV cache and step times "
                             "[default: --gpu].")
@setting("decode_gpu", help="GPU profile of the decode servers, as aiconfigurator's --decode-system "
                            "[default: --gpu].")
@setting("kv_transfer_bandwidth", help="GB/s per GPU of the link the KV cache crosses from prefill to "
                                       "decode [default: the GPU profile's NVLink, 450 on the H100].")
@setting("kv_transfer_latency", help="Seconds of fixed time per KV transfer [default: the GPU profile's "
                                     "interconnect latency, 1e-05].")
@speculative_options
@setting("time_limit", help="Stop the simulated clock at this many seconds; requests still in flight "
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
@click.option("--force", is_flag=True, help="Run even what is estimated to need more memory than this machine has.")
def run_command(percentiles: str, percentile_metrics: str, goodput: tuple[str, ...], out: Path | None, tokens: bool,
                random_range_ratio: float | None, enable_chunked_prefill: bool, save_result: bool,
                save_detailed: bool, result_dir: Path | None, result_filename: str | None, quiet: bool, force: bool,
                **settings: Any) -> None:
    """Simulate one configuration and print its summary."""
    from simulator.metrics.summary import build_tables, summarize
    from simulator.metrics.tokens import TokensTable
    from simulator.outputs.run_folder import check_out_dir, default_run_dir, write_run
    from simulator.progress import progress_enabled, working
    from simulator.run.simulate import simulate

    given = typed_options()
    settings |= vllm_settings(given, settings["policy"], random_range_ratio, enable_chunked_prefill)
    if "backend" in given:
        chosen = given | ({"policy"} if enable_chunked_prefill else set())
        settings |= stack_settings(settings, chosen, available_gpus())
    config = RunConfig(percentiles=parse_percentiles(percentiles), goodput=parse_goodput(goodput), **settings)
    unused = config.unused_settings()
    if unused:
        raise InputError(f"--policy {config.policy} does not use {', '.join(flag(name) for name in unused)}")
    metrics = parse_percentile_metrics(percentile_metrics)
    saved = given & {"save_detailed", "result_dir", "result_filename"}
    if saved and not save_result:
        raise InputError(f"{', '.join(flag(name) for name in sorted(saved))} applies only with --save-result")
    now = dt.datetime.now()
    result_file = checked_result_path(config, result_dir, result_filename, now) if save_result else None
    if out is not None:
        check_out_dir(out)
    check_run_size(config, token_rows=save_result, force=force)
    progress = progress_enabled(quiet)
    result = simulate(config, progress=progress)
    with working("building tables", enabled=progress):
        tables = build_tables(result, tokens=save_result)  # a run folder's tokens table is streamed below
    summary = summarize(result, tables)
    label = f"{config.policy}-rate{config.rate:g}" if config.rate is not None else config.policy
    out = out or default_run_dir(RESULTS_DIR, label)
    settings_dict = config.to_dict() | {"kv_blocks": result.kv_blocks}
    written: dict[str, Any] = {"requests": tables.table("requests"), "steps": tables.table("steps")}
    if tokens:
        written["tokens"] = TokensTable(result.log)
    write_run(out, written, summary, settings_dict, progress=progress)
    click.echo(format_summary(summary, config, metrics))
    if "servers" in summary:
        click.echo(format_servers(summary["servers"]))
    click.echo(f"wrote {out}/ ({', '.join(sorted(written))} .parquet; summary.json)")
    if result_file is not None:
        write_result(result_file, vllm_result(summary, config, tables, metrics, save_detailed, now))
        click.echo(f"wrote {result_file}")


def checked_result_path(config: RunConfig, result_dir: Path | None, result_filename: str | None,
                        now: dt.datetime) -> Path:
    """Where --save-result writes, refused before the run when it lands outside --result-dir or no
    file can be written there (the run's JSON would be lost after the run)."""
    from simulator.outputs.run_folder import check_writable

    if result_dir is not None:
        check_writable(result_dir, "--result-dir", inside=True)
    try:
        path = result_path(config, result_dir, result_filename, now)
    except OSError as exc:  # a name the file system refuses (too long, say)
        raise InputError(f"cannot write --result-filename {quote(result_filename)}: {exc.strerror}") from None
    check_writable(path, "--result-filename")
    return path


def typed_options() -> set[str]:
    """The run's parameters the user gave on the command line."""
    context = click.get_current_context()
    return {name for name in context.params if context.get_parameter_source(name) is ParameterSource.COMMANDLINE}


def vllm_settings(given: set[str], policy: str, random_range_ratio: float | None,
                  enable_chunked_prefill: bool) -> dict[str, Any]:
    """RunConfig settings that vLLM's flags without a servesim twin stand for."""
    settings: dict[str, Any] = {}
    if enable_chunked_prefill:
        if "policy" in given and policy != ENABLE_CHUNKED_PREFILL:
            raise InputError(f"--enable-chunked-prefill is the {ENABLE_CHUNKED_PREFILL} policy; it contradicts "
                             f"--policy {policy}")
        settings["policy"] = ENABLE_CHUNKED_PREFILL
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
        raise InputError(f"--percentile-metrics takes distinct names from {', '.join(LATENCIES)}, got {quote(text)}")
    return names
