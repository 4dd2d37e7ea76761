"""Sweeps: the cartesian product of run settings, one Parquet row per configuration.

A row holds the configuration's settings (the `RunConfig` names; `num_requests` and `duration`,
which the summary also uses, as `setting_num_requests` and `setting_duration`), its `config_id`
(a hash of the settings), `error` (None, or why it failed) and the summary metrics of a single
run under the same names. Each finished row is committed as its own small Parquet file in
`OUT.parts/`, and the `--out` file is rewritten from them atomically, so a sweep killed at any
moment leaves a readable `--out` and a rerun of the same command runs only what is missing.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click

from simulator.config import RunConfig
from simulator.errors import InputError, clip_path
from simulator.ranges import RANGES, parse_goodput, parse_percentiles, quote
from simulator.sweep.executors import Rows, WorkerDied, config_from_settings, run_local, run_ray
from simulator.sweep.files import AXIS_NAMES, SETTING_TYPES, SWEEP_WIDE, read_part, read_sweep_file, settings_schema

FLUSH_INTERVAL = 1.0
"""Seconds between rewrites of the --out file while rows come in (every row is committed at once)."""


def flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


BOOLEANS = {"true": True, "on": True, "yes": True, "false": False, "off": False, "no": False}


def parse_value(name: str, value: Any) -> Any:
    """One value of setting `name`, from command-line text or a YAML/TOML scalar; a number typed and
    range-checked by `RANGES`, as the command line of `simulate run` checks it."""
    kind, optional = SETTING_TYPES[name]
    if isinstance(value, str) and optional and value.strip().lower() in ("none", "null"):
        return None
    if value is None and optional:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in BOOLEANS:
            return BOOLEANS[value.strip().lower()]
        raise InputError(f"{flag(name)} takes true or false, got {quote(value)}")
    if name in RANGES:
        return RANGES[name].parse(name, value)
    if isinstance(value, str):
        return value.strip()
    raise InputError(f"{flag(name)} takes {kind.__name__} values, got {quote(value)}")


def setting_name(key: str) -> str:
    name = key.replace("-", "_").removeprefix("__")
    if name not in RunConfig.field_names():
        raise InputError(f"unknown setting {quote(key)} (a sweep takes the settings of `simulate run`)")
    return name


def check_name(name: str, value: Any) -> None:
    """Refuse an unknown name (policy, model, GPU, ...) before any configuration runs, as a value of
    the wrong type is; other settings are checked per configuration, where they meet the rest."""
    from simulator.deploy.hardware import load_gpu
    from simulator.deploy.model import load_model
    from simulator.fleet.routers import ROUTERS
    from workloads import parse_length_dist

    def trace_exists(path: str) -> None:
        if not Path(path).is_file():
            raise InputError(f"no such trace file {quote(path)}")

    def known_router(name: str) -> None:
        if name not in ROUTERS:
            raise InputError(f"unknown router (choose from {', '.join(ROUTERS)})")

    checks: dict[str, Callable[[Any], object]] = {
        "policy": lambda v: RunConfig(policy=v), "model": load_model, "gpu": load_gpu,
        "cost": lambda v: RunConfig(cost=v), "quantization": lambda v: RunConfig(quantization=v),
        "kv_cache_dtype": lambda v: RunConfig(kv_cache_dtype=v),
        "input_len_dist": parse_length_dist, "output_len_dist": parse_length_dist, "trace": trace_exists,
        "router": known_router}
    if name in checks and value is not None:
        try:
            checks[name](value)
        except InputError as exc:
            raise InputError(f"{flag(name)} lists {quote(value)}: {exc}") from None


@dataclass
class SweepSpec:
    """The settings of a sweep: values for every setting given (one or more), the rest default."""

    axes: dict[str, list[Any]]
    percentiles: str = "50,90,99"
    goodput: str = ""

    def __post_init__(self) -> None:
        for name, values in self.axes.items():
            if not values:
                raise InputError(f"{flag(name)} lists no values")
            seen = set()
            for value in values:
                if value in seen:
                    raise InputError(f"{flag(name)} lists {quote(value)} twice")
                seen.add(value)
                check_name(name, value)
        # Validates them once for every configuration, and writes them as RunConfig.to_dict does.
        canonical = RunConfig(percentiles=parse_percentiles(self.percentiles),
                              goodput=parse_goodput((self.goodput,))).to_dict()
        self.percentiles, self.goodput = canonical["percentiles"], canonical["goodput"]

    def settings(self) -> list[dict[str, Any]]:
        """Every configuration, the product of the axes in `RunConfig` field order."""
        defaults = {f.name: f.default for f in fields(RunConfig) if f.name not in SWEEP_WIDE}
        names = [name for name in AXIS_NAMES if name in self.axes]
        configs = []
        for values in itertools.product(*(self.axes[name] for name in names)):
            configs.append(defaults | dict(zip(names, values, strict=True))
                           | {"percentiles": self.percentiles, "goodput": self.goodput})
        return configs

    def metadata(self) -> dict[str, Any]:
        return {"sweep": {"axes": self.axes, "percentiles": self.percentiles, "goodput": self.goodput}}


def read_spec_file(path: Path) -> tuple[dict[str, list[Any]], dict[str, str]]:
    """`axes:` (setting: list of values) and `fixed:` (setting: value) from YAML or TOML."""
    import yaml

    if not path.is_file():
        raise InputError(f"--file {clip_path(str(path))} does not exist")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(path.read_text()) or {}
        else:
            raise InputError(f"--file {clip_path(str(path))} must be .yaml, .yml or .toml")
    except UnicodeDecodeError:
        raise InputError(f"--file {clip_path(str(path))} is not UTF-8 text") from None
    except RecursionError:
        raise InputError(f"--file {clip_path(str(path))} is nested too deeply to read") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"--file {clip_path(str(path))} is not valid: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or set(data) - {"axes", "fixed"}:
        raise InputError(f"--file {clip_path(str(path))} takes only the tables 'axes' and 'fixed'")
    for section, value in data.items():
        if value is not None and not isinstance(value, dict):
            raise InputError(f"'{section}' in --file {clip_path(str(path))} must be a table of setting: value, "
                             f"got {quote(value)}")
    if not any(data.values()):
        raise InputError(f"--file {clip_path(str(path))} sets nothing: give 'axes' (setting: [values]) or 'fixed'")
    axes: dict[str, list[Any]] = {}
    sweep_wide: dict[str, str] = {}
    for section in ("axes", "fixed"):
        for key, value in (data.get(section) or {}).items():
            name = setting_name(str(key))
            if name in SWEEP_WIDE:
                if section == "axes":
                    raise InputError(f"{name} applies to the whole sweep: put it under 'fixed', not 'axes'")
                sweep_wide[name] = ",".join(f"{v}" for v in value) if isinstance(value, list) else str(value)
            elif section == "axes":
                if not isinstance(value, list):
                    raise InputError(f"axis {quote(key)} in {clip_path(str(path))} must be a list of values, "
                                     f"got {quote(value)}")
                axes[name] = [parse_value(name, v) for v in value]
            else:
                axes[name] = [parse_value(name, value)]
    return axes, sweep_wide


def config_id(settings: dict[str, Any]) -> str:
    from simulator.outputs.run_folder import json_safe

    return hashlib.sha256(json.dumps(json_safe(settings), sort_keys=True).encode()).hexdigest()[:16]


class SweepStore:
    """The --out file and the part files that commit its rows one configuration at a time."""

    def __init__(self, out: Path, metadata: dict[str, Any]) -> None:
        self.out = out
        self.parts = out.with_name(f"{out.name}.parts")
        self.metadata = metadata
        self.rows: dict[str, dict[str, Any]] = {}
        if out.exists():
            existing = read_sweep_file(out, f"--out {clip_path(str(out))} exists and")
            self.rows.update((row["config_id"], row) for row in existing.to_dicts())
        if self.parts.is_dir():
            for part in sorted(self.parts.glob("*.parquet")):
                row = read_part(part)
                if row is not None:
                    self.rows[row["config_id"]] = row
        self.last_flush = -float("inf")

    def done(self, retry_failed: bool) -> set[str]:
        return {cid for cid, row in self.rows.items() if not (retry_failed and row.get("error") is not None)}

    def commit(self, row: dict[str, Any], order: dict[str, int]) -> None:
        import polars as pl

        from simulator.outputs.run_folder import write_parquet

        self.parts.mkdir(parents=True, exist_ok=True)
        write_parquet(pl.from_dicts([row], infer_schema_length=None), self.parts / f"{row['config_id']}.parquet",
                      self.metadata)
        self.rows[row["config_id"]] = row
        if time.monotonic() - self.last_flush >= FLUSH_INTERVAL:
            self.flush(order)

    def flush(self, order: dict[str, int]) -> None:
        """Rewrite --out from every committed row: this sweep's in product order, then older ones.

        With no row yet (interrupted before any configuration finished) there is nothing to write:
        a file of no rows and no columns would not be a sweep file to resume.
        """
        import polars as pl

        from simulator.outputs.run_folder import write_parquet

        if not self.rows:
            return
        ids = sorted(self.rows, key=lambda cid: order.get(cid, len(order)))
        frame = pl.from_dicts([self.rows[cid] for cid in ids], infer_schema_length=None,
                              schema_overrides=settings_schema())
        write_parquet(frame, self.out, self.metadata)
        self.last_flush = time.monotonic()

    def drop_parts(self) -> None:
        """Once --out holds every row the part files are redundant."""
        shutil.rmtree(self.parts, ignore_errors=True)


@dataclass(frozen=True)
class SweepOutcome:
    total: int
    skipped: int
    ran: int
    failed: list[tuple[str, str]]
    """(config_id, error) of this run's failures."""
    succeeded: int
    """Configurations of this sweep whose row holds no error, this run's and earlier ones."""
    rows: list[dict[str, Any]]
    """This sweep's rows, this run's and earlier ones, in product order."""

