"""The physical range of every number-valued setting, checked alike for the command line, sweep files
and `RunConfig`, and how a message names a setting and quotes a bad value."""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import InputError

# Physical limits of the ranges below: past them a value is a typo, not a deployment.
MAX_TOKENS = 10**7
"""Tokens any one length may take: past every model's context window."""
MAX_SEQUENCES = 10**7
"""Sequences in one step or clients of a closed loop."""
MAX_COUNT = 2**31 - 1
"""Requests, KV blocks and priority levels: the step log counts them as int32."""
MAX_SECONDS = 1e7
"""Any one time (about 116 days): there the clock's float64 still resolves nanoseconds."""
MAX_GPUS = 1024
"""GPUs one server's tensor parallelism spans: past any NVLink domain."""
MAX_SERVERS = 10**5
"""Replicas of a fleet, or servers of a pool: as many GPUs as the largest clusters hold."""
MAX_DRAFT_TOKENS = 32
"""Draft tokens one speculative step verifies: EAGLE trees and n-gram lookups propose far fewer."""
QUOTED_CHARACTERS = 80
"""A message quotes at most this much of a bad value."""


def flag(name: str) -> str:
    """The command-line flag of setting `name`."""
    return f"--{name.replace('_', '-')}"


def shorten(text: str) -> str:
    """`text` cut to `QUOTED_CHARACTERS`, as a message quotes a value."""
    return text if len(text) <= QUOTED_CHARACTERS else f"{text[:QUOTED_CHARACTERS - 3]}..."


def quote(value: object) -> str:
    return shorten(repr(value))


@dataclass(frozen=True)
class Range:
    """A number-valued setting's type and physical range: [low, high], or (low, high] when
    `low_open`; infinity only where `inf` says what it stands for. A bool is no number here."""

    kind: type[int] | type[float]
    low: float
    high: float
    unit: str = ""
    low_open: bool = False
    inf: str = ""

    def describe(self) -> str:
        if self.kind is int:
            text = f"an integer in [{self.low}, {self.high}]"
        else:
            text = f"a number in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        return text + (f" {self.unit}" if self.unit else "") + (f", or inf ({self.inf})" if self.inf else "")

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if self.inf and value == math.inf:
            return True
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high  # nan is neither

    def check(self, name: str, value: object) -> None:
        if not self.holds(value):
            raise InputError(f"{flag(name)} must be {self.describe()}, got {quote(value)}")

    def parse(self, name: str, value: object) -> int | float:
        """Setting `name`'s value from command-line text or a YAML/TOML scalar, typed and checked."""
        if isinstance(value, str):
            try:
                value = self.kind(value.strip())
            except ValueError:  # not a number, or an integer of more digits than Python converts
                raise InputError(f"{flag(name)} must be {self.describe()}, got {quote(value)}") from None
        self.check(name, value)
        assert isinstance(value, (int, float))  # `check` took it
        return float(value) if self.kind is float else value


def _tokens(low: int = 1) -> Range:
    return Range(int, low, MAX_TOKENS, "tokens")


def _seconds(low_open: bool = False) -> Range:
    return Range(float, 0.0, MAX_SECONDS, "seconds", low_open=low_open)


RANGES: dict[str, Range] = {
    "tensor_parallel_size": Range(int, 1, MAX_GPUS, "GPUs"), "data_parallel_size": Range(int, 1, MAX_GPUS, "ranks"),
    "max_num_seqs": Range(int, 1, MAX_SEQUENCES, "sequences"),
    "max_num_batched_tokens": _tokens(),
    "long_prefill_token_threshold": _tokens(low=0),
    "max_batch_size": Range(int, 1, MAX_SEQUENCES, "requests"),
    "max_queue_delay": _seconds(),
    "max_model_len": _tokens(),
    "block_size": _tokens(),
    "gpu_memory_utilization": Range(float, 0.0, 1.0, "of the GPU's memory", low_open=True),
    "num_gpu_blocks_override": Range(int, 1, MAX_COUNT, "blocks"),
    "rate": Range(float, 1e-6, 1e9, "requests/s", inf="all at once"),
    "burstiness": Range(float, 1e-3, 1e3, inf="evenly spaced"),
    "concurrency": Range(int, 1, MAX_SEQUENCES, "clients"),
    "num_requests": Range(int, 1, MAX_COUNT, "requests"),
    "duration": _seconds(low_open=True),
    "input_len": _tokens(),
    "num_dataset_entries": Range(int, 1, MAX_COUNT, "prompts"),
    "output_len": _tokens(),
    "trace_speed": Range(float, 1e-3, 1e3, "times the trace's pace"),
    "priority_levels": Range(int, 1, MAX_COUNT, "levels"),
    "prefix_len": _tokens(low=0),
    "num_prefixes": Range(int, 1, MAX_COUNT, "prefixes"),
    "num_turns": Range(int, 1, MAX_COUNT, "turns"),
    "think_time": _seconds(),
    "seed": Range(int, 0, 2**63 - 1),  # a sweep's Int64 column
    "num_replicas": Range(int, 1, MAX_SERVERS, "servers"),
    "prefill_replicas": Range(int, 1, MAX_SERVERS, "servers"),
    "decode_replicas": Range(int, 1, MAX_SERVERS, "servers"),
    "prefill_tensor_parallel_size": Range(int, 1, MAX_GPUS, "GPUs"),
    "decode_tensor_parallel_size": Range(int, 1, MAX_GPUS, "GPUs"),
    "prefill_data_parallel_size": Range(int, 1, MAX_GPUS, "ranks"),
    "decode_data_parallel_size": Range(int, 1, MAX_GPUS, "ranks"),
    "kv_transfer_bandwidth": Range(float, 1e-3, 1e6, "GB/s"),
    "kv_transfer_latency": _seconds(),
    "kv_offload_gb": Range(float, 0.0, 1e6, "GB"),
    "kv_offload_bandwidth": Range(float, 1e-3, 1e6, "GB/s"),
    "time_limit": _seconds(low_open=True),
    "num_speculative_tokens": Range(int, 0, MAX_DRAFT_TOKENS, "tokens"),
}
"""Every number-valued setting's range, checked for the command line, sweep files and `RunConfig` (None is not)."""


# Settings given as text: lists and SLOs.
def spec_acceptance(text: str, num_tokens: int) -> tuple[float, ...]:
    """`--spec-acceptance`: one probability for all `num_tokens` positions, or one per position."""
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise InputError(f"--spec-acceptance takes probabilities separated by commas, got {quote(text)}") from None
    if len(values) == 1:
        values *= num_tokens
    if len(values) != num_tokens:
        raise InputError(f"--spec-acceptance gives {len(values)} probabilities for --num-speculative-tokens "
                         f"{num_tokens} (give one, or one per position)")
    for value in values:
        if not 0 <= value <= 1:
            raise InputError(f"--spec-acceptance {value:g} is not a probability in [0, 1]")
    return values


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise InputError(f"--percentiles takes numbers separated by commas, got {quote(text)}") from None


def parse_goodput(specs: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """`ttft:500 tpot:50` (milliseconds, as `vllm bench serve --goodput`) to seconds."""
    slos = []
    for spec in " ".join(specs).replace(",", " ").split():
        metric, _, value = spec.partition(":")
        try:
            slos.append((metric, float(value) / 1e3))
        except ValueError:
            raise InputError(f"--goodput takes METRIC:MILLISECONDS, got {quote(spec)}") from None
    return tuple(slos)
