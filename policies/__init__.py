"""Scheduling policies: one module each, registered here by name (a new policy is one module plus
one line below). A policy module has

- `SETTINGS`: the run settings it reads that not every policy reads. A run refuses such a setting
  moved from its default under a policy that does not list it (`RunConfig.unused_settings`).
- `build(settings)`: the policy for a run's settings (`policies.settings.RunSettings`), refusing
  those it cannot run with.

A policy is called with a read-only view of the engine before every forward pass and returns the
step (`simulator.engine.step`)."""

from __future__ import annotations

from typing import Protocol

from policies import chunked, continuous, inflight, prefill_first, priority, shortest_prompt_first, static
from policies.settings import RunSettings
from simulator.engine.step import Policy
from simulator.errors import InputError, clip


class PolicyModule(Protocol):
    """A policy's module, as the registry reads it (see above)."""

    @property
    def SETTINGS(self) -> tuple[str, ...]: ...
    def build(self, settings: RunSettings) -> Policy: ...


POLICIES: dict[str, PolicyModule] = {
    "static": static,
    "continuous": continuous,
    "chunked": chunked,
    "priority": priority,
    "prefill-first": prefill_first,
    "inflight": inflight,
    "shortest-prompt-first": shortest_prompt_first,
}
ENABLE_CHUNKED_PREFILL = "chunked"
"""The policy vLLM's `--enable-chunked-prefill` stands for."""


def build_policy(settings: RunSettings) -> Policy:
    """The policy `settings` name, built from them; refuses an unknown name and settings it cannot run with."""
    if settings.policy not in POLICIES:
        raise InputError(f"unknown policy {clip(repr(settings.policy))} (choose from {', '.join(POLICIES)})")
    module = POLICIES[settings.policy]
    if "max_num_batched_tokens" in module.SETTINGS and settings.max_num_batched_tokens < settings.max_num_seqs:
        # vLLM refuses this too: a decode step of every running sequence would break the budget.
        raise InputError(f"--max-num-batched-tokens {settings.max_num_batched_tokens} must be >= --max-num-seqs "
                         f"{settings.max_num_seqs}")
    return module.build(settings)


def readers(setting: str) -> list[str]:
    """The policies that read `setting`, in registry order."""
    return [name for name, module in POLICIES.items() if setting in module.SETTINGS]
