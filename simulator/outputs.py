"""Writing a run: requests, tokens and steps as Parquet, the summary as JSON, settings attached.

A run folder is written in a scratch folder beside it and renamed into place at the end, so a
failure never leaves a half-written run behind.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from simulator.errors import InputError

METADATA_KEY = b"servesim"


def json_safe(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null and the string "inf"."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


TableWriter = Callable[[Path, dict[bytes, bytes]], None]
"""Writes one table to a Parquet path with the given key-value metadata (for tables streamed to disk)."""


def parquet_metadata(metadata: dict[str, Any]) -> dict[bytes, bytes]:
    """The run's settings as a Parquet file's key-value metadata, under b"servesim"."""
    return {METADATA_KEY: json.dumps(json_safe(metadata)).encode()}


def write_parquet(frame: pl.DataFrame, path: Path, metadata: dict[str, Any]) -> None:
    """Parquet with the run's settings in the file's key-value metadata under b"servesim"."""
    table = frame.to_arrow()
    table = table.replace_schema_metadata(parquet_metadata(metadata))
    partial = path.with_name(f".{path.name}.partial")
    try:
        pq.write_table(table, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def read_metadata(path: Path) -> dict[str, Any]:
    raw = pq.read_schema(path).metadata or {}
    return json.loads(raw[METADATA_KEY]) if METADATA_KEY in raw else {}


def default_run_dir(root: Path, label: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    candidate = root / f"{stamp}-{label}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = root / f"{stamp}-{label}-{suffix}"
    return candidate


def check_out_dir(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {str(out)!r} already exists and is not an empty folder")


def write_run(out: Path, tables: dict[str, pl.DataFrame | TableWriter], summary: dict[str, Any],
              settings: dict[str, Any]) -> None:
    check_out_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        metadata = {"settings": settings}
        for name, table in tables.items():
            if isinstance(table, pl.DataFrame):
                write_parquet(table, scratch / f"{name}.parquet", metadata)
            else:
                table(scratch / f"{name}.parquet", parquet_metadata(metadata))
        (scratch / "summary.json").write_text(
            json.dumps(json_safe({"settings": settings, "summary": summary}), indent=2) + "\n")
        if out.exists():
            out.rmdir()
        os.replace(scratch, out)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
