"""A run's three tables, as polars frames: one row per request, per output token, per step."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass
class Tables:
    requests: pl.DataFrame
    tokens: pl.DataFrame
    steps: pl.DataFrame
