"""Where a plan's evaluations run: in this process (`--jobs 1`), in spawned worker processes, or on
Ray (`--executor ray`: a local Ray instance of `--jobs` CPUs, or the cluster at `--address`, for
large spaces). Tasks are submitted lazily, at most two per worker ahead, so that a bound can be
checked against the best found just before its deployment starts; the answer is the same on each.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from typing import Any

from simulator.errors import InputError

EXECUTORS = ("local", "ray")


class Runner:
    """Runs `evaluate(*task)` for each task that `prepare` lets through."""

    def __init__(self, jobs: int, executor: str = "local", address: str | None = None) -> None:
        if executor not in EXECUTORS:
            raise InputError(f"unknown --executor {executor!r} (choose from {', '.join(EXECUTORS)})")
        self.jobs = jobs
        self.pool: cf.ProcessPoolExecutor | None = None
        self.ray: Any = None
        self.started_ray = False
        if executor == "ray":
            self._start_ray(address)
        elif jobs > 1:
            from simulator.sweep.executors import exit_with_parent

            self.pool = cf.ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                                               initializer=exit_with_parent, initargs=(os.getpid(),))

    def _start_ray(self, address: str | None) -> None:
        try:
            import ray
        except ImportError:
            raise InputError("--executor ray needs Ray, which is not installed: pip install 'servesim[ray]'"
                             ) from None
        self.ray = ray
        if ray.is_initialized():
            return
        where: dict[str, Any] = {"address": address} if address else {"num_cpus": self.jobs,
                                                                        "include_dashboard": False}
        try:
            ray.init(**where, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, ValueError) as exc:
            raise InputError(f"cannot reach a Ray cluster at --address {address!r}: {exc}") from None
        self.started_ray = True

    def map(self, tasks: list[tuple[Any, ...]], prepare: Callable[[tuple[Any, ...]], Any],
            evaluate: Callable[..., Any]) -> Iterator[Any]:
        """Each task's result as it finishes; `prepare(task)`, called just before a task starts,
        returns the task to run (a tuple) or a result that stands in for running it."""
        if self.pool is None and self.ray is None:
            for task in tasks:
                prepared = prepare(task)
                yield evaluate(*prepared) if isinstance(prepared, tuple) else prepared
            return
        submit, wait = self._ray_calls(evaluate) if self.ray is not None else self._pool_calls(evaluate)
        pending: set[Any] = set()
        queue = list(tasks)
        while queue or pending:
            while queue and len(pending) < 2 * self.jobs:
                prepared = prepare(queue.pop(0))
                if isinstance(prepared, tuple):
                    pending.add(submit(prepared))
                else:
                    yield prepared
            if pending:
                done, pending = wait(pending)
                yield from done

    def _pool_calls(self, evaluate: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        pool = self.pool
        assert pool is not None

        def wait(pending: set[Any]) -> tuple[list[Any], set[Any]]:
            done, left = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            return [future.result() for future in done], left

        return (lambda task: pool.submit(evaluate, *task)), wait

    def _ray_calls(self, evaluate: Callable[..., Any]) -> tuple[Callable[..., Any], Callable[..., Any]]:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=0)(evaluate)

        def wait(pending: set[Any]) -> tuple[list[Any], set[Any]]:
            ready, _ = ray.wait(list(pending), num_returns=1)
            try:
                return [ray.get(ready[0])], pending - {ready[0]}
            except ray.exceptions.RayError as exc:
                raise InputError(f"a Ray worker failed: {str(exc).splitlines()[0][:200]}") from None

        return (lambda task: remote.remote(*task)), wait

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.started_ray:
            self.ray.shutdown()
            self.started_ray = False
