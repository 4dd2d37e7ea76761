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
from simulator.deploy.backends import BACKENDS
from simulator.deploy.hardware import profile_dir
from simulator.deploy.model import KV_CACHE_DTYPES, QUANTIZATIONS
from simulator.errors import InputError
from simulator.fleet.routers import ROUTERS
from simulator.ranges import (
    MAX_SECONDS,
    RANGES,
    flag,
    quote,
    shorten,
    spec_acceptance,
)
from workloads.lengths import parse_length_dist

GOODPUT_METRICS = ("ttft", "tpot", "e2el")
SPECULATIVE_METHODS = ("ngram", "eagle", "draft", "mtp")
SPECULATION_SETTINGS = ("num_speculative_tokens", "spec_acceptance", "draft_model")
"""Settings that apply only with a --speculative-method."""
# Settings that shape a synthetic workload; a trace replays its own arrivals and lengths instead.
SYNTHETIC_SETTINGS = ("rate", "burstiness", "concurrency", "duration", "input_len", "output_len", "input_len_dist",
                      "output_len_dist", "prefix_len", "num_prefixes", "num_turns", "think_time", "num_dataset_entries")




@dataclass(frozen=True)
class RunConfig:
    """One simulation. Times in seconds, lengths in tokens."""

    policy: str = "continuous"
    model: str = "llama-3.1-8b"
    gpu: str = "h100_sxm"
    cost: str = "roofline"
    """Step time: the `roofline` over the profile's fitted rates, or its `measured` kernel tables."""
    tensor_parallel_size: int = 1
    """GPUs the model is split across (vLLM's tensor parallelism); sizes and times are per GPU."""
    quantization: str | None = None
    """`fp8`: the linear layers' weights in fp8 (a checkpoint quantised to fp8 is so already)."""
    kv_cache_dtype: str = "auto"
    """`auto` (the model's dtype) or `fp8`: the KV cache's element type."""
    enable_expert_parallel: bool = False  # vLLM's; what it and data_parallel_size mean: simulator.deploy.spec
    data_parallel_size: int = 1
    backend: str = "vllm"  # the serving stack (simulator.deploy.backends)
    # Scheduler: vLLM serve's H100 defaults (1024 sequences, 8192 tokens; vLLM without chunking raises the
    # budget to the context length, the continuous policy keeps 8192: every policy on the same memory).
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
    async_scheduling: bool = False
    """Each step planned while the one before it runs (vLLM's --async-scheduling, SGLang's and
    TensorRT-LLM's overlap scheduler): a request that arrives after a step started waits for the step
    after the next (simulator.engine.server)."""
    disable_custom_all_reduce: bool = False
    """As vllm serve's and SGLang's flag: every all-reduce by NCCL (the profile's `collectives_nccl`),
    the stack's custom all-reduce off (as where GPUs lack peer access)."""
    output_lag: bool = False
    """Under async scheduling, a step's first tokens and finishes reach their clients when the next
    step ends if that one computes prompt tokens (TensorRT-LLM's overlap loop, simulator.engine.delivery)."""
    # KV offload: a host tier under the prefix cache (simulator.engine.kv), one server only.
    kv_offload_gb: float = 0.0
    """GB (1e9 bytes) of host memory per server holding KV blocks the GPU cache evicted; 0: none."""
    kv_offload_bandwidth: float | None = None
    """GB/s per GPU of the host link, host to device (None: the GPU profile's `host_link_bw`, PCIe)."""
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
    num_dataset_entries: int | None = None  # aiperf's prompt pool (simulator.run.clients.pool_content)
    trace: str | None = None
    trace_speed: float = 1.0
    priority_levels: int | None = None
    """Synthetic priorities, uniform over 0..N-1 (lower runs first under the priority policy)."""
    prefix_len: int = 0
    """Each prompt one of `num_prefixes` shared prefixes of this many tokens (by seed), then its own; 0 = none."""
    num_prefixes: int = 1
    num_turns: int = 1
    """Sessions: turn k + 1 sent `think_time` s after turn k's answer, its prompt the conversation so far."""
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
    prefill_data_parallel_size: int | None = None
    """Data-parallel attention ranks of each prefill worker, each a server of the pool (None: --data-parallel-size)."""
    decode_data_parallel_size: int | None = None
    prefill_enable_expert_parallel: bool | None = None
    """Each prefill worker's routed experts spread over its GPUs (None: --enable-expert-parallel)."""
    decode_enable_expert_parallel: bool | None = None
    prefill_gpu: str | None = None
    """GPU profile of each prefill server, its memory and step times its own (None: --gpu)."""
    decode_gpu: str | None = None
    kv_transfer_bandwidth: float | None = None
    """GB/s of the link a prefilled request's KV crosses, per GPU (None: the GPU profile's NVLink)."""
    kv_transfer_latency: float | None = None
    """Seconds of fixed time per KV transfer (None: the GPU profile's interconnect latency)."""
    # Speculative decoding (simulator.engine.speculation), as vLLM's --speculative-config.
    speculative_method: str | None = None
    """How each decode step's draft tokens are proposed: ngram, eagle, draft or mtp (None: no speculation)."""
    num_speculative_tokens: int | None = None
    """k: draft tokens per decode step, verified in one pass of k + 1 tokens per sequence; 0 drafts
    nothing (the run without speculation, a sweep's baseline row)."""
    spec_acceptance: str | None = None
    """Probability that a draft position is accepted given the positions before it were: one number
    for every position, or k separated by commas."""
    draft_model: str | None = None
    """The draft model of `speculative_method` draft: a built-in name or a config.json."""
    time_limit: float | None = None
    """Stop the simulated clock here; requests still in flight are reported unfinished."""
    # Metrics.
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    goodput: tuple[tuple[str, float], ...] = ()
    """SLOs as (metric, seconds), metric one of ttft, tpot, e2el."""

    def __post_init__(self) -> None:
        for name, bounds in RANGES.items():
            value = getattr(self, name)
            if value is not None:
                bounds.check(name, value)
        self._check_choices()
        self._check_load()
        if self.num_prefixes != 1 and not self.prefix_len:
            raise InputError(f"--num-prefixes {self.num_prefixes} needs --prefix-len (the shared prefixes' length)")
        if self.output_lag and not self.async_scheduling:
            raise InputError("--output-lag needs --async-scheduling (an overlap loop's outputs wait for the step it "
                             "launched next)")
        self._check_turns()
        check_fleet(self)
        self._check_speculation()
        build_policy(self)  # the policy's name, and what that policy refuses of these settings
        self._check_kv_offload()
        self._check_workload_source()
        if self.trace is None:
            self._check_synthetic_workload()
        self._check_metrics()

    def _check_choices(self) -> None:
        if self.cost not in ("measured", "roofline"):
            raise InputError(f"unknown --cost {quote(self.cost)} (choose from measured, roofline)")
        if self.quantization not in (None, *QUANTIZATIONS):
            raise InputError(f"unknown --quantization {quote(self.quantization)} "
                             f"(choose from {', '.join(QUANTIZATIONS)})")
        if self.backend not in BACKENDS:
            raise InputError(f"unknown --backend {quote(self.backend)} (choose from {', '.join(BACKENDS)})")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(f"unknown --kv-cache-dtype {quote(self.kv_cache_dtype)} "
                             f"(choose from {', '.join(KV_CACHE_DTYPES)})")

    def _check_speculation(self) -> None:
        method, k = self.speculative_method, self.num_speculative_tokens
        if method is None:
            for name in SPECULATION_SETTINGS:
                if getattr(self, name) is not None:
                    raise InputError(f"{flag(name)} applies only with --speculative-method")
            return
        if method not in SPECULATIVE_METHODS:
            raise InputError(f"unknown --speculative-method {quote(method)} "
                             f"(choose from {', '.join(SPECULATIVE_METHODS)})")
        if k is None:
            raise InputError(f"--speculative-method {method} needs --num-speculative-tokens (draft tokens per step)")
        if self.spec_acceptance is None:
            raise InputError(f"--speculative-method {method} needs --spec-acceptance (the probability that a draft "
                             "token is accepted, per position)")
        spec_acceptance(self.spec_acceptance, k)
        if method == "draft" and self.draft_model is None:
            raise InputError("--speculative-method draft needs --draft-model (the model that drafts)")
        if method != "draft" and self.draft_model is not None:
            raise InputError(f"--draft-model applies only to --speculative-method draft, not {method}")
        if not build_policy(self).speculates:
            raise InputError(f"--speculative-method {method} does not apply to --policy {self.policy}: its padded "
                             "batch advances every row a token a step")

    @property
    def speculates(self) -> bool:
        """Does every decode step draft tokens (a method, and k above 0)?"""
        return self.speculative_method is not None and bool(self.num_speculative_tokens)

    def _check_kv_offload(self) -> None:
        """The host tier holds blocks the prefix cache evicted, and is read by its hits: refused
        where there are none."""
        if not self.kv_offload_gb:
            if self.kv_offload_bandwidth is not None:
                raise InputError(f"--kv-offload-bandwidth {self.kv_offload_bandwidth:g} needs --kv-offload-gb "
                                 "(the host tier whose loads cross that link)")
            return
        given = f"--kv-offload-gb {self.kv_offload_gb:g}"
        if not self.enable_prefix_caching:
            raise InputError(f"{given} needs prefix caching: the host tier holds the blocks the prefix cache "
                             "evicts (drop --no-enable-prefix-caching)")
        if not build_policy(self).prefix_hits:
            raise InputError(f"{given} does not apply to --policy {self.policy}, which takes no prefix-cache hits")
        if is_fleet(self):
            raise InputError(f"{given} runs on one server (drop --num-replicas, or --prefill-replicas and "
                             "--decode-replicas)")

    def _check_load(self) -> None:
        """A finite --rate with --concurrency caps an open loop; sessions pace their own turns, take no cap."""
        if self.capped_open_loop and self.num_turns > 1:
            raise InputError(f"--num-turns {self.num_turns} paces its own turns; it takes no --max-concurrency cap "
                             "on an open loop")

    @property
    def capped_open_loop(self) -> bool:
        """An open loop of `rate` with at most `concurrency` requests in flight (`vllm bench serve
        --request-rate R --max-concurrency N`); with `rate` inf it is a closed loop of `concurrency`."""
        return self.concurrency is not None and self.rate is not None and math.isfinite(self.rate)

    def _check_turns(self) -> None:
        if self.think_time and self.num_turns == 1:
            raise InputError(f"--think-time {self.think_time:g} needs --num-turns above 1 (the time between turns)")
        if self.num_turns > 1 and self.duration is not None:
            raise InputError("--num-turns counts --num-requests requests; it does not take --duration")

    def _check_workload_source(self) -> None:
        """Refuse what would be recorded as applied without having been: a synthetic workload's
        settings beside a trace, a seed nothing draws from beside one, or a trace's speed without one."""
        if self.trace is None:
            if self.trace_speed != DEFAULTS["trace_speed"]:
                raise InputError(f"--trace-speed {self.trace_speed:g} applies only to a --trace replay")
            return
        for name in SYNTHETIC_SETTINGS:
            value = getattr(self, name)
            if value != DEFAULTS[name]:
                raise InputError(f"{flag(name)} {shorten(str(value))} does not apply to --trace, which replays the "
                                 "trace's own arrivals and lengths")
        draws = self.priority_levels is not None or (self.router == "random" and is_fleet(self))
        if self.seed != DEFAULTS["seed"] and not draws:
            raise InputError(f"--seed {self.seed} seeds nothing beside --trace, which replays the trace's own arrivals "
                             "and lengths (a seed draws --priority-levels and --router random)")

    def _check_synthetic_workload(self) -> None:
        """What the workload builder would refuse, said with the flags (it names its arguments)."""
        if self.concurrency is not None and self.rate is None and self.burstiness != DEFAULTS["burstiness"]:
            raise InputError(f"--burstiness {self.burstiness:g} shapes an open loop's arrivals (--rate); "
                             "a closed loop (--concurrency) has none")
        if self.burstiness != DEFAULTS["burstiness"] and (self.rate is None or math.isinf(self.rate)):
            raise InputError(f"--burstiness {self.burstiness:g} shapes the gaps between arrivals and needs a finite "
                             "--rate: with all requests at once (--rate inf, the default) there are none")
        if self.duration is not None:
            if self.concurrency is not None and self.rate is None:
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
        if self.num_dataset_entries is not None and (self.prefix_len or self.num_turns > 1):
            raise InputError("--num-dataset-entries pools whole prompts; it takes no --prefix-len or --num-turns")
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
                raise InputError(f"unknown --goodput metric {quote(metric)} (choose from {', '.join(GOODPUT_METRICS)})")
            if not 0 < limit <= MAX_SECONDS:
                raise InputError(f"--goodput {metric}:{limit * 1e3:g} ms must be > 0 and at most "
                                 f"{MAX_SECONDS * 1e3:g} ms")
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


