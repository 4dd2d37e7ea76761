"""Token-length distributions for synthetic workloads, parsed from specs like "uniform:0.5"."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from simulator.errors import InputError, clip

#: Each kind with the default of its one parameter (None: the kind takes no parameter).
DEFAULT_PARAMS: dict[str, float | None] = {
    "fixed": None,
    "uniform": 0.5,
    "lognormal": 1.0,
    "exponential": None,
}
KIND_NAMES = ", ".join(DEFAULT_PARAMS)
#: Each kind as a spec, its parameter optional with its default: "uniform[:0.5]".
SPECS = ", ".join(kind if param is None else f"{kind}[:{param:g}]" for kind, param in DEFAULT_PARAMS.items())


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts around a mean given at sampling time.

    - fixed: every request gets the mean.
    - uniform: integers uniform over [round(mean*(1-r)), round(mean*(1+r))], r = param in [0, 1)
      (vllm bench's --random-range-ratio).
    - lognormal: sigma = param > 0 and mu = ln(mean) - sigma**2/2, so that the distribution's
      mean is the requested mean.
    - exponential: mean = the mean.

    Continuous draws are rounded to the nearest integer and any value below 1 becomes 1: a request
    always has at least one token. That shifts the realised mean up only when the mean is small
    next to the spread (e.g. an exponential with mean 3).
    """

    kind: str
    param: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in DEFAULT_PARAMS:
            raise InputError(f"unknown length distribution {clip(repr(self.kind))}; expected {KIND_NAMES}")
        takes_param = DEFAULT_PARAMS[self.kind] is not None
        if not takes_param:
            if self.param is not None:
                raise InputError(
                    f"length distribution {self.kind!r} takes no parameter, got {self.param}"
                )
            return
        if self.param is None or not math.isfinite(self.param):
            raise InputError(
                f"length distribution {self.kind!r} needs a finite parameter, got {self.param}"
            )
        if self.kind == "uniform" and not 0 <= self.param < 1:
            raise InputError(f"uniform range ratio must be in [0, 1), got {self.param}")
        if self.kind == "lognormal" and self.param <= 0:
            raise InputError(f"lognormal sigma must be > 0, got {self.param}")

    def sample(self, mean: int, n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """Draw `n` token counts (int64, each >= 1) whose distribution has mean `mean`."""
        if isinstance(mean, bool) or not isinstance(mean, (int, np.integer)) or mean < 1:
            raise InputError(f"mean token length must be an integer >= 1, got {mean!r}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise InputError(f"number of lengths to draw must be an integer >= 0, got {n!r}")
        mean = int(mean)
        if self.kind == "fixed":
            return np.full(n, mean, dtype=np.int64)
        if self.kind == "uniform":
            assert self.param is not None
            low = round(mean * (1 - self.param))
            high = round(mean * (1 + self.param))
            values = rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)
        elif self.kind == "lognormal":
            assert self.param is not None
            sigma = self.param
            draws = rng.lognormal(mean=math.log(mean) - sigma**2 / 2, sigma=sigma, size=n)
            values = _round_to_tokens(draws)
        else:
            values = _round_to_tokens(rng.exponential(scale=mean, size=n))
        return np.maximum(values, 1)


def _round_to_tokens(draws: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    # Lognormal tails can exceed int64 for absurd sigmas; cap far above any real context length.
    return np.rint(np.minimum(draws, 2.0**62)).astype(np.int64)


def parse_length_dist(spec: str) -> LengthDist:
    """Parse "fixed", "uniform[:RANGE_RATIO]", "lognormal[:SIGMA]" or "exponential"."""
    name, sep, raw_param = spec.strip().partition(":")
    name = name.strip().lower()
    if name not in DEFAULT_PARAMS:
        raise InputError(f"unknown length distribution {clip(repr(name))} in {clip(repr(spec))}; expected {KIND_NAMES}")
    if not sep:
        return LengthDist(name, DEFAULT_PARAMS[name])
    if DEFAULT_PARAMS[name] is None:
        raise InputError(f"length distribution {name!r} takes no parameter, got {clip(repr(spec))}")
    try:
        param = float(raw_param)
    except ValueError:
        raise InputError(f"bad parameter {clip(repr(raw_param))} in length distribution {clip(repr(spec))}") from None
    return LengthDist(name, param)
