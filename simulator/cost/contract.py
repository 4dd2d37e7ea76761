"""What a cost model is: a step's shape in, seconds out.

A step is summarised by a `StepShape` (token and context totals, which is all any of the models
needs, so a step's cost never loops over its sequences). Every cost model offers `step_time`, the
array form `decode_step_times` for runs of decode-only steps (bit-identical to `step_time` called
step by step), `breakdown` (seconds per operator family), and its records: `extrapolated` (steps
priced beyond measured data, by reason) and `notes` (what its tables stood in for, at load).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol

import numpy as np


class StepShape(NamedTuple):
    """What one forward pass computes. Context counts include the tokens computed this step. (A
    named tuple: the engine builds one or two a step, and a tuple is built faster than a frozen
    dataclass.)"""

    num_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0
    """Sum over single-token rows of their context length."""
    prefill_seqs: int = 0
    prefill_tokens: int = 0
    prefill_context: int = 0
    """Sum over multi-token rows of their context length (KV the chunk attends to)."""
    prefill_pairs: float = 0.0
    """Sum over multi-token rows of query-key pairs under the causal mask: n * (c0 + (n + 1) / 2)."""
    spec_tokens: int = 0
    """Draft tokens verified beside the single-token rows (speculative decoding, k per row): each
    is a query over its row's context as the row's own token is (`decode_context` is then the
    contexts after all k + 1), and each is a row of the LM head and of sampling."""

    @property
    def num_tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens + self.spec_tokens

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, int]], decode_seqs: int = 0, decode_context: int = 0,
                  spec_tokens: int = 0) -> StepShape:
        """Build a shape from (new tokens, context after the step) per row, on top of `decode_seqs`
        single-token rows whose contexts sum to `decode_context` (and which verify `spec_tokens`
        draft tokens between them): `shape_from_rows`."""
        return shape_from_rows(rows, decode_seqs, decode_context, spec_tokens)


def shape_from_rows(rows: Iterable[tuple[int, int]], decode_seqs: int = 0, decode_context: int = 0,
                    spec_tokens: int = 0) -> StepShape:
    """`StepShape.from_rows` as a function, which a compiled caller (setup.py) calls directly rather
    than through the class's attributes."""
    prefill_seqs = prefill_tokens = prefill_context = 0
    prefill_pairs = 0.0
    for new, context in rows:
        if new == 1:
            decode_seqs += 1
            decode_context += context
        else:
            prefill_seqs += 1
            prefill_tokens += new
            prefill_context += context
            prefill_pairs += causal_pairs(new, context)
    return _new_shape(StepShape, (decode_seqs + prefill_seqs, decode_seqs, decode_context, prefill_seqs,
                                  prefill_tokens, prefill_context, prefill_pairs, spec_tokens))


_new_shape = tuple.__new__
"""A named tuple from all its fields in order, without the interpreted `__new__` that `StepShape(...)`
goes through (a compiled build, setup.py, calls it a few times a step)."""


def decode_shape(rows: int, context: int) -> StepShape:
    """A step of `rows` single-token rows whose contexts sum to `context`: `StepShape(rows, rows, context)`."""
    return _new_shape(StepShape, (rows, rows, context, 0, 0, 0, 0.0, 0))


def causal_pairs(new_tokens: float, context: float) -> float:
    """Query-key pairs of one sequence computing `new_tokens` whose context (after them) is `context`."""
    return new_tokens * (context - new_tokens + (new_tokens + 1) / 2)


class CostModel(Protocol):
    pure: bool
    """Pricing has no effect on the model's records, so an engine may price steps it will not run (a
    stretch of decode steps priced as one array and cut short). A model that counts the steps it
    extrapolated (`MeasuredCost`) is not pure: it is asked about exactly the steps that run."""

    def step_time(self, shape: StepShape) -> float: ...

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        """`step_time` of steps decoding `num_seqs` sequences whose contexts sum to each of `contexts`."""
        ...

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        """Seconds per operator family of one step; they sum to `step_time`."""
        ...

    @property
    def extrapolated(self) -> Mapping[str, int]: ...

    @property
    def notes(self) -> tuple[str, ...]: ...