MAX_JOBS = 4096
"""The most worker processes a sweep starts: more than any one machine has cores."""


def run_sweep(spec: SweepSpec, out: Path, *, jobs: int = 1, executor: str = "local", address: str | None = None,
              tables_dir: Path | None = None, retry_failed: bool = False, progress: bool = False,
              force: bool = False) -> SweepOutcome:
    """Run every configuration of `spec` not already in `out`, committing each row as it finishes.

    One sweep at a time writes `out`: a second one is refused while the first holds its lock.
    Unless `force`, a configuration estimated to need more memory than this machine has is
    refused before any runs.
    """
    from simulator.outputs.locks import Busy, exclusive
    from simulator.outputs.run_folder import check_writable

    if out.is_dir():
        raise InputError(f"--out {clip_path(str(out))} is a folder; give a .parquet file")
    if not 1 <= jobs <= MAX_JOBS:  # past a C int the worker pool's semaphore overflows
        raise InputError(f"--jobs must be a number of workers in [1, {MAX_JOBS}], got {quote(jobs)}")
    if address is not None and executor != "ray":
        raise InputError(f"--address {quote(address)} is for --executor ray")
    check_writable(out, "--out")
    if tables_dir is not None:
        check_writable(tables_dir, "--tables", inside=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with exclusive(out.with_name(f".{out.name}.lock")):
            return run_unlocked(spec, out, jobs, executor, address, tables_dir, retry_failed, progress, force)
    except Busy as holder:
        raise InputError(f"--out {clip_path(str(out))} is being written by another sweep ({holder}); when it ends, "
                         "rerun this command to add this sweep's rows") from None


def run_unlocked(spec: SweepSpec, out: Path, jobs: int, executor: str, address: str | None,
                 tables_dir: Path | None, retry_failed: bool, progress: bool, force: bool) -> SweepOutcome:
    from simulator.progress import Bar

    configs = [(config_id(settings), settings) for settings in spec.settings()]
    order = {cid: i for i, (cid, _) in enumerate(configs)}
    store = SweepStore(out, spec.metadata())
    done = store.done(retry_failed)
    todo = [(cid, settings) for cid, settings in configs if cid not in done]
    if not force:
        check_sizes(todo, tables=tables_dir is not None)
    tables = str(tables_dir) if tables_dir is not None else None
    rows: Rows = (run_ray(todo, jobs, address, tables) if executor == "ray"
                                      else run_local(todo, jobs, tables))
    failed = []
    bar = Bar(len(configs), desc="sweep", unit="config", initial=len(configs) - len(todo), delay=0, enabled=progress)
    bar.advance(bar.initial)
    try:
        for row in rows:
            store.commit(row, order)
            if row["error"] is not None:
                failed.append((row["config_id"], row["error"]))
            bar.advance(bar.done + 1)
    except WorkerDied as exc:
        raise click.ClickException(f"{exc}; the finished configurations are in {out}: rerun the same command "
                                   "to run the rest") from None
    finally:
        rows.close()  # stops the workers of an interrupted sweep
        bar.close()
        store.flush(order)
    store.drop_parts()
    found = [store.rows[cid] for cid in order]
    succeeded = sum(1 for row in found if row.get("error") is None)
    return SweepOutcome(len(configs), len(configs) - len(todo), len(todo), failed, succeeded, found)


def check_sizes(todo: list[tuple[str, dict[str, Any]]], tables: bool) -> None:
    """Refuse the sweep when a configuration is estimated to need more memory than this machine has
    (its tokens table held in memory when `tables`); one its settings refuse fails in its own row."""
    from simulator.run.estimate import check_run_size

    for cid, settings in todo:
        try:
            config = config_from_settings(settings)
        except InputError:
            continue
        try:
            check_run_size(config, token_rows=tables, force=False)
        except InputError as exc:
            raise InputError(f"configuration {cid}: {exc}") from None
