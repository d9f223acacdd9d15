"""The overlap helpers keep order, pass errors on, and stop their threads when the consumer stops."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_prep.run.overlap import Sink, in_background, overlapped, quick_handoffs


def test_overlapped_keeps_order_and_raises_the_producers_error() -> None:
    def items():
        yield from range(5)
        raise ValueError("bad row")

    got = []
    with pytest.raises(ValueError, match="bad row"):
        for item in overlapped(items()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]


def test_a_consumer_that_stops_early_stops_the_producer() -> None:
    produced = []

    def endless():
        n = 0
        while True:
            produced.append(n)
            yield n
            n += 1

    stream = overlapped(endless())
    assert next(stream) == 0
    stream.close()  # what happens when the consumer's loop is left by an exception
    time.sleep(0.5)
    count = len(produced)
    time.sleep(0.3)
    assert len(produced) == count  # nothing more is produced
    assert not [t for t in threading.enumerate() if t.name == "gpu-prep-host-stages" and t.is_alive()]


def test_sink_runs_in_order_and_raises_its_error_in_the_producer() -> None:
    seen = []

    def fn(item: int) -> None:
        if item == 3:
            raise RuntimeError("disk full")
        seen.append(item)

    with pytest.raises(RuntimeError, match="disk full"):
        with Sink(fn) as sink:
            for item in range(10):
                sink.put(item)
                time.sleep(0.01)
    assert seen == [0, 1, 2]


def test_in_background_returns_the_result_or_raises_the_error_of_another_thread() -> None:
    names: list[str] = []

    def work() -> int:
        names.append(threading.current_thread().name)
        return 42

    assert in_background(work)() == 42
    assert names and names[0] != threading.current_thread().name

    def fail() -> None:
        raise ValueError("hashing failed")

    with pytest.raises(ValueError, match="hashing failed"):
        in_background(fail)()


def test_quick_handoffs_shorten_the_switch_interval_for_the_run_only() -> None:
    import sys

    before = sys.getswitchinterval()
    with quick_handoffs():
        assert sys.getswitchinterval() < before
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), quick_handoffs():
        raise RuntimeError("a failing run")
    assert sys.getswitchinterval() == before
