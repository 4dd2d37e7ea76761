"""RunConfig's integer settings: one check refuses a bool, a float and a value below the least, each
with the same one line naming the flag and the value."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.config import RunConfig
from simulator.errors import InputError

POSITIVE = ["tensor_parallel_size", "max_num_seqs", "max_batch_size", "block_size", "input_len", "output_len",
            "num_prefixes", "num_turns", "num_replicas"]
POOLS = {"prefill_replicas": 1, "decode_replicas": 1}


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("value", [True, 2.0, 0])
def test_a_positive_integer_setting_refuses_a_bool_a_float_and_zero(name: str, value: object) -> None:
    # Keep the budget above max_num_seqs, so that only the setting under test is wrong.
    settings: dict[str, Any] = {name: value, "max_num_batched_tokens": 8192}
    with pytest.raises(InputError, match=f"^--{name.replace('_', '-')} must be a positive integer, got {value!r}$"):
        RunConfig(**settings)


@pytest.mark.parametrize("name", ["prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size",
                                  "decode_tensor_parallel_size"])
@pytest.mark.parametrize("value", [False, 1.0, 0])
def test_a_pool_size_refuses_a_bool_a_float_and_zero(name: str, value: object) -> None:
    with pytest.raises(InputError, match=f"^--{name.replace('_', '-')} must be a positive integer, got {value!r}$"):
        RunConfig(**(POOLS | {name: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "wanted"), [("prefix_len", "an integer >= 0 tokens"), ("seed", "an integer >= 0")])
@pytest.mark.parametrize("value", [True, 1.0, -1])
def test_a_count_from_zero_refuses_a_bool_a_float_and_a_negative(name: str, wanted: str, value: object) -> None:
    with pytest.raises(InputError, match=f"^--{name.replace('_', '-')} must be {wanted}, got {value!r}$"):
        RunConfig(**{name: value})  # type: ignore[arg-type]


def test_integers_at_their_least_are_taken() -> None:
    config = RunConfig(**dict.fromkeys(POSITIVE, 1), prefix_len=0, seed=0)  # type: ignore[arg-type]
    assert config.max_num_seqs == 1 and config.seed == 0
