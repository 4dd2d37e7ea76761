"""Measured points rerun in servesim: the simulated statistics beside the measured ones, with errors.

Each point is rerun as its client ran it (`simulator.sim2real.replay`): the chunked policy with vLLM serve's
defaults on an H100-class GPU (8,192 batched tokens, 1,024 sequences: vLLM V1 always chunks
prefills), the measured-kernel cost model on the point's GPU profile (by default the shipped one
with vLLM's fitted host overhead, `default_profile`), with the profile's fitted client time
(`calibration/fit_host.py`) where it has one. The error of a
statistic is (simulated - measured) / measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from simulator.config import DEFAULTS, RunConfig
from simulator.deploy.backends import StackDefaults, async_by_default, stack_defaults, stack_profile
from simulator.deploy.hardware import available_gpus, load_profile
from simulator.deploy.model import load_model
from simulator.errors import InputError
from simulator.run.clients import ClientRun
from simulator.sim2real.bandwidth import point_share
from simulator.sim2real.points import MeasuredPoint
from simulator.sim2real.replay import Replay, replay_workload
from simulator.sim2real.silicon import ASSUMED, expert_parallel_modelled
from workloads import Workload, synthetic_workload


@dataclass(frozen=True)
class Scheduler:
    """The measured servers' scheduler settings (default: vLLM serve's on an H100-class GPU) and the
    client's prompt pool (`num_dataset_entries`, aiperf's; None: every prompt its own);
    `fp8_kv_with_fp8_weights`: the server stores KV in fp8 where the point's weights are fp8
    (`fp8_kv`; TensorRT-LLM's, `simulator.deploy.backends`)."""

    max_num_batched_tokens: int = DEFAULTS["max_num_batched_tokens"]
    max_num_seqs: int = DEFAULTS["max_num_seqs"]
    policy: str = "chunked"
    enable_prefix_caching: bool = DEFAULTS["enable_prefix_caching"]
    num_dataset_entries: int | None = None
    fp8_kv_with_fp8_weights: bool = False
    async_scheduling: bool = False
    """As the stack plans its steps (`simulator.deploy.backends`); a point reruns with it where the
    point's version of its stack scheduled so by default (`async_by_default`)."""
    output_lag: bool = False
    """As the stack delivers its outputs (`simulator.engine.delivery`), where it reruns with async
    scheduling."""
    disable_custom_all_reduce: bool = False
    """Every all-reduce NCCL's (`RunConfig.disable_custom_all_reduce`)."""
    speculation: tuple[str, int, str] | None = None
    """Speculative decoding every server runs with, as (method, k, acceptance): `RunConfig`'s
    `speculative_method`, `num_speculative_tokens`, `spec_acceptance` (None: none); a hypothesis
    about how the points were served, not a stack default."""

    @classmethod
    def of(cls, stack: StackDefaults, num_dataset_entries: int | None = None) -> Scheduler:
        """A stack's scheduler (`simulator.deploy.backends`: its stock one, or a benchmark template's)."""
        return cls(stack.max_num_batched_tokens, stack.max_num_seqs, stack.policy, stack.enable_prefix_caching,
                   num_dataset_entries, stack.fp8_kv_with_fp8_weights, stack.async_scheduling, stack.output_lag)


DEFAULT_SCHEDULER = Scheduler()
ROW_SCHEMA = {"point": pl.String, "group": pl.String, "backend": pl.String, "mode": pl.String, "gpu": pl.String,
              "model": pl.String,
              "tensor_parallel_size": pl.Int64, "quantization": pl.String, "concurrency": pl.Int64,
              "rate": pl.Float64, "input_len": pl.Float64, "output_len": pl.Float64, "statistic": pl.String,
              "measured": pl.Float64, "simulated": pl.Float64, "error": pl.Float64, "bandwidth_share": pl.Float64}
"""One row per (point, statistic); times in seconds, throughputs per second; `bandwidth_share`, the
point's: the share of its GPUs' memory bandwidth its measured decode needs as rerun
(`simulator.sim2real.bandwidth`; above 1, impossible as stated; NaN where not checked)."""


def default_profile(system: str, backend: str = "vllm") -> str:
    """The shipped profile a point of `backend` measured on `system` reruns on: that stack's
    (`<system>_<backend>`, its kernels and the host terms `simulate fit` kept for it) where shipped,
    else the GPU's own."""
    return stack_profile(system, backend, available_gpus())


def client_time(gpu: str) -> float:
    """The profile's fitted per-request client time, seconds (0 for a profile not fitted)."""
    fit = load_profile(gpu).meta.get("host_overhead_fit")
    return float(fit["values"]["client_time"]) if isinstance(fit, dict) else 0.0


FP8_WEIGHTS = ("fp8", "fp8_block")
"""A checkpoint's own weight dtypes that are fp8 (`ModelSpec.weight_dtype`)."""


def fp8_kv(point: MeasuredPoint, scheduler: Scheduler) -> bool:
    """Whether `point`'s server stored KV in fp8 (`Scheduler.fp8_kv_with_fp8_weights`): where the row's
    quant mode makes a 16-bit checkpoint's weights fp8 (TensorRT-LLM's `auto` KV dtype follows an FP8
    checkpoint's `kv_cache_quant_algo`), and on an aggregated row of a checkpoint whose own weights
    are fp8 (DeepSeek's block fp8). The data requires the latter: the table's DeepSeek-R1 TensorRT-LLM
    server at 128 clients of 1,024 + 8,192 tokens ran them all at once (TTFT 1.4 s), 1.18 M tokens of
    latent KV that bf16 (70 kB a token on each GPU) cannot hold on 8 H200s beside the weights, and
    fp8 can; it is one server's setting at every concurrency. The disaggregated rows (Dynamo's
    recipes) say nothing of the kind and keep the stack's `auto`: the model's dtype, as the
    checkpoint gives no KV quantization (docs/validation/stack-fidelity.md)."""
    if not scheduler.fp8_kv_with_fp8_weights:
        return False
    return point.quantization == "fp8" or (
        point.mode == "agg" and point.quantization is None and load_model(point.model).weight_dtype in FP8_WEIGHTS)


def point_config(point: MeasuredPoint, gpu: str, seed: int = 0, scheduler: Scheduler = DEFAULT_SCHEDULER) -> RunConfig:
    """The point's deployment on profile `gpu`; `scheduler`: the server's settings (the default one,
    vLLM serve's, stands for the stock scheduler of the point's stack, `simulator.deploy.backends`;
    one that differs from it only in its budget or sequences, for that stack's with those)."""
    default = DEFAULT_SCHEDULER
    if point.backend != "vllm" and replace(scheduler, speculation=None, max_num_seqs=default.max_num_seqs,
                                           max_num_batched_tokens=default.max_num_batched_tokens) == default:
        # The stack's stock server, with the budget and sequences given where they are not vLLM's defaults.
        stack = Scheduler.of(stack_defaults(point.backend))
        given = {name: getattr(scheduler, name) for name in ("max_num_batched_tokens", "max_num_seqs")
                 if getattr(scheduler, name) != getattr(default, name)}
        scheduler = replace(stack, speculation=scheduler.speculation, **given)
    method, k, acceptance = scheduler.speculation or (None, None, None)
    kv_fp8 = fp8_kv(point, scheduler)
    overlap = scheduler.async_scheduling and async_by_default(point.backend, point.backend_version)
    return RunConfig(policy=scheduler.policy, model=point.model, gpu=gpu, cost="measured",
                     tensor_parallel_size=point.tensor_parallel_size, quantization=point.quantization,
                     input_len=point.input_lens[0], output_len=point.output_lens[0], seed=seed,
                     max_num_batched_tokens=scheduler.max_num_batched_tokens, max_num_seqs=scheduler.max_num_seqs,
                     enable_prefix_caching=scheduler.enable_prefix_caching, backend=point.backend,
                     num_dataset_entries=scheduler.num_dataset_entries, kv_cache_dtype="fp8" if kv_fp8 else "auto",
                     speculative_method=method, num_speculative_tokens=k, spec_acceptance=acceptance,
                     async_scheduling=overlap, output_lag=overlap and scheduler.output_lag,
                     disable_custom_all_reduce=scheduler.disable_custom_all_reduce,
                     **deployment_settings(point))


def deployment_settings(point: MeasuredPoint) -> dict[str, Any]:
    """The settings beyond one server that the point's deployment needs: a disaggregated row's
    prefill and decode pools (each worker a server of its pool's tensor parallelism), and, where
    `RunConfig` models them, expert parallelism (`moe_ep_size` > 1) and attention data parallelism:
    `attention_dp_size` N is N servers behind the router (`num_replicas`), each rank its own
    scheduler and `batch_size` of the client's N x `batch_size` requests; with expert parallelism
    their MoE layers one expert-parallel group (`data_parallel_size` N). A pool's worker is the
    same, its ranks servers of the pool (`prefill_data_parallel_size`, ...)."""
    settings: dict[str, Any] = {}
    if point.mode == "disagg" and point.prefill is not None and point.decode is not None:
        for role, pool in (("prefill", point.prefill), ("decode", point.decode)):
            settings |= {f"{role}_replicas": pool.workers, f"{role}_tensor_parallel_size": pool.tensor_parallel_size}
            if pool.attention_dp_size > 1 or pool.moe_ep_size > 1:  # each worker's ranks, as an agg row's below
                settings |= {f"{role}_data_parallel_size": pool.attention_dp_size,
                             f"{role}_enable_expert_parallel": pool.moe_ep_size > 1}
        return settings
    if point.attention_dp_size > 1:  # a dense model's data parallelism is replicas, nothing shared
        settings["num_replicas"] = point.attention_dp_size
    if expert_parallel_modelled() and point.moe_ep_size > 1:
        settings |= {"enable_expert_parallel": True, "data_parallel_size": point.attention_dp_size}
    return settings


def point_workload(point: MeasuredPoint, seed: int = 0) -> Workload:
    """The requests the client sent, warm-up first: its own lengths, or the fixed ones repeated."""
    total = point.warmup + point.num_requests

    def lengths(given: tuple[int, ...]) -> np.ndarray:
        if len(given) == 1:
            return np.full(total, given[0], np.int64)
        return np.resize(np.asarray(given, np.int64), total)  # detail lists cover the measured requests

    prompts, outputs = lengths(point.input_lens), lengths(point.output_lens)
    if point.concurrency is not None:
        return Workload(prompts, outputs, None, point.concurrency)
    assert point.rate is not None
    arrivals = synthetic_workload(input_len=1, output_len=1, rate=point.rate, burstiness=point.burstiness,
                                  num_requests=total, seed=seed).arrival
    return Workload(prompts, outputs, arrivals, None)


def rerun(point: MeasuredPoint, gpu: str, seed: int = 0, scheduler: Scheduler = DEFAULT_SCHEDULER) -> Replay:
    """`point` rerun on profile `gpu` as its client sent it."""
    return rerun_as(point, point_config(point, gpu, seed, scheduler))


def rerun_as(point: MeasuredPoint, config: RunConfig) -> Replay:
    """`point` rerun as `config` (its `point_config`) deploys it, as its client sent it."""
    workload = point_workload(point, config.seed)
    concurrency = point.concurrency if point.concurrency is not None else workload.num_requests
    client = ClientRun(concurrency, point.warmup, point.num_requests, client_time(config.gpu))
    return replay_workload(config, client, workload)


def simulated_statistics(run: Replay, wanted: set[str]) -> dict[str, float]:
    """The statistics of the measured requests that `wanted` names (`ttft_mean`, `itl_p99`, ...)."""
    samples = {"ttft": run.ttft, "tpot": run.tpot[~np.isnan(run.tpot)], "e2el": run.e2el}
    if any(name.startswith("itl_") for name in wanted):
        samples["itl"] = run.itl()
    stats: dict[str, float] = {}
    for metric, values in samples.items():
        if len(values):
            stats |= {f"{metric}_mean": float(np.mean(values)), f"{metric}_median": float(np.median(values)),
                      f"{metric}_p99": float(np.percentile(values, 99))}
    reqs = run.result.requests
    stats["request_throughput"] = len(run.ttft) / run.duration
    stats["output_throughput"] = float(reqs.output_tokens[run.warmup:run.end].sum()) / run.duration
    return {name: value for name, value in stats.items() if name in wanted}


def compare_point(point: MeasuredPoint, gpu: str, seed: int = 0,
                  scheduler: Scheduler = DEFAULT_SCHEDULER) -> list[dict[str, Any]]:
    """One row per measured statistic of `point`, rerun on `gpu`."""
    config = point_config(point, gpu, seed, scheduler)
    simulated = simulated_statistics(rerun_as(point, config), set(point.measured))
    share = point_share(point, config)
    base = {"point": point.name, "group": point.group, "backend": point.backend, "mode": point.mode, "gpu": gpu,
            "model": point.model,
            "tensor_parallel_size": point.tensor_parallel_size, "quantization": point.quantization or "",
            "concurrency": point.concurrency, "rate": point.rate,
            "input_len": float(np.mean(point.input_lens)), "output_len": float(np.mean(point.output_lens))}
    rows = []
    for statistic, measured in point.measured.items():
        value = simulated.get(statistic, math.nan)
        error = (value - measured) / measured if measured > 0 else math.nan
        rows.append(base | {"statistic": statistic, "measured": measured, "simulated": value, "error": error,
                            "bandwidth_share": share})
    return rows


def compare_points(points: list[MeasuredPoint], profiles: dict[str, str], seed: int = 0,
                   scheduler: Scheduler = DEFAULT_SCHEDULER) -> pl.DataFrame:
    """Every point rerun on the profile its GPU maps to in `profiles` (else `default_profile`); a
    point servesim refuses to rerun is an error (`simulator.sim2real.units` skips it instead)."""
    rows: list[dict[str, Any]] = []
    for point in points:
        if not point.gpu:
            raise InputError(f"{point.name}: the result does not say its GPU; give --gpu")
        profile = profiles.get(point.gpu, default_profile(point.gpu, point.backend))
        rows += compare_point(point, profile, seed, scheduler)
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def with_deployment(point: MeasuredPoint, gpu: str, tensor_parallel_size: int, quantization: str | None
                    ) -> MeasuredPoint:
    """A vLLM result's deployment, which its file does not record, from the command line."""
    return replace(point, gpu=gpu, tensor_parallel_size=tensor_parallel_size,
                   quantization=quantization or point.quantization)


def summary(rows: pl.DataFrame) -> pl.DataFrame:
    """Median |error| per statistic, over all points and per group."""
    absolute = rows.filter(pl.col("error").is_not_nan()).with_columns(abs_error=pl.col("error").abs())
    overall = absolute.group_by("statistic").agg(pl.lit("all").alias("group"), pl.len().alias("points"),
                                                 pl.col("abs_error").median().alias("median_abs_error"))
    grouped = absolute.group_by("group", "statistic").agg(pl.len().alias("points"),
                                                          pl.col("abs_error").median().alias("median_abs_error"))
    return pl.concat([overall.select("group", "statistic", "points", "median_abs_error"),
                      grouped.select("group", "statistic", "points", "median_abs_error")]).sort("group", "statistic")


def fitted_by_profile(row: dict[str, Any]) -> bool:
    """Whether a compare row is of the rows its profile's host terms were fitted on (`simulate fit`'s
    `fitted_on`: the stack, GPU, weights and tensor parallel sizes; every model of them counts, so
    a row is held out only where no fit could have used it)."""
    profile = load_profile(row["gpu"])
    fit = profile.meta.get("host_overhead_fit")
    if not isinstance(fit, dict) or not isinstance(fit.get("fitted_on"), dict) or row["mode"] != "agg":
        return False
    on = fit["fitted_on"]
    sizes = on.get("tensor_parallel_sizes")
    return (on.get("backend", "vllm") == row["backend"] and on.get("gpu") == profile.gpu.name
            and on.get("weights") == (row["quantization"] or "bf16")
            and (sizes == "all" or row["tensor_parallel_size"] in (sizes or ())))


def with_fitted(rows: pl.DataFrame) -> pl.DataFrame:
    """Compare rows with a `fitted` column: whether the row's profile's host fit used it
    (`fitted_by_profile`, asked once per deployment)."""
    keys = ("gpu", "backend", "mode", "quantization", "tensor_parallel_size")
    flags = {key: fitted_by_profile(dict(zip(keys, key, strict=True))) for key in rows.select(*keys).unique().rows()}
    return rows.with_columns(
        fitted=pl.struct(*keys).map_elements(lambda r: flags[tuple(r[k] for k in keys)], return_dtype=pl.Boolean))


ALL_STATED = "all, workers stated"
"""The per-stack line over the rows that say their deployment: the guessed ones left out."""


def held_out_summary(rows: pl.DataFrame) -> pl.DataFrame:
    """Median |error| per stack (group `all`; `ALL_STATED` too where some rows' deployment was assumed)
    and per group of it, statistic and whether the profile's fit used the row (`fitted_by_profile`)."""
    marked = with_fitted(rows.filter(pl.col("error").is_not_nan()))
    assumed = pl.col("group").str.ends_with(ASSUMED)
    guessing = marked.filter(assumed)["backend"].unique().to_list()  # the stacks with rows of assumed workers
    stated = marked.filter(~assumed & pl.col("backend").is_in(guessing))
    parts = [marked.with_columns(group=pl.lit("all")), stated.with_columns(group=pl.lit(ALL_STATED)), marked]
    return (pl.concat([part.group_by("backend", "group", "fitted", "statistic")
                       .agg(pl.len().alias("points"), pl.col("error").abs().median().alias("median_abs_error"))
                       for part in parts])
            .sort("backend", ~pl.col("group").str.starts_with("all"), "group", "fitted", "statistic"))
