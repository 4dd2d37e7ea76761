"""The cost of a speculative decoding step: the target's verify pass and the draft's proposals.

The verify pass is the step's own shape: every decoding sequence computes its token and the k
draft tokens it verifies (`StepShape.spec_tokens`), in the GEMMs, the LM head and sampling, and in
attention as queries over its context. The proposals come from the drafter
(`simulator.deploy.model.draft_model`), priced by the same kind of cost model on the same GPU:

- ngram: a lookup in the request's own tokens, which vLLM's n-gram proposer runs on the host
  between steps: no GPU time, and none is priced;
- eagle, mtp, draft: the drafter (an EAGLE head: one decoder layer of the target's shapes; an MTP
  layer; a draft model) runs k passes at one token per decoding sequence, each with its LM head and
  sampling, over contexts one token longer each pass; the first pass also computes the step's prompt
  tokens, since the drafter keeps KV of its own for every prompt. Its passes carry no host overhead
  of their own (they run inside the step's, as vLLM captures them in CUDA graphs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from simulator.cost.contract import CostModel, StepShape


class SpeculativeCost:
    """A step's time under speculative decoding: `target`'s for the step's shape (the verify pass)
    plus `draft`'s k proposal passes (none for n-gram drafts: `draft` None)."""

    def __init__(self, target: CostModel, draft: CostModel | None, num_tokens: int) -> None:
        self.target, self.draft, self.num_tokens = target, draft, num_tokens
        self.pure = target.pure and (draft is None or draft.pure)

    def draft_time(self, shape: StepShape) -> float:
        """The drafter's k passes for the step's verifying sequences (and its prompts, in the first)."""
        if self.draft is None:
            return 0.0
        k = self.num_tokens
        verifying = shape.spec_tokens // k
        # `decode_context` sums the verifying rows' contexts after their k + 1 tokens (and those of
        # single-token prompt rows, rare enough to ride along); pass j drafts token j + 1 after a
        # row's own, over a context k - j tokens shorter.
        total = 0.0
        for j in range(k if verifying else 1):
            pass_shape = StepShape(verifying, verifying, shape.decode_context - verifying * (k - j) if verifying else 0)
            if j == 0 and shape.prefill_seqs:
                pass_shape = StepShape(verifying + shape.prefill_seqs, verifying, pass_shape.decode_context,
                                       *shape[3:7])
            total += self.draft.step_time(pass_shape)
        return total

    def step_time(self, shape: StepShape) -> float:
        return self.target.step_time(shape) + self.draft_time(shape)

    def decode_step_times(self, num_seqs: int, contexts: np.ndarray) -> np.ndarray:
        return np.array([self.step_time(StepShape(num_seqs, num_seqs, int(c))) for c in contexts], dtype=np.float64)

    def breakdown(self, shape: StepShape) -> dict[str, float]:
        return self.target.breakdown(shape) | {"draft": self.draft_time(shape)}

    @property
    def extrapolated(self) -> Mapping[str, int]:
        counts = Counter(self.target.extrapolated)
        if self.draft is not None:
            counts.update({f"draft {family}": n for family, n in self.draft.extrapolated.items()})
        return counts

    @property
    def notes(self) -> tuple[str, ...]:
        drafted = () if self.draft is None else tuple(f"draft: {note}" for note in self.draft.notes)
        return tuple(self.target.notes) + drafted
