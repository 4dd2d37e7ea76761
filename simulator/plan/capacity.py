"""A deployment's capacity: the highest arrival rate at which every SLO holds.

A probe simulates the deployment at one rate and judges it: every SLO met, nothing left unfinished,
and the server not overloaded (`simulator.metrics.summary.load_state`; an overloaded probe fails
whatever its percentiles say). Every probe of every deployment sends the same request stream (the
same seed: gamma gaps scale with the rate, so the arrivals of rate 2R are those of R at half the
time; comparisons between deployments and rates are paired). The search brackets the capacity,
growing or shrinking the rate by `GROWTH` from a start, then bisects it (geometric midpoints) until
the bracket is at most `PRECISION` wide: `max_rate` is the highest rate that passed, the bracket's
top the lowest that failed.

The analytic bound caps what a deployment can serve without simulating it: a server emits at most
its largest batch's tokens per decode step (the batch held by `--max-num-seqs`, KV memory and,
under a TPOT or ITL limit, the largest batch whose decode step fits the limit, Little's law for
the requests decoding at once), and prefills at most its token budget per step; its request rate is
at most the lower of the two. `BOUND_SLACK` covers what the bound leaves out.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.plan.slo import Slos

GROWTH = 1.5
"""Factor between bracketing probes."""
PRECISION = 0.05
"""The bracket's top is at most this share above `max_rate` when the search ends."""
MIN_TAIL_REQUESTS = 10
"""Requests beyond the tightest percentile an SLO names, per simulated server: a p99 rests on 10 of 1,000."""
MIN_REQUESTS = 400
"""Requests per simulated server at the least, so that the load verdict has a window to judge."""
MAX_PROBES = 16
FLOOR = 1e-3
"""The search gives up below this share of its start: no load meets the SLOs."""
BOUND_SLACK = 1.2
CLOSE = 0.1
"""A pass whose statistic is within this share of its limit is a close decision (see `probe`)."""


def requests_for(slos: Slos, servers: int) -> int:
    """Requests a probe sends: enough for the tail each SLO names on each of `servers` servers."""
    per_server = max(MIN_REQUESTS, math.ceil(MIN_TAIL_REQUESTS / max(1 - slos.tail, 1e-6)))
    return per_server * servers


@dataclass(frozen=True)
class Probe:
    rate: float
    met: bool
    overloaded: bool
    values: dict[str, float]
    """Each SLO's statistic (seconds; `slo_attainment` a share)."""
    output_throughput: float
    request_throughput: float
    mean_e2el: float
    stopped_at: int = 0
    """Requests finished when the probe stopped, its failure certain (`simulator.plan.early`); 0: it ran to the end."""

    @property
    def tokens_per_user(self) -> float:
        """Output tokens/s per request in flight (Little's law: rate x mean E2EL requests in flight), as
        `vllm bench sweep plot_pareto` divides output throughput by the users."""
        users = self.request_throughput * self.mean_e2el
        return self.output_throughput / users if users > 0 else math.nan

    def scaled(self, factor: float) -> Probe:
        """The same probe for `factor` identical servers each seeing this stream (throughputs scale)."""
        return replace(self, rate=self.rate * factor, output_throughput=self.output_throughput * factor,
                       request_throughput=self.request_throughput * factor)


def probe(settings: dict[str, Any], slos: Slos, rate: float, num_requests: int, seeds: int = 1) -> Probe:
    """Simulate `settings` at `rate` with `num_requests` requests and judge it against `slos`. A pass
    that comes within `CLOSE` of a limit is run again on the next `seeds` - 1 seeds and stands only if
    every one passes; the probe keeps the first seed's values (its rerun reproduces them)."""
    first = probe_seed(settings, slos, rate, num_requests)
    if first.met and seeds > 1 and settings.get("trace") is None and slos.close(first.values, CLOSE):
        for extra in range(1, seeds):
            if not probe_seed(settings | {"seed": settings["seed"] + extra}, slos, rate, num_requests).met:
                return replace(first, met=False)
    return first


@functools.lru_cache(maxsize=16)
def trace_rate(path: str, limit: int) -> float:
    """Requests/s of the first `limit` requests of trace `path` as it was recorded."""
    from workloads import read_trace

    arrival = read_trace(path, limit=limit).arrival
    if arrival is None or len(arrival) < 2 or not arrival[-1] > arrival[0]:
        raise InputError(f"--trace {path!r} has no arrival times to scale: a plan needs an open-loop trace")
    return (len(arrival) - 1) / float(arrival[-1] - arrival[0])


def load_settings(settings: dict[str, Any], rate: float, num_requests: int) -> dict[str, Any]:
    """The settings that send `rate` req/s: --rate, or for a trace the --trace-speed that scales its
    own arrivals to that rate."""
    if settings.get("trace") is None:
        return {"rate": rate, "num_requests": num_requests}
    return {"trace_speed": rate / trace_rate(settings["trace"], num_requests), "num_requests": num_requests}


def probe_seed(settings: dict[str, Any], slos: Slos, rate: float, num_requests: int, early: bool = True) -> Probe:
    """One run judged; with `early`, stopped as soon as its failure is certain (`simulator.plan.early`)."""
    from simulator.metrics.summary import build_tables, summarize
    from simulator.plan.early import VerdictCertain, watched_clients
    from simulator.run.clients import workload_clients
    from simulator.run.simulate import simulate

    config = RunConfig(**settings | load_settings(settings, rate, num_requests)
                       | {"percentiles": slos.percentiles(), "goodput": slos.goodput})
    try:
        result = simulate(config, clients=watched_clients(slos) if early else workload_clients)
    except VerdictCertain as stop:
        return Probe(rate, False, False, dict.fromkeys(slos.measure_names(), math.nan), math.nan, math.nan, math.nan,
                     stopped_at=stop.finished)
    summary = summarize(result, build_tables(result, tokens=False))
    values = slos.measure(summary)
    overloaded = summary["kept_up"] is False
    met = slos.met(values) and not overloaded and summary["unfinished"] == 0
    return Probe(rate, met, overloaded, values, summary["output_throughput"], summary["request_throughput"],
                 summary["mean_e2el"] if summary["mean_e2el"] is not None else math.nan)


