"""Timing and scratch folders shared by the benchmarks."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def scratch(prefix: str) -> Path:
    """A new temporary folder, removed when the process exits, however it exits short of a kill: a benchmark
    writes gigabytes of corpora, caches and shards, and repeated runs must not fill the disk."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def best(repeat: int, fn: Callable[[], Any]) -> float:
    """The fastest of `repeat` runs of fn, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)
