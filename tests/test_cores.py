"""The default count of threads and local workers: the cores the process may use, not the machine's."""

from __future__ import annotations

import os

import pytest

from gpu_prep.cores import usable_cores


def test_the_cores_counted_are_the_affinitys(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under taskset -c 3 (or a batch job's cpuset) on a machine of many cores, one core: one thread.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cores() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(5, 21)), raising=False)
    assert usable_cores() == 16


def test_without_an_affinity_every_core_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    assert usable_cores() == 12
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1


def test_the_tiktoken_engine_takes_a_thread_per_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_prep.tokenization.engines import TiktokenEngine

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    engine = TiktokenEngine(encoding=None, form=None, threads=1)
    assert engine.with_threads(None).threads == 3 and engine.with_threads(5).threads == 5
