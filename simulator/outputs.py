"""Writing a run: requests, tokens and steps as Parquet, the summary as JSON, settings attached.

A run folder is written in a scratch folder beside it and renamed into place at the end, so a
failure never leaves a half-written run behind. The writer holds a lock on its scratch folder, so
one killed mid-write (SIGKILL, out of memory) leaves a folder whose lock died with it, and the next
write into the same parent folder removes it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from simulator.errors import InputError
from simulator.locks import try_lock

METADATA_KEY = b"servesim"
SCRATCH_SUFFIX = ".scratch"


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


def write_parquet(frame: pl.DataFrame, path: Path, metadata: dict[str, Any]) -> None:
    """Parquet with the run's settings in the file's key-value metadata under b"servesim"."""
    table = frame.to_arrow()
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(json_safe(metadata)).encode()})
    partial = path.with_name(f".{path.name}.partial")
    path.parent.mkdir(parents=True, exist_ok=True)
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
    check_writable(out, "--out")


def check_writable(path: Path, flag: str, *, inside: bool = False) -> None:
    """Refuse, before any work, a path (a folder to write `inside`) whose nearest existing folder
    takes no new files."""
    folder = path if inside else path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"cannot write {flag} {str(path)!r}: {str(folder)!r} is not a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".servesim-probe-", dir=folder))
    except OSError as exc:
        raise InputError(f"cannot write {flag} {str(path)!r}: the folder {str(folder)!r} takes no new files "
                         f"({exc.strerror})") from None


@contextmanager
def scratch_dir(out: Path) -> Iterator[Path]:
    """A hidden folder beside `out`, locked while this process writes in it, removed on failure.

    It is made by mkdir (so its mode is the umask's, 0755 as a rule, not mkdtemp's 0700) under a
    name no cleaner touches, locked, and only then given the name cleaners look for.
    """
    pending = out.parent / f".{out.name}.{secrets.token_hex(4)}"
    pending.mkdir()
    fd = os.open(pending, os.O_RDONLY | os.O_DIRECTORY)
    try:
        locked = try_lock(fd)
        assert locked, f"{pending} was locked by another process as it was made"
        scratch = pending.rename(pending.with_name(pending.name + SCRATCH_SUFFIX))
        try:
            yield scratch
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    finally:
        os.close(fd)


def remove_stale_scratch(folder: Path) -> None:
    """Remove the scratch folders of writers that died mid-write: no live process holds their lock."""
    for scratch in folder.glob(f".*{SCRATCH_SUFFIX}"):
        try:
            fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue  # gone meanwhile, or not a folder
        try:
            if try_lock(fd):
                shutil.rmtree(scratch, ignore_errors=True)
        finally:
            os.close(fd)


def write_run(out: Path, tables: dict[str, pl.DataFrame], summary: dict[str, Any],
              settings: dict[str, Any]) -> None:
    """The run folder `out`, whole or not at all."""
    check_out_dir(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_scratch(out.parent)
        with scratch_dir(out) as scratch:
            metadata = {"settings": settings}
            for name, frame in tables.items():
                write_parquet(frame, scratch / f"{name}.parquet", metadata)
            (scratch / "summary.json").write_text(
                json.dumps(json_safe({"settings": settings, "summary": summary}), indent=2) + "\n")
            if out.exists():
                out.rmdir()
            os.replace(scratch, out)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise InputError(f"cannot write {str(out)!r}: {exc.strerror or exc}{where}") from None
