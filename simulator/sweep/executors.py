"""Where a sweep's configurations run: in this process, in a pool of local processes, or on Ray.

Every executor runs the same function, `run_config`, on settings dicts and yields one row per
configuration as it finishes (in completion order), so the rows do not depend on where they ran.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import shutil
import threading
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from simulator.errors import InputError

TABLES = ("requests", "tokens", "steps")
# Settings whose names the summary also uses (the summary's `num_requests` is the workload's actual
# count, its `duration` the first arrival to the last finish); in a sweep row the setting is renamed.
SHADOWED_SETTINGS = ("num_requests", "duration")


class WorkerDied(RuntimeError):
    """A worker process ended without returning (killed, out of memory)."""


def setting_column(name: str) -> str:
    return f"setting_{name}" if name in SHADOWED_SETTINGS else name


def config_from_settings(settings: dict[str, Any]) -> Any:
    """A `RunConfig` from a sweep's settings dict, whose percentiles and SLOs are strings."""
    from simulator.config import RunConfig
    from simulator.ranges import parse_goodput, parse_percentiles

    return RunConfig(**settings | {"percentiles": parse_percentiles(settings["percentiles"]),
                                   "goodput": parse_goodput((settings["goodput"],))})


def run_config(config_id: str, settings: dict[str, Any], tables_dir: str | None) -> dict[str, Any]:
    """Simulate one configuration; its row is its settings, `error` (None) and its summary.

    Any exception becomes the row's `error`, so one bad configuration does not stop a sweep.
    """
    from simulator.metrics.summary import build_tables, summarize
    from simulator.outputs.run_folder import write_parquet
    from simulator.run.simulate import simulate

    row: dict[str, Any] = {"config_id": config_id}
    row.update((setting_column(name), value) for name, value in settings.items())
    try:
        result = simulate(config_from_settings(settings))
        tables = build_tables(result, tokens=tables_dir is not None)
        summary = summarize(result, tables)
        if tables_dir is not None:
            for name in TABLES:
                # Hive layout; a rerun replaces the partition, stray files of a killed write included.
                partition = Path(tables_dir) / name / f"config_id={config_id}"
                shutil.rmtree(partition, ignore_errors=True)
                partition.mkdir(parents=True)
                write_parquet(getattr(tables, name), partition / "part-0.parquet", {"settings": settings})
    except Exception as exc:
        return row | {"error": f"{type(exc).__name__}: {exc}"}
    assert not set(summary) & set(row), f"summary names shadow settings: {set(summary) & set(row)}"
    return row | {"error": None} | summary


PARENT_POLL_SECONDS = 0.5


def exit_with_parent(parent: int) -> None:
    """A pool worker's initializer: end the worker once its parent is gone.

    A parent killed outright (SIGKILL) cannot stop its pool, and a worker blocked on the pool's
    queue would live on, orphaned, holding the resource tracker open too.
    """
    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(PARENT_POLL_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="exit with parent", daemon=True).start()


Todo = list[tuple[str, dict[str, Any]]]
Rows = Generator[dict[str, Any], None, None]


def run_inline(todo: Todo, tables_dir: str | None) -> Rows:
    for config_id, settings in todo:
        yield run_config(config_id, settings, tables_dir)


def run_local(todo: Todo, jobs: int, tables_dir: str | None) -> Rows:
    """`jobs` worker processes; one job runs in this process."""
    if jobs == 1:
        yield from run_inline(todo, tables_dir)
        return
    yield from in_workers([(run_config, (config_id, settings, tables_dir)) for config_id, settings in todo], jobs)


def in_workers(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]], jobs: int) -> Generator[Any, None, None]:
    """Each call's result as it finishes, in at most `jobs` spawned worker processes."""
    # Spawned, not forked: polars' thread pool does not survive a fork. No more workers than work.
    pool = cf.ProcessPoolExecutor(max_workers=max(1, min(jobs, len(calls))),
                                  mp_context=multiprocessing.get_context("spawn"), initializer=exit_with_parent,
                                  initargs=(os.getpid(),))
    try:
        futures = [pool.submit(function, *args) for function, args in calls]
        for future in cf.as_completed(futures):
            try:
                yield future.result()
            except cf.process.BrokenProcessPool:
                raise WorkerDied("a worker process died (killed or out of memory)") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_ray(todo: Todo, jobs: int, address: str | None, tables_dir: str | None) -> Rows:
    """On the Ray cluster at `address`, or on a local Ray instance of `jobs` CPUs when None.

    On a cluster every node needs servesim installed, and `tables_dir` must be a shared path.
    """
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray needs Ray: pip install 'servesim[ray]'") from None
    started = not ray.is_initialized()
    if started:
        try:
            if address is None:
                ray.init(num_cpus=jobs, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            else:
                ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, ValueError) as exc:
            raise InputError(f"cannot reach a Ray cluster at --address {address!r}: {exc}") from None
    task = ray.remote(num_cpus=1, max_retries=0)(run_config)
    pending = {task.remote(config_id, settings, tables_dir): (config_id, settings) for config_id, settings in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            config_id, settings = pending.pop(ready[0])
            try:
                yield ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                # The task itself catches exceptions: this is its worker dying, and Ray tells us which.
                row = {"config_id": config_id} | {setting_column(k): v for k, v in settings.items()}
                yield row | {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
