"""The policy registry: a policy is one module and one registry line, and what it reads (its
`SETTINGS`) is all the config needs to refuse a setting it would ignore."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import pytest

import policies
from policies.continuous import ContinuousBatching
from simulator.config import RunConfig
from simulator.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def test_every_policy_reads_only_run_settings() -> None:
    for name, module in policies.POLICIES.items():
        assert module.SETTINGS, name
        assert set(module.SETTINGS) <= set(RunConfig.field_names()), name


def test_no_policy_imports_the_config() -> None:
    """The config asks the registry which settings each policy reads, so the policies sit below it."""
    for path in (ROOT / "policies").glob("*.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom)}
        assert "simulator.config" not in imported, path.name


def test_a_policy_registered_in_one_line_gets_the_unused_settings_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module reading only the token budget: its registry line alone makes the config refuse the
    settings it ignores, and hold it to vLLM's budget rule."""
    module = types.SimpleNamespace(SETTINGS=("max_num_batched_tokens",),
                                   build=lambda s: ContinuousBatching(s.max_num_seqs, s.max_num_batched_tokens))
    monkeypatch.setitem(policies.POLICIES, "budget-only", module)  # type: ignore[arg-type]
    assert RunConfig(policy="budget-only", max_num_batched_tokens=4096).unused_settings() == []
    config = RunConfig(policy="budget-only", max_batch_size=8, long_prefill_token_threshold=64, priority_levels=2)
    assert config.unused_settings() == ["long_prefill_token_threshold", "max_batch_size", "priority_levels"]
    with pytest.raises(InputError, match="--max-num-batched-tokens 8 must be >= --max-num-seqs 16"):
        RunConfig(policy="budget-only", max_num_batched_tokens=8, max_num_seqs=16)


def test_an_unknown_policy_is_refused_with_the_registered_names() -> None:
    names = ", ".join(policies.POLICIES)
    with pytest.raises(InputError, match=f"^unknown policy 'fifo' \\(choose from {names}\\)$"):
        RunConfig(policy="fifo")
