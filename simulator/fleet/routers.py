"""Routers: which server of a pool a request goes to, decided when it arrives from live state.

A router is called with the pool's servers as `Load`s (what each holds at this instant) and the
request, and returns a server's index. Ties go to the lowest index.

- `round-robin`: servers in turn, one request each;
- `random`: uniform, drawn for every request id up front from the run's own seed stream (so the
  choice does not depend on the order in which requests reach the router);
- `least-loaded`: fewest waiting + running requests (join the shortest queue);
- `least-kv`: lowest share of the KV cache in use;
- `prefix-aware`: the server whose prefix cache holds the longest prefix of the request's prompt
  (`simulator.engine.kv`), ties by fewest waiting + running requests, then index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from simulator.engine.request import Request

ROUTERS = ("round-robin", "random", "least-loaded", "least-kv", "prefix-aware")
RANDOM_ROUTER_STREAM = 4
"""The router's stream among those spawned from the seed (arrivals and lengths 0-2, priorities 3);
its draws come from children of that stream (one per pool), so they are independent of the shared
prefixes' choice, which stream 4 itself draws."""


class Load(Protocol):
    """A server's state as a router sees it, at the routing instant."""

    @property
    def num_requests(self) -> int:
        """Requests waiting or running."""

    @property
    def kv_share(self) -> float:
        """Share of the KV blocks in use."""

    def cached_tokens(self, request: Request) -> int:
        """Tokens of the request's prompt its prefix cache would skip."""


Router = Callable[[Sequence[Load], Request], int]


@dataclass
class RoundRobin:
    turn: int = 0

    def __call__(self, servers: Sequence[Load], request: Request) -> int:
        index = self.turn % len(servers)
        self.turn += 1
        return index


@dataclass
class RandomChoice:
    choices: np.ndarray = field(repr=False)
    """The server of request i, drawn for every request id."""

    def __call__(self, servers: Sequence[Load], request: Request) -> int:
        return int(self.choices[request.id])


def least_loaded(servers: Sequence[Load], request: Request) -> int:
    loads = [server.num_requests for server in servers]
    return loads.index(min(loads))


def least_kv(servers: Sequence[Load], request: Request) -> int:
    shares = [server.kv_share for server in servers]
    return shares.index(min(shares))


def prefix_aware(servers: Sequence[Load], request: Request) -> int:
    ranks = [(-server.cached_tokens(request), server.num_requests) for server in servers]
    return ranks.index(min(ranks))


def planned_routes(router: Router, num_servers: int, num_requests: int) -> np.ndarray | None:
    """The server of each request, in arrival order, when `router` reads no state (round robin,
    random); None when it decides from the servers' state."""
    if isinstance(router, RoundRobin):
        return (np.arange(num_requests) + router.turn) % num_servers
    if isinstance(router, RandomChoice):
        return router.choices[:num_requests]
    return None


def build_router(name: str, num_servers: int, num_requests: int, seed: int, pool: int = 0) -> Router:
    """Router `name` for a pool of `num_servers`; `pool` (0 prefill or only, 1 decode) keeps the
    random draws of two pools apart."""
    if name == "round-robin":
        return RoundRobin()
    if name == "random":
        rng = np.random.default_rng(seed).spawn(RANDOM_ROUTER_STREAM + 1)[RANDOM_ROUTER_STREAM].spawn(2)[pool]
        return RandomChoice(rng.integers(0, num_servers, size=num_requests))
    if name == "least-loaded":
        return least_loaded
    if name == "least-kv":
        return least_kv
    if name == "prefix-aware":
        return prefix_aware
    raise ValueError(f"unknown router {name!r}")
