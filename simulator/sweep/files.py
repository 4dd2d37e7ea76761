"""A sweep's file read back (`simulate report`, and a sweep resumed into its own `--out`): each row
a configuration's settings, its `config_id`, its `error` and the summary of its run
(`simulator.sweep.grid`). The file is untrusted: its ids must be distinct strings, and every column
a sweep writes must hold the type a sweep writes there (or only nulls), so that a resumed sweep can
merge its rows and a report draw them."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.config import RunConfig
from simulator.errors import InputError
from simulator.sweep.executors import setting_column

if TYPE_CHECKING:
    import polars as pl

# Sweep-wide settings: their values are lists themselves, so they cannot be axes.
SWEEP_WIDE = ("percentiles", "goodput")
AXIS_NAMES = tuple(name for name in RunConfig.field_names() if name not in SWEEP_WIDE)

NUMBERS = ("num_requests", "arrived", "completed", "unfinished", "preemptions", "num_steps", "kv_blocks",
           "kv_capacity_tokens", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
           "output_throughput", "total_token_throughput", "good_requests", "request_goodput", "utilisation",
           "queue_growth", "offered_rate", "cost_extrapolations")
"""Summary columns a sweep writes as numbers; the latency statistics (`LATENCY_STAT`) and the prefix
cache's counts and rates (`prefix_cache_*`) too."""
TEXTS = ("load", "cost_extrapolated", "cost_notes")
"""Summary columns a sweep writes as text; `kept_up` it writes as a boolean."""


def _setting_types() -> dict[str, tuple[type, bool]]:
    """Each axis setting's scalar type and whether it may be None."""
    hints = typing.get_type_hints(RunConfig)
    kinds = {}
    for name in AXIS_NAMES:
        hint = hints[name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        scalar = [a for a in args if a is not type(None)]
        assert len(scalar) == 1 and scalar[0] in (str, int, float, bool), f"{name}: {hint}"
        kinds[name] = (scalar[0], type(None) in args)
    return kinds


SETTING_TYPES = _setting_types()


def settings_schema() -> dict[str, Any]:
    """Settings columns keep their types in a row where every value is None (e.g. --rate none)."""
    import polars as pl

    dtypes = {str: pl.String, int: pl.Int64, float: pl.Float64, bool: pl.Boolean}
    schema: dict[str, Any] = {setting_column(name): dtypes[kind] for name, (kind, _) in SETTING_TYPES.items()}
    return schema | dict.fromkeys(SWEEP_WIDE, pl.String) | {"config_id": pl.String, "error": pl.String}


def column_problem(name: str, dtype: pl.DataType, schema: dict[str, Any]) -> str | None:
    """What is wrong with a column of a sweep file of this name and type, or None."""
    import polars as pl

    if dtype == pl.Null:
        return None
    want = schema.get(name)
    if want is not None:
        ok = dtype == want or (want == pl.Float64 and dtype.is_numeric()) or (want == pl.Int64 and dtype.is_integer())
        return None if ok else f"column {name} holds {dtype}, not {want}"
    from simulator.metrics.summary import LATENCY_STAT  # numpy and the engine's log: only when a file is read

    numeric = name in NUMBERS or name.startswith("prefix_cache_") or LATENCY_STAT.fullmatch(name)
    if numeric and not dtype.is_numeric():
        return f"column {name} holds {dtype}, not numbers"
    if name in TEXTS and dtype != pl.String:
        return f"column {name} holds {dtype}, not text"
    if name == "kept_up" and dtype != pl.Boolean:
        return f"column {name} holds {dtype}, not true or false"
    return None


def check_sweep_rows(rows: pl.DataFrame, subject: str) -> None:
    """Refuse rows no sweep writes: `subject` starts the error line."""
    import polars as pl

    for name in ("config_id", "error"):
        if name not in rows.columns:
            raise InputError(f"{subject} is not a sweep file (no {name} column)")
    ids = rows["config_id"]
    if ids.dtype != pl.String or ids.null_count() or ids.n_unique() != rows.height:
        raise InputError(f"{subject} is not a sweep file (its config_id column is not one distinct text per row)")
    schema = settings_schema()
    for name, dtype in rows.schema.items():
        problem = column_problem(name, dtype, schema)
        if problem is not None:
            raise InputError(f"{subject} is not a sweep file: {problem}")


def read_sweep_file(path: Path, subject: str) -> pl.DataFrame:
    """A sweep's rows, checked; `subject` starts the error line (the quoted path, or how --out came
    to be read)."""
    import polars as pl

    try:
        rows = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError):
        raise InputError(f"{subject} is not a Parquet file") from None
    check_sweep_rows(rows, subject)
    return rows


def read_part(path: Path) -> dict[str, Any] | None:
    """One committed row (`OUT.parts/CONFIG_ID.parquet`), or None where the file is not one row of a
    sweep with that id: that configuration runs again."""
    import polars as pl

    try:
        rows = pl.read_parquet(path)
        check_sweep_rows(rows, repr(str(path)))
    except (OSError, pl.exceptions.PolarsError, InputError):
        return None
    if rows.height != 1 or rows["config_id"][0] != path.stem:
        return None
    return rows.to_dicts()[0]
