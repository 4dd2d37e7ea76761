"""Exclusive locks between servesim processes, held by the kernel: a killed holder frees its lock.

`flock` locks belong to an open file, so they die with the process that holds them (SIGKILL,
out of memory), and no lock file is ever stale: a lock file left by a killed process is free.
"""

from __future__ import annotations

import fcntl


def try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
