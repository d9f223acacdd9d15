"""How many cores this process may use: what its defaults for threads and local workers count."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores the process may run on: its CPU affinity where the OS keeps one (taskset, a container's or a
    batch job's cpuset), else every core the machine has. os.cpu_count() counts the machine's cores even
    where the process may use a few of them, which would start a thread or a worker per core it cannot use."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this OS (macOS, Windows)
        return os.cpu_count() or 1
