"""Timing shared by the benchmarks that time in one process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best(repeat: int, fn: Callable[[], Any]) -> float:
    """The fastest of `repeat` runs of fn, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)