@dataclass
class Capacity:
    max_rate: float
    """The highest rate that passed (0 when none did)."""
    failed_rate: float | None
    """The lowest rate that failed above it (None: none failed, or the bound stood in)."""
    at: Probe | None
    """The probe at `max_rate`."""
    probes: list[Probe] = field(default_factory=list)
    note: str = ""

    def scaled(self, factor: float, note: str) -> Capacity:
        return Capacity(self.max_rate * factor, None if self.failed_rate is None else self.failed_rate * factor,
                        None if self.at is None else self.at.scaled(factor), [], note)


def find_capacity(run: Callable[[float], Probe], start: float, ceiling: float = math.inf,
                  precision: float = PRECISION, passed: Probe | None = None) -> Capacity:
    """Bracket then bisect the highest passing rate of `run`, starting at `start`, or growing from
    `passed` (a probe already met); rates above `ceiling` (a throughput bound) fail without a probe."""
    if not start > 0:
        raise InputError(f"a capacity search needs a positive start rate, got {start}")
    probes: list[Probe] = [passed] if passed is not None else []

    def judge(rate: float) -> Probe:
        result = run(rate)
        probes.append(result)
        return result

    low: Probe | None = None
    high: float | None = None
    first = passed if passed is not None else judge(min(start, ceiling))
    if first.met:
        low = first
        while len(probes) < MAX_PROBES:
            rate = low.rate * GROWTH
            if rate > ceiling:
                high = ceiling if ceiling > low.rate else None
                break
            result = judge(rate)
            if not result.met:
                high = rate
                break
            low = result
    else:
        high = first.rate
        while len(probes) < MAX_PROBES and high > start * FLOOR:
            result = judge(high / GROWTH)
            if result.met:
                low = result
                break
            high = result.rate
    if low is None:
        return Capacity(0.0, high, None, probes, "no rate tried met the SLOs")
    while high is not None and high > low.rate * (1 + precision) and len(probes) < MAX_PROBES:
        result = judge(math.sqrt(low.rate * high))
        if result.met:
            low = result
        else:
            high = result.rate
    return Capacity(low.rate, high, low, probes)


def server_bound(settings: dict[str, Any], slos: Slos, role: str = "replica") -> float:
    """Requests/s one server of `settings` can serve at the most (see the module docstring); `role`
    prefill or decode for a pool's server, which does only that part. Infinite where the workload is
    not synthetic (a trace, sessions): no bound is claimed."""
    from simulator.cost.contract import StepShape, causal_pairs
    from simulator.deploy.hardware import load_gpu
    from simulator.deploy.model import load_model
    from simulator.run.pools import pool_configs
    from simulator.run.sizing import kv_cache_blocks

    config = RunConfig(**settings)
    if config.trace is not None or config.num_turns > 1:
        return math.inf
    from simulator.cost import build_cost_model

    index = {"prefill": 0, "decode": -1}.get(role, 0)
    server = pool_configs(config)[index][2]
    model, gpu = load_model(server.model), load_gpu(server.gpu)
    cost = build_cost_model(server, model, gpu)
    prompt, output = server.input_len, server.output_len
    held = server.prefix_len + prompt + output
    blocks = kv_cache_blocks(server, model, gpu, server.prefix_len + prompt)
    batch = max(1, min(server.max_num_seqs, blocks * server.block_size // held))
    context = server.prefix_len + prompt + output / 2

    def decode_step(b: int) -> float:
        return cost.step_time(StepShape(b, b, int(b * context)))

    limits = [slo.limit for slo in slos.limits if slo.metric in ("tpot", "itl") and slo.quantile >= 0.5]
    limits += [limit for metric, limit in slos.goodput if metric == "tpot"]
    if limits:
        limit = min(limits) * BOUND_SLACK
        low, high = 1, batch
        if decode_step(1) > limit:
            return 0.0
        while low < high:  # the largest batch whose decode step fits the limit
            middle = (low + high + 1) // 2
            low, high = (middle, high) if decode_step(middle) <= limit else (low, middle - 1)
        batch = low
    decode_rate = batch / ((output - 1) * decode_step(batch)) if output > 1 else math.inf
    prompts = max(1, server.max_num_batched_tokens // max(prompt, 1))
    prefill = StepShape(prompts, 0, 0, prompts, prompts * prompt, prompts * (server.prefix_len + prompt),
                        prompts * causal_pairs(prompt, server.prefix_len + prompt))
    prefill_rate = prompts / cost.step_time(prefill)
    rate = {"prefill": prefill_rate, "decode": decode_rate}.get(role, min(prefill_rate, decode_rate))
    return rate * BOUND_SLACK


def deployment_bound(settings: dict[str, Any], slos: Slos) -> float:
    """Requests/s the whole deployment can serve at the most: its servers' bounds summed, the lower
    pool's for prefill/decode pools."""
    if settings.get("prefill_replicas") is not None:
        return min(settings["prefill_replicas"] * server_bound(settings, slos, "prefill"),
                   settings["decode_replicas"] * server_bound(settings, slos, "decode"))
    return settings.get("num_replicas", 1) * server_bound(settings, slos)
