"""Prefix-cache helpers of `simulator.engine.kv`: block keys, and a request's held runs."""

from __future__ import annotations

from simulator.engine.request import Request


def hold_run(request: Request, end: int, cached: bool) -> None:
    """The request now holds its blocks up to `end`, cached (in spans) or uncached copies."""
    runs = request.held_runs
    if runs is None:
        request.held_runs = [(end, cached)]
    elif runs[-1][1] == cached:
        runs[-1] = (end, cached)
    else:
        runs.append((end, cached))


def block_keys(content: tuple[tuple[int, int], ...], block_size: int) -> list[int]:
    """The keys of the full blocks of `content` (segments as (segment id, tokens)).

    Chained by segment: `chain` stands for everything before a segment (0 at the start, then
    hash((chain, segment, tokens)) after each); a block ending `offset` tokens into a segment has
    key hash((chain, segment)) + offset, which is thus a function of the whole prefix up to its last
    token, and a segment's keys are one range of integers (two segments' ranges overlap with odds
    of a 64-bit collision)."""
    keys: list[int] = []
    chain = position = 0
    for segment, length in content:
        base = hash((chain, segment))
        keys += range(base + block_size - position % block_size, base + length + 1, block_size)
        chain = hash((chain, segment, length))
        position += length
    return keys
