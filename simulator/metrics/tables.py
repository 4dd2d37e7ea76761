"""A run's three tables: one row per request, per output token, per step.

A run builds them as numpy columns (`Columns`), a null kept as NaN in the float columns the table
names nullable, and hands them out as polars frames only when asked for: a run that summarises
itself and writes its folder never loads polars, whose import is a large share of a run's start-up
(docs/performance.md, "After the third round"). A table that only exists as a frame (a fleet's,
whose columns polars adds) is read back into columns when they are asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa


class Columns:
    """One table as named numpy columns of equal length; in a column named in `nullable`, NaN
    stands for null (a request that never got a first token has a null TTFT). A column may be
    given as the function that makes it, called when the column is first read: a caller that reads
    a few columns of a 1M-request run's steps does not make the rest (each tens of MB)."""

    def __init__(self, columns: Mapping[str, np.ndarray | Callable[[], np.ndarray]],
                 nullable: frozenset[str] = frozenset(), height: int | None = None) -> None:
        self._sources = columns
        self._made: dict[str, np.ndarray] = {}
        self.names = tuple(columns)
        self.nullable = nullable
        lengths = {len(values) for values in columns.values() if not callable(values)}
        if height is not None:
            lengths.add(height)
        assert len(lengths) <= 1 and (lengths or not columns), f"columns of unequal or unknown length {lengths}"
        self.height = lengths.pop() if lengths else 0

    def __getitem__(self, name: str) -> np.ndarray:
        made = self._made.get(name)
        if made is None:
            source = self._sources[name]
            made = self._made[name] = source() if callable(source) else source
            assert len(made) == self.height, f"column {name} has {len(made)} rows, not {self.height}"
        return made

    def to_arrow(self) -> pa.Table:
        import pyarrow as pa

        return pa.table({name: pa.array(self[name], mask=np.isnan(self[name]) if name in self.nullable else None)
                         for name in self.names})

    def frame(self) -> pl.DataFrame:
        import polars as pl

        return pl.from_arrow(self.to_arrow())  # type: ignore[return-value]

    @classmethod
    def of_frame(cls, frame: pl.DataFrame) -> Columns:
        """A frame's columns; a float column's nulls as NaN."""
        columns = {name: frame[name].to_numpy() for name in frame.columns}
        nullable = frozenset(name for name in frame.columns if frame[name].null_count())
        return cls(columns, nullable)


class Tables:
    """A run's requests, tokens and steps tables, each given as `Columns` or as a polars frame;
    `.requests`, `.tokens` and `.steps` are frames (made on first use), `columns(name)` numpy."""

    NAMES = ("requests", "tokens", "steps")

    def __init__(self, requests: Columns | pl.DataFrame, tokens: Columns | pl.DataFrame,
                 steps: Columns | pl.DataFrame) -> None:
        self._given = {"requests": requests, "tokens": tokens, "steps": steps}
        self._frames: dict[str, pl.DataFrame] = {}
        self._columns: dict[str, Columns] = {}

    def columns(self, name: str) -> Columns:
        if name not in self._columns:
            given = self._given[name]
            self._columns[name] = given if isinstance(given, Columns) else Columns.of_frame(given)
        return self._columns[name]

    def frame(self, name: str) -> pl.DataFrame:
        if name not in self._frames:
            given = self._given[name]
            self._frames[name] = given.frame() if isinstance(given, Columns) else given
        return self._frames[name]

    def table(self, name: str) -> Columns | pl.DataFrame:
        """The table as given: what a run folder writes without a conversion."""
        return self._given[name]

    @property
    def requests(self) -> pl.DataFrame:
        return self.frame("requests")

    @property
    def tokens(self) -> pl.DataFrame:
        return self.frame("tokens")

    @property
    def steps(self) -> pl.DataFrame:
        return self.frame("steps")