# The fleet's settings checked together: colocated replicas or prefill/decode pools, not both, and
# each pool setting only where it applies.
POOL_SETTINGS = ("prefill_tensor_parallel_size", "decode_tensor_parallel_size", "prefill_data_parallel_size",
                 "decode_data_parallel_size", "prefill_enable_expert_parallel", "decode_enable_expert_parallel",
                 "prefill_gpu", "decode_gpu", "kv_transfer_bandwidth", "kv_transfer_latency")
"""Settings that apply only to prefill/decode pools."""


def disaggregated(config: RunConfig) -> bool:
    return config.prefill_replicas is not None


def pool_parallelism(config: RunConfig, role: str) -> tuple[int, bool]:
    """The data-parallel attention ranks of each worker of pool `role` (prefill or decode) and
    whether its experts are spread (expert parallelism): the pool's own settings, else the run's."""
    dp = getattr(config, f"{role}_data_parallel_size")
    ep = getattr(config, f"{role}_enable_expert_parallel")
    return (config.data_parallel_size if dp is None else dp,
            config.enable_expert_parallel if ep is None else ep)


def is_fleet(config: RunConfig) -> bool:
    """More than one server: replicas, or prefill/decode pools."""
    return config.num_replicas > 1 or disaggregated(config)


def check_fleet(config: RunConfig) -> None:
    if config.router not in ROUTERS:
        raise InputError(f"unknown --router {quote(config.router)} (choose from {', '.join(ROUTERS)})")
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
    for role in ("prefill", "decode"):
        dp, ep = pool_parallelism(config, role)
        if dp > 1 and not ep:
            asked = (f"--{role}-data-parallel-size" if getattr(config, f"{role}_data_parallel_size") is not None
                     else "--data-parallel-size")
            raise InputError(f"{asked} {dp} prices data-parallel attention with expert parallelism: add "
                             f"--{role}-enable-expert-parallel or --enable-expert-parallel (dense models: more "
                             f"--{role}-replicas)")
    for name in ("prefill_gpu", "decode_gpu"):
        if getattr(config, name) is not None:
            try:
                profile_dir(getattr(config, name))
            except InputError as exc:
                raise InputError(f"{flag(name)}: {exc}") from None
