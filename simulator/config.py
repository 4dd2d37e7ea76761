"""Every setting of one run, in one flat frozen dataclass.

Names follow vLLM (`max_num_seqs`, `max_num_batched_tokens`, ...) and `vllm bench serve` where
they have one. The same object drives the CLI, sweeps and the metadata attached to every output.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from simulator.errors import InputError
from simulator.model import KV_CACHE_DTYPES, QUANTIZATIONS

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
ENGINES = ("fast", "reference")


@dataclass(frozen=True)
class RunConfig:
    """One simulation. Times in seconds, lengths in tokens."""

    policy: str = "continuous"
    model: str = "llama-3.1-8b"
    gpu: str = "h100_sxm"
    cost: str = "roofline"
    """Step-time model: the `roofline` over the profile's fitted rates, or its `measured` kernel tables
    (not the default: on the H100 it runs 11% under the chapter's batch-128 decode step)."""
    tensor_parallel_size: int = 1
    """GPUs the model is split across (vLLM's tensor parallelism); sizes and times are per GPU."""
    quantization: str | None = None
    """`fp8`: the linear layers' weights in fp8 (a checkpoint quantised to fp8 is so already)."""
    kv_cache_dtype: str = "auto"
    """`auto` (the model's dtype) or `fp8`: the KV cache's element type."""
    engine: str = "fast"
    """`fast` (O(1) work per step, k quiet decode steps at a time) or `reference` (one SimPy event per
    step); both give identical tables. A policy the fast engine does not know runs on the reference."""
    # Scheduler: vLLM serve's defaults on an H100-class GPU (1024 sequences, 8192 batched tokens).
    # vLLM without chunked prefill raises the budget to the model's context length (131072 for
    # Llama-3.1-8B) and reserves activation memory for a step that large, about 15 GB here; the
    # continuous policy keeps 8192 so both iteration-level policies run on the same memory.
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    max_batch_size: int = 64
    max_queue_delay: float = 0.0
    # KV memory.
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    """Use exactly this many KV blocks instead of sizing them from GPU memory (as vLLM's flag)."""
    # Workload: open loop at `rate` (requests/s; inf = all at once) or closed loop of `concurrency`
    # clients; `num_requests` or `duration` bounds it; or a trace file replayed as it is.
    rate: float | None = None
    burstiness: float = 1.0
    concurrency: int | None = None
    num_requests: int | None = None
    duration: float | None = None
    input_len: int = 2000
    output_len: int = 300
    input_len_dist: str = "fixed"
    output_len_dist: str = "fixed"
    trace: str | None = None
    trace_speed: float = 1.0
    seed: int = 0
    time_limit: float | None = None
    """Stop the simulated clock here; requests still in flight are reported unfinished."""
    # Metrics.
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    goodput: tuple[tuple[str, float], ...] = ()
    """SLOs as (metric, seconds), metric one of ttft, tpot, e2el."""

    def __post_init__(self) -> None:
        if self.cost not in ("measured", "roofline"):
            raise InputError(f"unknown --cost {self.cost!r} (choose from measured, roofline)")
        if self.engine not in ENGINES:
            raise InputError(f"unknown --engine {self.engine!r} (choose from {', '.join(ENGINES)})")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise InputError(f"unknown --quantization {self.quantization!r} "
                             f"(choose from {', '.join(QUANTIZATIONS)})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r} "
                             f"(choose from {', '.join(KV_CACHE_DTYPES)})")
        positive_ints = ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_batch_size",
                         "block_size", "input_len", "output_len")
        for name in positive_ints:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.policy != "static" and self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: a decode step of every running sequence would break the budget.
            raise InputError(f"--max-num-batched-tokens {self.max_num_batched_tokens} must be >= --max-num-seqs "
                             f"{self.max_num_seqs}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise InputError(f"--num-gpu-blocks-override must be positive, got {self.num_gpu_blocks_override}")
        if self.long_prefill_token_threshold < 0:
            raise InputError(f"--long-prefill-token-threshold must be >= 0, got {self.long_prefill_token_threshold}")
        if not (self.max_queue_delay >= 0 and math.isfinite(self.max_queue_delay)):
            raise InputError(f"--max-queue-delay must be a finite number of seconds >= 0, got {self.max_queue_delay}")
        if self.rate is not None and not self.rate > 0:
            raise InputError(f"--rate must be > 0 requests/s (or inf), got {self.rate}")
        if self.rate is not None and self.concurrency is not None:
            raise InputError("give --rate (open loop) or --concurrency (closed loop), not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError(f"--concurrency must be a positive number of clients, got {self.concurrency}")
        if self.num_requests is not None and self.num_requests < 1:
            raise InputError(f"--num-requests must be positive, got {self.num_requests}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise InputError(f"--time-limit must be > 0 seconds, got {self.time_limit}")
        for q in self.percentiles:
            if not 0 <= q <= 100:
                raise InputError(f"percentile {q} is outside [0, 100]")
        for metric, limit in self.goodput:
            if metric not in GOODPUT_METRICS:
                raise InputError(f"unknown goodput metric {metric!r} (choose from {', '.join(GOODPUT_METRICS)})")
            if not limit > 0:
                raise InputError(f"goodput SLO {metric}:{limit * 1e3:g} ms must be > 0")

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON- and Parquet-friendly settings (percentiles and SLOs as strings)."""
        data = asdict(self)
        data["percentiles"] = ",".join(f"{q:g}" for q in self.percentiles)
        data["goodput"] = " ".join(f"{m}:{s * 1e3:g}" for m, s in self.goodput)
        return data

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
