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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.parquet as pq

from simulator.engine.build import build_line
from simulator.errors import InputError
from simulator.metrics.tables import Columns
from simulator.outputs.locks import try_lock
from simulator.progress import Bar

if TYPE_CHECKING:
    import polars as pl

METADATA_KEY = b"servesim"
ROW_GROUP_ROWS = 1024 * 1024
"""pyarrow's default row group; tables are written one group at a time to show progress."""
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


@runtime_checkable
class StreamedTable(Protocol):
    """A table written to Parquet piece by piece, never whole in memory (the tokens table)."""

    @property
    def height(self) -> int: ...

    def write(self, path: Path, metadata: dict[bytes, bytes], progress: Callable[[int], None] | None) -> None: ...


def parquet_metadata(metadata: dict[str, Any]) -> dict[bytes, bytes]:
    """The run's settings as a Parquet file's key-value metadata, under b"servesim"."""
    return {METADATA_KEY: json.dumps(json_safe(metadata)).encode()}


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A scratch file beside `path` to write, renamed onto `path` when the block ends and removed
    if it raises (a full disk, an interrupt): the file is whole or not there, never half-written.
    It is opened by the caller as any file, so its mode is the umask's (0644 as a rule)."""
    partial = path.with_name(f".{path.name}.partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield partial
        os.replace(partial, path)
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc  # a write fault names no file
    finally:
        partial.unlink(missing_ok=True)


def write_parquet(frame: pl.DataFrame | Columns, path: Path, metadata: dict[str, Any],
                  progress: Callable[[int], None] | None = None) -> None:
    """Parquet with the run's settings in the file's key-value metadata under b"servesim", whole or
    not at all; `progress` is called with the rows written so far (the file is pq.write_table's)."""
    table = frame.to_arrow()
    table = table.replace_schema_metadata(parquet_metadata(metadata))
    # pyarrow reads a path it is given as a URI where it can ('out:1/x.parquet' has the scheme 'out'):
    # the file is opened as a local file, never parsed.
    with (atomic_file(path) as partial, pa.OSFile(str(partial), "wb") as sink,
          pq.ParquetWriter(sink, table.schema, use_dictionary=False) as writer):
        for offset in range(0, max(table.num_rows, 1), ROW_GROUP_ROWS):
            writer.write_table(table.slice(offset, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
            if progress is not None:
                progress(min(offset + ROW_GROUP_ROWS, table.num_rows))


def read_metadata(path: Path) -> dict[str, Any]:
    with pa.OSFile(str(path)) as source:  # a local file, as `write_parquet`'s
        raw = pq.read_schema(source).metadata or {}
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


def check_output_file(path: Path, flag: str) -> None:
    """Refuse, before any work, an output file's path that names a folder or whose folder takes no
    new files."""
    if path.is_dir():
        raise InputError(f"{flag} {str(path)!r} is a folder; give the name of the file to write in it")
    check_writable(path, flag)


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


def write_run(out: Path, tables: dict[str, pl.DataFrame | Columns | StreamedTable], summary: dict[str, Any],
              settings: dict[str, Any], *, progress: bool = False) -> None:
    """The run folder `out`, whole or not at all; `progress` draws a bar of rows written."""
    check_out_dir(out)
    bar = Bar(sum(frame.height for frame in tables.values()), desc="writing", unit="row", scale=True,
              enabled=progress)
    written = 0

    def advance(rows: int) -> None:
        bar.advance(written + rows)

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_scratch(out.parent)
        with scratch_dir(out) as scratch:
            metadata = {"settings": settings}
            for name, table in tables.items():
                if isinstance(table, StreamedTable):
                    table.write(scratch / f"{name}.parquet", parquet_metadata(metadata), advance)
                else:  # whole in memory: a polars frame or numpy columns
                    write_parquet(table, scratch / f"{name}.parquet", metadata, advance)
                written += table.height
            (scratch / "summary.json").write_text(
                json.dumps(json_safe({"settings": settings, "summary": summary,
                                      "provenance": {"engine_build": build_line()}}), indent=2) + "\n")
            if out.exists():
                out.rmdir()
            os.replace(scratch, out)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise InputError(f"cannot write {str(out)!r}: {exc.strerror or exc}{where}") from None
    finally:
        bar.close()
