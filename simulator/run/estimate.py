"""The size of what a run or a batch table is about to build, from its settings alone, before
anything is built: requests, steps, table rows and servers, and the memory they hold at the least.

Each figure is a lower bound (a step emits at most one token per sequence it runs; a request
holds at least its workload row, its state and its requests-table row), so a refusal is never
wrong about a run that would have fit. Past this machine's memory the settings are refused in one
line naming the flag that asked, unless the user says `--force`. A batch table's sizes are held
to their physical ranges instead: its rows are small, but a step of a billion sequences is a typo.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from simulator.config import RunConfig, disaggregated, pool_parallelism
from simulator.errors import InputError
from simulator.ranges import MAX_SEQUENCES, MAX_TOKENS, Range
from simulator.run.simulate import DEFAULT_NUM_REQUESTS

# Bytes each thing holds at the least (rounded down from what a run of this code holds).
BYTES_PER_REQUEST = 500
"""A request's workload row, its state while it runs and its requests-table row."""
BYTES_PER_STEP = 100
"""A step's log entry and its steps-table row."""
BYTES_PER_TOKEN_ROW = 24
"""A tokens-table row held in memory (request id, index, time), where the table is not streamed."""
BYTES_PER_SERVER = 4000
"""A server's scheduler, queues and KV accounting."""
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
"""Where a container's memory limit is read (cgroup v2, v1)."""


@dataclass(frozen=True)
class Estimate:
    """What a run builds at the least."""

    requests: int
    output_tokens: int
    steps: int
    token_rows: int
    """Rows of the tokens table held in memory at once (0 where it is streamed to its file)."""
    servers: int

    @property
    def per_request_bytes(self) -> int:
        return self.requests * BYTES_PER_REQUEST

    @property
    def per_token_bytes(self) -> int:
        return self.steps * BYTES_PER_STEP + self.token_rows * BYTES_PER_TOKEN_ROW

    @property
    def server_bytes(self) -> int:
        return self.servers * BYTES_PER_SERVER

    @property
    def bytes(self) -> int:
        return self.per_request_bytes + self.per_token_bytes + self.server_bytes


def estimate_run(config: RunConfig, *, token_rows: bool) -> Estimate:
    """The least a run of `config` builds; `token_rows` when its tokens table is held in memory
    (a vLLM result file or a sweep's tables), not streamed. A trace's requests count only as far as
    --num-requests says: its reader holds the rest to its own account."""
    servers = (sum(getattr(config, f"{role}_replicas") * pool_parallelism(config, role)[0]
                   for role in ("prefill", "decode")) if disaggregated(config) else config.num_replicas)
    if config.trace is not None:
        requests, output_len = config.num_requests or 0, 1
    else:
        requests, output_len = synthetic_requests(config), config.output_len
    output_tokens = requests * output_len
    # A step emits at most one token per sequence it runs, and one request's tokens come one step apart.
    per_step = max(config.max_num_seqs, config.max_batch_size)
    steps = max(math.ceil(output_tokens / per_step), output_len if requests else 0)
    return Estimate(requests, output_tokens, steps, output_tokens if token_rows else 0, servers)


def synthetic_requests(config: RunConfig) -> int:
    """Requests a synthetic workload sends: --num-requests, or about --rate x --duration."""
    if config.num_requests is not None:
        return config.num_requests
    if config.duration is not None and config.rate is not None and (config.concurrency is None
                                                                     or config.capped_open_loop):
        return math.ceil(config.rate * config.duration)
    return DEFAULT_NUM_REQUESTS


def machine_memory_bytes() -> int:
    """Memory this process may use: the machine's, or its container's limit where lower."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_LIMITS:
        try:
            memory = min(memory, int(path.read_text().strip()))
        except (OSError, ValueError):  # no such limit, or "max"
            continue
    return memory


def asked_by(config: RunConfig, estimate: Estimate) -> str:
    """The settings that asked for the largest share of `estimate`, as the user typed them."""
    if estimate.server_bytes >= estimate.per_request_bytes + estimate.per_token_bytes:
        if config.prefill_replicas is not None:
            return f"--prefill-replicas {config.prefill_replicas} and --decode-replicas {config.decode_replicas}"
        return f"--num-replicas {config.num_replicas}"
    if config.num_requests is None and config.duration is not None:
        asked = f"--duration {config.duration:g} at --rate {config.rate:g}"
    else:
        asked = f"--num-requests {config.num_requests or DEFAULT_NUM_REQUESTS}"
    if estimate.per_token_bytes > estimate.per_request_bytes and config.trace is None:
        asked += f" with --output-len {config.output_len}"
    return asked


def check_run_size(config: RunConfig, *, token_rows: bool, force: bool) -> Estimate:
    """Refuse, unless `force`, a run whose least memory is past this machine's; the estimate otherwise."""
    estimate = estimate_run(config, token_rows=token_rows)
    memory = machine_memory_bytes()
    if estimate.bytes > memory and not force:
        servers = f", {estimate.servers:,} servers" if estimate.servers > 1 else ""
        rows = f", {estimate.token_rows:,} tokens-table rows" if estimate.token_rows else ""
        raise InputError(
            f"{asked_by(config, estimate)} asks for {estimate.requests:,} requests{servers}{rows} and at least "
            f"{estimate.steps:,} steps: {estimate.bytes / 1e9:,.1f} GB of memory or more, past this machine's "
            f"{memory / 1e9:,.1f} GB; ask for less, or add --force to try anyway")
    return estimate



BATCH = Range(int, 1, MAX_SEQUENCES, "sequences")
"""A batch table's --batch: the sequences of one step, as --max-num-seqs counts them."""
CONTEXT = Range(int, 1, MAX_TOKENS, "tokens")


def check_batch_table(context: int, batches: list[int]) -> None:
    """Refuse a batch table's --context or --batch outside its physical range: each row builds a step
    of `batch` sequences, so past the most a step may hold a row would only fill memory."""
    CONTEXT.check("context", context)
    for batch in batches:
        BATCH.check("batch", batch)
