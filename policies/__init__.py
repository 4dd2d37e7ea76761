"""Scheduling policies: one module each, registered here by name (a new policy is one module plus
one line below). A policy is called with a read-only view of the engine before every forward pass
and returns the step."""

from __future__ import annotations

from collections.abc import Callable

from policies import chunked, continuous, priority, static
from simulator.config import RunConfig
from simulator.engine.step import Policy
from simulator.errors import InputError

POLICIES: dict[str, Callable[[RunConfig], Policy]] = {
    "static": static.build,
    "continuous": continuous.build,
    "chunked": chunked.build,
    "priority": priority.build,
}


def build_policy(config: RunConfig) -> Policy:
    if config.policy not in POLICIES:
        raise InputError(f"unknown policy {config.policy!r} (choose from {', '.join(POLICIES)})")
    return POLICIES[config.policy](config)
