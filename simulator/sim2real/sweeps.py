"""Measured points rerun as the benchmark ran them: a sweep's concurrency levels back to back against
one server, its prefix cache kept between them.

aiconfigurator's benchmark templates (bench_run.sh.j2) run one aiperf invocation per concurrency
level, in ascending order, against the same server; each invocation draws its prompts from the same
seeded pool (`--num-dataset-entries`, `--random-seed`), so a level finds in the server's prefix
cache the prompts the levels before it sent (../shared/reference/serving/README.md). A rerun unit is
the points of one server (`server_key`): same stack and version, model, GPU, deployment and lengths.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from simulator.deploy.backends import BENCH_MAX_BATCH, bench_scheduler, stack_defaults
from simulator.run.clients import ClientRun
from simulator.sim2real.compare import DEFAULT_SCHEDULER, Scheduler, client_time, point_config, rerun
from simulator.sim2real.measured import MeasuredPoint
from simulator.sim2real.replay import Replay, replay_sweep
from workloads import Workload


@dataclass(frozen=True)
class Unit:
    """Points rerun together: one server's sweep, in the order it ran (ascending concurrency)."""

    points: tuple[MeasuredPoint, ...]


def server_key(point: MeasuredPoint) -> tuple[object, ...]:
    return (point.backend, point.backend_version, point.model, point.gpu, point.tensor_parallel_size,
            point.attention_dp_size, point.moe_ep_size, point.mode, point.prefill, point.decode,
            point.quantization, point.input_lens, point.output_lens)


def sweep_units(points: list[MeasuredPoint], together: bool = True) -> list[Unit]:
    """`points` grouped by server, each group in ascending concurrency (`together`), or one unit each."""
    if not together:
        return [Unit((p,)) for p in points]
    groups: dict[tuple[object, ...], list[MeasuredPoint]] = defaultdict(list)
    for point in points:
        groups[server_key(point)].append(point)
    return [Unit(tuple(sorted(g, key=lambda p: (p.concurrency or 0, p.name)))) for g in groups.values()]


def rerun_unit(unit: Unit, gpu: str, seed: int = 0, scheduler: Scheduler = DEFAULT_SCHEDULER) -> list[Replay]:
    """Each point of `unit` rerun on profile `gpu`: alone (one point, or an open loop), or its levels
    back to back on one server (a closed-loop sweep)."""
    points = unit.points
    if len(points) == 1 or any(p.concurrency is None or len(p.input_lens) > 1 or len(p.output_lens) > 1
                               for p in points):
        return [rerun(p, gpu, seed, scheduler) for p in points]
    clients = [ClientRun(int(p.concurrency or 1), p.warmup, p.num_requests, client_time(gpu)) for p in points]
    total = sum(c.warmup + c.measured for c in clients)
    first = points[0]
    workload = Workload(np.full(total, first.input_lens[0], np.int64), np.full(total, first.output_lens[0], np.int64),
                        None, max(c.concurrency for c in clients))
    return replay_sweep(point_config(first, gpu, seed, scheduler), clients, workload)


SCHEDULERS = ("vllm-default", "stock", "bench")


@dataclass(frozen=True)
class Hypothesis:
    """How the measured rows were run, as a rerun assumes it: the servers' scheduler (`vllm-default`:
    vLLM serve's H100 defaults for every stack, the replay as it was; `stock`: each stack's own,
    `simulator.deploy.backends`; `bench`: aiconfigurator's benchmark templates, budget max batch +
    isl + 1500), the client's prompt pool (aiperf's `--num-dataset-entries`; None: every prompt its
    own), whether a server's levels ran back to back (`sweep`) or each alone, cold, and whether its
    all-reduces were NCCL's (`disable_custom_all_reduce`: the custom all-reduce off), and whether
    the requests' output lengths spread around the row's (`output_spread`, below)."""

    scheduler: str = "vllm-default"
    num_dataset_entries: int | None = None
    sweep: bool = False
    disable_custom_all_reduce: bool = False
    output_spread: float = 0.0
    """Each request's output length drawn uniformly within +-`output_spread` of the row's (a
    fraction; seeded, rounded, at least 2 tokens); 0: every request exactly the row's, as aiperf
    sends them (`--osl-stddev 0`, `ignore_eos`). With exact lengths a closed loop of clients that
    start together stays in lockstep (`simulator.sim2real.replay`); a spread is the smallest change
    that lets it come apart, to test whether the measured servers' clients did (they need not have
    had a spread of their own: docs/validation/stack-fidelity.md)."""

    def __post_init__(self) -> None:
        if not 0 <= self.output_spread < 1:
            raise ValueError(f"output_spread {self.output_spread!r}: a fraction in [0, 1)")

    def scheduler_for(self, unit: Unit) -> Scheduler:
        first = unit.points[0]
        if self.scheduler == "vllm-default":
            scheduler = Scheduler(num_dataset_entries=self.num_dataset_entries)
        elif self.scheduler == "stock":
            scheduler = Scheduler.of(stack_defaults(first.backend), self.num_dataset_entries)
        else:
            most = max(BENCH_MAX_BATCH, *(p.concurrency or 1 for p in unit.points))
            scheduler = Scheduler.of(bench_scheduler(first.backend, first.input_lens[0], most),
                                     self.num_dataset_entries)
        return replace(scheduler, disable_custom_all_reduce=self.disable_custom_all_reduce)

    def sent(self, point: MeasuredPoint, seed: int = 0) -> MeasuredPoint:
        """`point` as its client sent it under this hypothesis (its output lengths spread, if so)."""
        return spread_outputs(point, self.output_spread, seed)

    def rerun(self, points: list[MeasuredPoint], gpu: str, seed: int = 0) -> list[tuple[MeasuredPoint, Replay]]:
        """Every point rerun on `gpu` as this hypothesis says, each with its Replay."""
        pairs: list[tuple[MeasuredPoint, Replay]] = []
        for unit in sweep_units(points, self.sweep):
            sent = Unit(tuple(self.sent(p, seed) for p in unit.points))
            pairs += zip(unit.points, rerun_unit(sent, gpu, seed, self.scheduler_for(unit)), strict=True)
        return pairs


def spread_outputs(point: MeasuredPoint, spread: float, seed: int = 0) -> MeasuredPoint:
    """`point` with each request's own output length (warm-up first) drawn uniformly within
    +-`spread` of its fixed one (`Hypothesis.output_spread`); `point` itself when `spread` is 0 or it
    already lists each request's lengths."""
    if spread == 0 or len(point.output_lens) != 1:
        return point
    total = point.warmup + point.num_requests
    draws = np.random.default_rng([seed, total, point.output_lens[0]]).uniform(-spread, spread, total)
    lengths = np.maximum(2, np.rint(point.output_lens[0] * (1 + draws))).astype(np.int64)
    return replace(point, output_lens=tuple(int(n) for n in lengths))


SUPPORTED = {"vllm": Hypothesis("bench"), "sglang": Hypothesis("stock", disable_custom_all_reduce=True),
             "trtllm": Hypothesis("bench")}
"""Per stack, the hypothesis aiconfigurator's silicon rows support best (docs/validation/stack-fidelity.md):
vLLM and TensorRT-LLM with the templates' token budget (TensorRT-LLM's stock 8,192 tokens, decoders
included, holds an 8,192-token prompt only in a step with no decoder, which the measured TPOTs of
those rows refute), SGLang with its stock scheduler and NCCL's all-reduce (its decode steps are
short by the custom all-reduce's saving otherwise; vLLM's and TensorRT-LLM's rows reject it); no
prompt pool, no cache hits."""
