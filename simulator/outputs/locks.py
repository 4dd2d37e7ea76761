"""Exclusive locks between servesim processes, held by the kernel: a killed holder frees its lock.

`flock` locks belong to an open file, so they die with the process that holds them (SIGKILL,
out of memory), and no lock file is ever stale: a lock file left by a killed process is free.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Busy(RuntimeError):
    """Another live process holds the lock; the message names it."""


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock file `path` (created if missing, removed on release), or raise `Busy`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        if not try_lock(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise Busy(f"process {holder}" if holder else "another process")
        # The holder before us may have removed the file between our open and our lock: then we
        # locked a file no one else can find, and must lock the one now at `path`.
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.unlink(path)
        os.close(fd)
