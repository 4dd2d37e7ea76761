"""The deployments a plan searches: every run setting fixed or a list (as a sweep takes them), and
for the settings not given, what a vLLM user would try on at most `max_gpus` GPUs: tensor-parallel
sizes, continuous and chunked batching, token budgets, sequence caps, fp8 weights, replicas behind
routers (prefix-aware where prompts share prefixes), and prefill/decode pools (the decode pool on
each GPU type given, as aiconfigurator's `--decode-system`).

A deployment that cannot run (weights that do not fit, a budget continuous batching refuses) is
kept with the reason, never raised.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from simulator.config import DEFAULTS, RunConfig
from simulator.errors import InputError
from simulator.sweep.grid import config_id

SEARCHED: dict[str, list[Any]] = {
    "policy": ["continuous", "chunked"],
    "max_num_batched_tokens": [512, 2048, 8192],
    "max_num_seqs": [32, 64, 128, 256, 1024],
    "quantization": [None, "fp8"],
}
"""Scheduler and weight settings searched unless given: vLLM's defaults (8,192 tokens, 1,024
sequences) and the smaller budgets and caps that hold a TPOT limit."""
ROUTERS = ("round-robin", "random", "least-loaded")
"""Routers searched for replicas unless --router is given (prefix-aware added for shared prefixes)."""
POOL_TENSOR_PARALLEL = (1, 2)
"""Tensor-parallel sizes of prefill and decode servers searched unless given."""
POOL_SIZES = ("prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size", "decode_tensor_parallel_size",
              "prefill_gpu", "decode_gpu")
FLEET_SETTINGS = ("num_replicas", "router", *POOL_SIZES)
WORKLOAD_SETTINGS = ("rate", "num_requests", "duration", "percentiles", "goodput")
"""Settings a probe sets itself."""


@dataclass(frozen=True)
class Deployment:
    """One deployment: the run settings that make it (without the load) and the GPUs it takes."""

    settings: dict[str, Any]

    @property
    def disaggregated(self) -> bool:
        return self.settings.get("prefill_replicas") is not None

    @property
    def gpus(self) -> int:
        s = self.settings
        if self.disaggregated:
            return sum(count for _, count in self.pool_gpus())
        return s["num_replicas"] * s["tensor_parallel_size"]

    def pool_gpus(self) -> list[tuple[str, int]]:
        """(GPU type, count) of each pool: one entry for replicas, prefill then decode for P/D pools."""
        s = self.settings
        if not self.disaggregated:
            return [(s["gpu"], self.gpus)]
        tp, dp = s["tensor_parallel_size"], s.get("data_parallel_size") or 1
        return [(s.get(f"{role}_gpu") or s["gpu"], s[f"{role}_replicas"] * (s.get(f"{role}_tensor_parallel_size") or tp)
                 * (s.get(f"{role}_data_parallel_size") or dp)) for role in ("prefill", "decode")]

    @property
    def servers(self) -> int:
        s = self.settings
        if not self.disaggregated:
            return s["num_replicas"]
        dp = s.get("data_parallel_size") or 1
        return sum(s[f"{role}_replicas"] * (s.get(f"{role}_data_parallel_size") or dp)
                   for role in ("prefill", "decode"))

    @property
    def key(self) -> str:
        return config_id(self.settings)

    @property
    def server(self) -> Deployment:
        """One server of this deployment alone (its replicas' scheduler, TP and GPU)."""
        return Deployment(self.settings | {"num_replicas": 1, "router": "round-robin"})


def powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def server_settings(fixed: dict[str, Any], axes: dict[str, list[Any]], max_gpus: int) -> list[dict[str, Any]]:
    """Every single-server combination: the axes given, else `SEARCHED` and TP sizes up to `max_gpus`."""
    searched: dict[str, list[Any]] = dict(SEARCHED) | {"tensor_parallel_size": powers_of_two(max_gpus)}
    names = [name for name in searched if name not in fixed]
    names += [name for name in axes if name not in searched and name not in FLEET_SETTINGS]
    lists: list[list[Any]] = [axes.get(name, searched.get(name, [])) for name in names]
    base = {k: v for k, v in DEFAULTS.items() if k not in WORKLOAD_SETTINGS} | fixed
    servers, refused = [], None
    for values in itertools.product(*lists):
        settings = base | dict(zip(names, values, strict=True)) | {"num_replicas": 1, "router": "round-robin"}
        for name in POOL_SIZES:
            settings[name] = None
        if settings["policy"] != "static" and settings["max_num_seqs"] > settings["max_num_batched_tokens"]:
            refused = refused or settings  # vLLM refuses it; not a deployment anyone would try
            continue
        servers.append(settings)
    if not servers and refused is not None:
        raise InputError(f"nothing to plan: every server has --max-num-seqs above --max-num-batched-tokens (such as "
                         f"{refused['max_num_seqs']} > {refused['max_num_batched_tokens']} with --policy "
                         f"{refused['policy']}), which vLLM refuses; raise the budget or lower --max-num-seqs")
    return servers


def replica_fleets(server: dict[str, Any], axes: dict[str, list[Any]], max_gpus: int, all_sizes: bool
                   ) -> list[Deployment]:
    """`server` replicated: the replica counts given, else the most that fit `max_gpus` (every count
    when `all_sizes`), behind each router given or searched."""
    tp = server["tensor_parallel_size"]
    most = max_gpus // tp
    counts = axes.get("num_replicas") or (list(range(2, most + 1)) if all_sizes else [most])
    return [Deployment(server | {"num_replicas": count, "router": router})
            for count in counts if 1 < count and count * tp <= max_gpus for router in routers_for(server, axes)]


def routers_for(server: dict[str, Any], axes: dict[str, list[Any]]) -> list[str]:
    """The routers given, else `ROUTERS` (and prefix-aware where prompts share prefixes)."""
    return axes.get("router") or [*ROUTERS, *(["prefix-aware"] if server.get("prefix_len") else [])]


def symmetric(settings: dict[str, Any]) -> bool:
    """Whether k replicas behind the random router each see what one replica at R/k sees: a Poisson
    stream of independent requests, which random routing thins into Poisson streams (not a trace,
    gamma gaps of another shape, or a concurrency cap)."""
    return settings.get("trace") is None and settings["burstiness"] == 1.0 and settings.get("concurrency") is None


def pool_fleets(server: dict[str, Any], axes: dict[str, list[Any]], max_gpus: int, all_sizes: bool,
                gpu_types: list[str] | None = None) -> list[Deployment]:
    """Prefill/decode pools of `server`'s scheduler: each pool's servers and TP (given, else searched)
    filling `max_gpus` (or every size when `all_sizes`). The prefill pool runs on `server`'s GPU, the
    decode pool on each of `gpu_types` (the plan's --gpu types; --prefill-gpu and --decode-gpu where given)."""
    deployments = []
    prefill_tps = axes.get("prefill_tensor_parallel_size") or list(POOL_TENSOR_PARALLEL)
    decode_tps = axes.get("decode_tensor_parallel_size") or list(POOL_TENSOR_PARALLEL)
    own = server["gpu"]
    prefill_gpus = axes.get("prefill_gpu") or [own]
    decode_gpus = axes.get("decode_gpu") or gpu_types or [own]
    for prefill_tp, decode_tp, prefill_gpu, decode_gpu in itertools.product(prefill_tps, decode_tps, prefill_gpus,
                                                                           decode_gpus):
        on = {"prefill_gpu": None if prefill_gpu == own else prefill_gpu,
              "decode_gpu": None if decode_gpu == own else decode_gpu}
        for prefill in axes.get("prefill_replicas") or range(1, max_gpus):
            for decode in axes.get("decode_replicas") or range(1, max_gpus):
                gpus = prefill * prefill_tp + decode * decode_tp
                if gpus > max_gpus or (not all_sizes and gpus != max_gpus and "prefill_replicas" not in axes):
                    continue
                deployments.append(Deployment(server | {
                    "num_replicas": 1, "router": (axes.get("router") or ["round-robin"])[0],
                    "prefill_replicas": prefill, "decode_replicas": decode,
                    "prefill_tensor_parallel_size": prefill_tp, "decode_tensor_parallel_size": decode_tp} | on))
    return deployments


def refusal(deployment: Deployment) -> str | None:
    """Why `deployment` cannot run (its settings refused, weights or a request that never fit), or None."""
    from simulator.deploy.hardware import load_gpu
    from simulator.deploy.model import load_model
    from simulator.run.pools import build_pools
    from simulator.run.simulate import build_workload

    try:
        load = {"num_requests": 64} | ({"rate": 1.0} if deployment.settings.get("trace") is None else {})
        config = RunConfig(**deployment.settings | load)
        unused = config.unused_settings()
        if unused:
            return f"--policy {config.policy} does not use {', '.join(unused)}"
        build_pools(config, load_model(config.model), load_gpu(config.gpu), build_workload(config))
    except InputError as exc:
        return str(exc)
    return None
