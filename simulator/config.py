"""Every setting of one run, in one flat frozen dataclass.

Names follow vLLM (`max_num_seqs`, `max_num_batched_tokens`, ...) and `vllm bench serve` where
they have one. The same object drives the CLI, sweeps and the metadata attached to every output.
Which settings a policy reads, and what it refuses, its module says: the config asks the registry
(`policies`) and never names a policy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from policies import POLICIES, build_policy
from simulator.deploy.model import KV_CACHE_DTYPES, QUANTIZATIONS
from simulator.errors import InputError
from simulator.fleet.routers import ROUTERS
from workloads.lengths import parse_length_dist

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
# Settings that shape a synthetic workload; a trace replays its own arrivals and lengths instead.
SYNTHETIC_SETTINGS = ("rate", "burstiness", "concurrency", "duration", "input_len", "output_len", "input_len_dist",
                      "output_len_dist", "prefix_len", "num_prefixes", "num_turns", "think_time")


def flag(name: str) -> str:
    """The command-line flag of setting `name`."""
    return f"--{name.replace('_', '-')}"


@dataclass(frozen=True)
class RunConfig:
    """One simulation. Times in seconds, lengths in tokens."""

    policy: str = "continuous"
    model: str = "llama-3.1-8b"
    gpu: str = "h100_sxm"
    cost: str = "roofline"
    """Step-time model: the `roofline` over the profile's fitted rates, or its `measured` kernel tables
    (not the default: its decode steps come out shorter than the chapter's measured ones)."""
    tensor_parallel_size: int = 1
    """GPUs the model is split across (vLLM's tensor parallelism); sizes and times are per GPU."""
    quantization: str | None = None
    """`fp8`: the linear layers' weights in fp8 (a checkpoint quantised to fp8 is so already)."""
    kv_cache_dtype: str = "auto"
    """`auto` (the model's dtype) or `fp8`: the KV cache's element type."""
    # Scheduler: vLLM serve's defaults on an H100-class GPU (1024 sequences, 8192 batched tokens).
    # vLLM without chunked prefill raises the budget to the model's context length (131072 for
    # Llama-3.1-8B) and reserves activation memory for a step that large; the continuous policy
    # keeps 8192 so that every iteration-level policy runs on the same memory.
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    long_prefill_token_threshold: int = 0
    max_batch_size: int = 64
    max_queue_delay: float = 0.0
    max_model_len: int | None = None
    """Refuse requests longer than this (prompt + output tokens), as vLLM serve's flag; None: the model's."""
    # KV memory.
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    """Use exactly this many KV blocks instead of sizing them from GPU memory (as vLLM's flag)."""
    enable_prefix_caching: bool = True
    """vLLM V1's automatic prefix caching (its default: on); it acts on workloads with prefix identity."""
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
    priority_levels: int | None = None
    """Synthetic priorities, uniform over 0..N-1 (lower runs first under the priority policy)."""
    prefix_len: int = 0
    """Synthetic shared prefixes: each prompt is one of `num_prefixes` shared prefixes of this many
    tokens (chosen uniformly by seed), then its `input_len` own tokens; 0 = none."""
    num_prefixes: int = 1
    num_turns: int = 1
    """Multi-turn sessions: each session's turn k + 1 is sent `think_time` s after turn k's answer,
    its prompt the conversation so far and a new `input_len` question; --rate counts sessions."""
    think_time: float = 0.0
    seed: int = 0
    # A fleet (simulator.fleet.engine): colocated replicas behind a router, or prefill and decode pools.
    num_replicas: int = 1
    router: str = "round-robin"
    prefill_replicas: int | None = None
    decode_replicas: int | None = None
    prefill_tensor_parallel_size: int | None = None
    """GPUs of each prefill server (None: --tensor-parallel-size)."""
    decode_tensor_parallel_size: int | None = None
    kv_transfer_bandwidth: float | None = None
    """GB/s of the link a prefilled request's KV crosses, per GPU (None: the GPU profile's NVLink)."""
    kv_transfer_latency: float | None = None
    """Seconds of fixed time per KV transfer (None: the GPU profile's interconnect latency)."""
    time_limit: float | None = None
    """Stop the simulated clock here; requests still in flight are reported unfinished."""
    # Metrics.
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    goodput: tuple[tuple[str, float], ...] = ()
    """SLOs as (metric, seconds), metric one of ttft, tpot, e2el."""

    def __post_init__(self) -> None:
        self._check_choices()
        self._check_server()
        self._check_load()
        self._check_prefixes_and_turns()
        self._check_bounds()
        check_fleet(self)
        build_policy(self)  # the policy's name, and what that policy refuses of these settings
        self._check_workload_source()
        if self.trace is None:
            self._check_synthetic_workload()
        self._check_metrics()

    def _check_choices(self) -> None:
        if self.cost not in ("measured", "roofline"):
            raise InputError(f"unknown --cost {self.cost!r} (choose from measured, roofline)")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise InputError(f"unknown --quantization {self.quantization!r} "
                             f"(choose from {', '.join(QUANTIZATIONS)})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(f"unknown --kv-cache-dtype {self.kv_cache_dtype!r} "
                             f"(choose from {', '.join(KV_CACHE_DTYPES)})")

    def _check_server(self) -> None:
        """The server's sizes and the scheduler's limits (and the synthetic lengths, positive like them)."""
        for name in ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_batch_size",
                     "block_size", "input_len", "output_len"):
            check_integer(name, getattr(self, name))
        if self.max_model_len is not None and self.max_model_len < 1:
            raise InputError(f"--max-model-len must be a positive number of tokens, got {self.max_model_len}")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise InputError(f"--num-gpu-blocks-override must be positive, got {self.num_gpu_blocks_override}")
        if self.long_prefill_token_threshold < 0:
            raise InputError(f"--long-prefill-token-threshold must be >= 0, got {self.long_prefill_token_threshold}")
        if not (self.max_queue_delay >= 0 and math.isfinite(self.max_queue_delay)):
            raise InputError(f"--max-queue-delay must be a finite number of seconds >= 0, got {self.max_queue_delay}")

    def _check_load(self) -> None:
        """An open loop's rate or a closed loop's clients, and the priorities drawn for them."""
        if self.rate is not None and not self.rate > 0:
            raise InputError(f"--rate must be > 0 requests/s (or inf), got {self.rate}")
        if self.rate is not None and self.concurrency is not None:
            raise InputError("give --rate (open loop) or --concurrency (closed loop), not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise InputError(f"--concurrency must be a positive number of clients, got {self.concurrency}")
        if self.priority_levels is not None and self.priority_levels < 1:
            raise InputError(f"--priority-levels must be a positive integer, got {self.priority_levels}")

    def _check_prefixes_and_turns(self) -> None:
        check_integer("prefix_len", self.prefix_len, minimum=0, unit=" tokens")
        check_integer("num_prefixes", self.num_prefixes)
        if self.num_prefixes != 1 and not self.prefix_len:
            raise InputError(f"--num-prefixes {self.num_prefixes} needs --prefix-len (the shared prefixes' length)")
        check_integer("num_turns", self.num_turns)
        if not (0 <= self.think_time < math.inf):
            raise InputError(f"--think-time must be a finite number of seconds >= 0, got {self.think_time}")
        if self.think_time and self.num_turns == 1:
            raise InputError(f"--think-time {self.think_time:g} needs --num-turns above 1 (the time between turns)")
        if self.num_turns > 1 and self.duration is not None:
            raise InputError("--num-turns counts --num-requests requests; it does not take --duration")

    def _check_bounds(self) -> None:
        """How many requests, how long the clock runs, and the seed."""
        if self.num_requests is not None and self.num_requests < 1:
            raise InputError(f"--num-requests must be positive, got {self.num_requests}")
        if self.time_limit is not None and not self.time_limit > 0:
            raise InputError(f"--time-limit must be > 0 seconds, got {self.time_limit}")
        check_integer("seed", self.seed, minimum=0)

    def _check_workload_source(self) -> None:
        """Refuse what would be recorded as applied without having been: a synthetic workload's
        settings beside a trace, or a trace's speed without one."""
        if self.trace is None:
            if self.trace_speed != DEFAULTS["trace_speed"]:
                raise InputError(f"--trace-speed {self.trace_speed:g} applies only to a --trace replay")
            return
        if not (0 < self.trace_speed < math.inf):
            raise InputError(f"--trace-speed must be a finite number > 0, got {self.trace_speed}")
        for name in SYNTHETIC_SETTINGS:
            value = getattr(self, name)
            if value != DEFAULTS[name]:
                raise InputError(f"{flag(name)} {value} does not apply to --trace, which replays the trace's own "
                                 "arrivals and lengths")

    def _check_synthetic_workload(self) -> None:
        """What the workload builder would refuse, said with the flags (it names its arguments)."""
        if not (self.burstiness > 0):
            raise InputError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.concurrency is not None and self.burstiness != DEFAULTS["burstiness"]:
            raise InputError(f"--burstiness {self.burstiness:g} shapes an open loop's arrivals (--rate); "
                             "a closed loop (--concurrency) has none")
        if self.duration is not None:
            if not (0 < self.duration < math.inf):
                raise InputError(f"--duration must be a finite number of seconds > 0, got {self.duration}")
            if self.concurrency is not None:
                raise InputError("--duration bounds an open loop (--rate); a closed loop (--concurrency) runs "
                                 "--num-requests requests")
            if self.rate is None or math.isinf(self.rate):
                raise InputError("--duration needs a finite --rate: with all requests at once (--rate inf, the "
                                 "default) it would mean infinitely many")
        for name in ("input_len_dist", "output_len_dist"):
            try:
                parse_length_dist(getattr(self, name))
            except InputError as exc:
                raise InputError(f"{flag(name)}: {exc}") from None
        if self.duration is not None and self.num_requests is not None:
            # Both would cap the count and the lower would silently win.
            raise InputError(f"give --num-requests ({self.num_requests}) or --duration ({self.duration:g} s), not both")

    def _check_metrics(self) -> None:
        for i, q in enumerate(self.percentiles):
            if not 0 <= q <= 100:
                raise InputError(f"--percentiles {q:g} is outside [0, 100]")
            if q in self.percentiles[:i]:
                raise InputError(f"--percentiles lists {q:g} twice")
        for i, (metric, limit) in enumerate(self.goodput):
            if metric not in GOODPUT_METRICS:
                raise InputError(f"unknown --goodput metric {metric!r} (choose from {', '.join(GOODPUT_METRICS)})")
            if not limit > 0:
                raise InputError(f"--goodput {metric}:{limit * 1e3:g} ms must be > 0")
            if metric in (m for m, _ in self.goodput[:i]):
                raise InputError(f"--goodput gives an SLO for {metric} twice")

    def unused_settings(self) -> list[str]:
        """Settings moved from their default that some policy reads (its `SETTINGS`) but this run's never does."""
        policy_settings = {name for module in POLICIES.values() for name in module.SETTINGS}
        read = POLICIES[self.policy].SETTINGS
        return [name for name in self.field_names() if name in policy_settings and name not in read
                and getattr(self, name) != DEFAULTS[name]]

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON- and Parquet-friendly settings (percentiles and SLOs as strings)."""
        data = asdict(self)
        data["percentiles"] = ",".join(f"{q:g}" for q in self.percentiles)
        data["goodput"] = " ".join(f"{m}:{s * 1e3:g}" for m, s in self.goodput)
        return data

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(RunConfig)}


def check_integer(name: str, value: object, minimum: int = 1, unit: str = "") -> None:
    """Refuse a value of setting `name` that is not an int (a bool is not one) of at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer >= {minimum}{unit}"
        raise InputError(f"{flag(name)} must be {wanted}, got {value!r}")


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


# The fleet's settings checked together: colocated replicas or prefill/decode pools, not both, and
# each pool setting only where it applies.
POOL_SETTINGS = ("prefill_tensor_parallel_size", "decode_tensor_parallel_size", "kv_transfer_bandwidth",
                 "kv_transfer_latency")
"""Settings that apply only to prefill/decode pools."""


def disaggregated(config: RunConfig) -> bool:
    return config.prefill_replicas is not None


def is_fleet(config: RunConfig) -> bool:
    """More than one server: replicas, or prefill/decode pools."""
    return config.num_replicas > 1 or disaggregated(config)


def check_fleet(config: RunConfig) -> None:
    check_integer("num_replicas", config.num_replicas)
    if config.router not in ROUTERS:
        raise InputError(f"unknown --router {config.router!r} (choose from {', '.join(ROUTERS)})")
    for name in ("prefill_replicas", "decode_replicas"):
        value = getattr(config, name)
        if value is not None:
            check_integer(name, value)
    if (config.prefill_replicas is None) != (config.decode_replicas is None):
        given = "--prefill-replicas" if config.prefill_replicas is not None else "--decode-replicas"
        raise InputError(f"{given} needs both --prefill-replicas and --decode-replicas (the two pools' sizes)")
    if not disaggregated(config):
        for name in POOL_SETTINGS:
            if getattr(config, name) is not None:
                raise InputError(f"--{name.replace('_', '-')} applies only to prefill/decode pools "
                                 "(--prefill-replicas and --decode-replicas)")
        if config.router != "round-robin" and config.num_replicas == 1:
            raise InputError(f"--router {config.router} needs more than one server (--num-replicas, or "
                             "--prefill-replicas and --decode-replicas)")
        return
    if config.num_replicas != 1:
        raise InputError(f"--num-replicas {config.num_replicas} is for colocated replicas; prefill/decode pools "
                         "are sized by --prefill-replicas and --decode-replicas")
    for name in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size"):
        value = getattr(config, name)
        if value is not None:
            check_integer(name, value)
    bandwidth, latency = config.kv_transfer_bandwidth, config.kv_transfer_latency
    if bandwidth is not None and not (0 < bandwidth < math.inf):
        raise InputError(f"--kv-transfer-bandwidth must be a finite number of GB/s > 0, got {bandwidth}")
    if latency is not None and not (0 <= latency < math.inf):
        raise InputError(f"--kv-transfer-latency must be a finite number of seconds >= 0, got {latency}")
