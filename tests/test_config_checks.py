"""RunConfig's number-valued settings: one range table (`RANGES`) refuses a bool, a value of the wrong
type and a value outside the setting's physical range, each with the same one line naming the flag
and the value; every number-valued field has an entry."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from typing import Any

import pytest

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.ranges import RANGES, flag

POSITIVE = ["tensor_parallel_size", "max_num_seqs", "max_batch_size", "block_size", "input_len", "output_len",
            "num_prefixes", "num_turns", "num_replicas"]
POOLS = {"prefill_replicas": 1, "decode_replicas": 1}


def refused(name: str, value: object) -> str:
    """The line RunConfig refuses `value` of setting `name` with, as a regular expression."""
    line = f"{flag(name)} must be {RANGES[name].describe()}, got {value!r}"
    return f"^{re.escape(line)}$"


def test_every_number_valued_setting_has_a_range() -> None:
    hints = typing.get_type_hints(RunConfig)
    scalars = {f.name: typing.get_args(hints[f.name]) or (hints[f.name],) for f in dataclasses.fields(RunConfig)
               if typing.get_origin(hints[f.name]) is not tuple}  # percentiles and SLOs are checked as lists
    numbers = {name for name, kinds in scalars.items() if set(kinds) & {int, float}}
    assert numbers == set(RANGES)


@pytest.mark.parametrize("name", POSITIVE)
@pytest.mark.parametrize("value", [True, 2.0, 0])
def test_a_positive_integer_setting_refuses_a_bool_a_float_and_zero(name: str, value: object) -> None:
    # Keep the budget above max_num_seqs, so that only the setting under test is wrong.
    settings: dict[str, Any] = {name: value, "max_num_batched_tokens": 8192}
    with pytest.raises(InputError, match=refused(name, value)):
        RunConfig(**settings)


@pytest.mark.parametrize("name", ["prefill_replicas", "decode_replicas", "prefill_tensor_parallel_size",
                                  "decode_tensor_parallel_size"])
@pytest.mark.parametrize("value", [False, 1.0, 0])
def test_a_pool_size_refuses_a_bool_a_float_and_zero(name: str, value: object) -> None:
    with pytest.raises(InputError, match=refused(name, value)):
        RunConfig(**(POOLS | {name: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["prefix_len", "seed"])
@pytest.mark.parametrize("value", [True, 1.0, -1, 2**63])
def test_a_count_from_zero_refuses_a_bool_a_float_a_negative_and_2_to_the_63(name: str, value: object) -> None:
    with pytest.raises(InputError, match=refused(name, value)):
        RunConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value"), [
    ("input_len", 2**63), ("num_requests", 2**63), ("max_num_seqs", 10**8), ("num_gpu_blocks_override", 2**31),
    ("max_queue_delay", 1e308), ("max_queue_delay", math.nan), ("think_time", math.inf), ("duration", 1e308),
    ("gpu_memory_utilization", 0.0), ("gpu_memory_utilization", -0.5), ("gpu_memory_utilization", math.nan),
    ("gpu_memory_utilization", 1.01), ("rate", 1e-300), ("rate", 0.0), ("rate", math.nan), ("burstiness", 1e-300),
    ("time_limit", 0.0), ("time_limit", 1e300), ("trace_speed", math.inf),
])
def test_a_value_outside_its_physical_range_is_refused(name: str, value: object) -> None:
    pools = POOLS if name.startswith("kv_transfer") else {}
    with pytest.raises(InputError, match=refused(name, value)):
        RunConfig(**(pools | {name: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value"), [("kv_transfer_bandwidth", 1e-300), ("kv_transfer_bandwidth", math.inf),
                                             ("kv_transfer_latency", 1e308), ("kv_transfer_latency", -1.0)])
def test_a_link_outside_its_physical_range_is_refused(name: str, value: float) -> None:
    with pytest.raises(InputError, match=refused(name, value)):
        RunConfig(**(POOLS | {name: value}))  # type: ignore[arg-type]


def test_infinity_is_taken_where_it_means_something() -> None:
    assert RunConfig(rate=math.inf).rate == math.inf  # all at once
    assert RunConfig(rate=4.0, burstiness=math.inf).burstiness == math.inf  # evenly spaced


def test_integers_at_their_least_are_taken() -> None:
    config = RunConfig(**dict.fromkeys(POSITIVE, 1), prefix_len=0, seed=0)  # type: ignore[arg-type]
    assert config.max_num_seqs == 1 and config.seed == 0


def test_a_long_value_is_quoted_in_at_most_80_characters() -> None:
    with pytest.raises(InputError) as caught:
        RANGES["input_len"].parse("input_len", "9" * 5000)
    quoted = str(caught.value).partition("got ")[2]
    assert len(quoted) == 80 and quoted.startswith("'999") and quoted.endswith("...")
