"""Measured points that their GPUs could not have served as stated: a bound on decode traffic.

Each decode step reads, on every GPU, that GPU's share of the weights (a MoE model's routed experts
at least those of the `k` experts one token is routed to, spread over the server's GPUs) and the KV
cache of every sequence it decodes, no faster than the GPU's datasheet memory bandwidth `B`. Over a
measured window of `T` seconds with `S` decode steps of `b_j` sequences each, `N = sum b_j` decode
tokens (each of a context between `isl + 1` and `isl + osl - 1`) and a mean TPOT of `t`:

- the steps fit in the window: `T B >= S W + N K_mean`, so `S <= (T B - N K_mean) / W`;
- each sequence waits every step it is in: `N t = sum b_j d_j >= (W N + K_min sum b_j^2) / B`, and
  `sum b_j^2 >= N^2 / S` (Cauchy-Schwarz);

with `W` the weight bytes a step reads per GPU, `K_min` and `K_mean` the KV bytes per GPU of one
sequence at its shortest and mean decode context, and `X = N / T` the decode tokens per second:

    t B >= W (1 + X K_min / (B - X K_mean)),   B > X K_mean

The least `B` that meets it is the bandwidth the measurement needs (`W / t + X K_mean` where every
context is the same); `required_share` is that need over the GPU's (above 1: impossible). `X` is the
measured output throughput less the request throughput (each request's first token is its prompt's,
not a decode step's) where the file gives them (vLLM's results, aiperf's exports), else, for a
closed loop of `c` clients that send the next request as the last one ends, `c (osl - 1) / (TTFT +
(osl - 1) t)`. A point above 1 ran something it does not state: a smaller KV cache (fp8) than the
rerun assumes, speculative decoding (fewer steps than tokens), shorter outputs than it says.
Prefix-cache hits do not lower it (a hit saves prefill, not decode reads). Checked only where the
bound holds as derived: fixed lengths on one aggregated server without attention data or pipeline
parallelism, rerun without speculative decoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from simulator.config import RunConfig
from simulator.cost.operators import weight_bytes_read
from simulator.deploy.hardware import load_gpu
from simulator.deploy.model import load_model
from simulator.deploy.spec import ModelSpec
from simulator.sim2real.points import MeasuredPoint


@dataclass(frozen=True)
class DecodeTraffic:
    """What one decode step must read on each GPU, and how fast it can."""

    weights: float
    """Bytes of weights a step reads per GPU (the routed experts' lower bound averaged over GPUs)."""
    kv_min: float
    """KV bytes per GPU of one sequence at its shortest decode context (`isl + 1`)."""
    kv_mean: float
    """KV bytes per GPU of one sequence, averaged over its decode tokens (contexts `isl + 1 ..
    isl + osl - 1`)."""
    bandwidth: float
    """The GPU's datasheet memory bandwidth, bytes/s."""


def mean_kv_bytes(model: ModelSpec, input_len: int, output_len: int) -> float:
    """KV bytes of one sequence averaged over its decode tokens, at contexts `input_len + 1 ..
    input_len + output_len - 1` (exact: full layers grow linearly, windowed ones stop at the window)."""
    steps = output_len - 1
    full = (input_len + output_len / 2) * model.kv_bytes_per_token
    if not model.sliding_layers:
        return full
    first, last, window = input_len + 1, input_len + steps, model.sliding_window
    below = max(0, min(last, window) - first + 1)  # contexts under the window, counted as they are
    under = below * (first + first + below - 1) / 2 + (steps - below) * window
    return full + model.sliding_layers * model.kv_bytes_per_token_per_layer * under / steps


def decode_traffic(point: MeasuredPoint, config: RunConfig) -> DecodeTraffic | None:
    """The decode traffic of `point` as `config` reruns it (its weights, KV dtype, parallelism and
    GPU), or None where the bound does not hold as derived (module docstring)."""
    if (point.mode != "agg" or len(point.input_lens) != 1
            or len(point.output_lens) != 1 or point.output_lens[0] < 2 or point.attention_dp_size > 1
            or point.pp_size > 1 or config.data_parallel_size > 1 or config.speculative_method is not None):
        return None
    model = load_model(config.model).deployed(config.quantization, config.kv_cache_dtype)
    tp, isl, osl = config.tensor_parallel_size, point.input_lens[0], point.output_lens[0]
    shard = model.shard(tp)
    # One token's step is the least any step reads: the routed experts of one token, spread over the GPUs.
    return DecodeTraffic(weight_bytes_read(shard, 1), float(shard.kv_bytes_for_context(isl + 1)),
                         mean_kv_bytes(shard, isl, osl), load_gpu(config.gpu).datasheet_mem_bw)


def decode_rate(point: MeasuredPoint) -> float | None:
    """Decode tokens per second of `point`, measured (output less request throughput, or the
    output throughput's decode share) where the file gives it, else its closed loop's (module
    docstring); None for an open loop that gives no throughput, or outputs of one token (no decode)."""
    measured, output_len = point.measured, point.output_lens[0]
    if output_len < 2:
        return None
    if "output_throughput" in measured:
        if "request_throughput" in measured:
            return measured["output_throughput"] - measured["request_throughput"]
        return measured["output_throughput"] * (output_len - 1) / output_len
    if point.concurrency is None or measured["ttft_mean"] < 0 or measured["tpot_mean"] <= 0:
        return None
    return point.concurrency * (output_len - 1) / (measured["ttft_mean"] + (output_len - 1) * measured["tpot_mean"])


def required_share(traffic: DecodeTraffic, rate: float, tpot: float) -> float:
    """The memory bandwidth each GPU needs to decode `rate` tokens a second at the measured mean
    `tpot` (seconds), as a share of its own: above 1, no server of that GPU could have. The larger
    root of `t B^2 - (t X K_mean + W) B + W X (K_mean - K_min) = 0`."""
    if tpot <= 0 or rate < 0:
        return math.nan
    weights, spread = traffic.weights, rate * (traffic.kv_mean - traffic.kv_min)
    middle = tpot * rate * traffic.kv_mean + weights
    need = (middle + math.sqrt(max(middle * middle - 4 * tpot * weights * spread, 0.0))) / (2 * tpot)
    return need / traffic.bandwidth


def point_share(point: MeasuredPoint, config: RunConfig) -> float:
    """`required_share` of a measured point rerun as `config`; NaN where it is not checked (no
    measured mean TTFT and TPOT, no decode rate, or `decode_traffic` None)."""
    if "ttft_mean" not in point.measured or "tpot_mean" not in point.measured:
        return math.nan
    rate = decode_rate(point)
    traffic = decode_traffic(point, config) if rate is not None else None
    if rate is None or traffic is None:
        return math.nan
    return required_share(traffic, rate, point.measured["tpot_mean"])


def over_bandwidth() -> pl.Expr:
    """Whether a `simulate compare` row's point needs more memory bandwidth than its GPUs have, rerun
    as it states (`bandwidth_share` above 1; NaN or empty: not checked)."""
    return pl.col("bandwidth_share").fill_nan(None).fill_null(0.0) > 1
