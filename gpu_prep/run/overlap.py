"""Stages that overlap: each runs in a thread of its own and hands its results on in order.

The tokenizer engines release the GIL, so while one thread tokenizes a chunk, another can read and render
the next and a third mask and write the previous one. Order is kept everywhere, so output does not depend
on how the work interleaves.
"""

from __future__ import annotations

import queue
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@contextmanager
def deaf_to_ctrl_c() -> Iterator[None]:
    """SIGINT ignored inside the block (in the main thread, where signals arrive; elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class Stopwatch:
    """Seconds spent in each stage, added up over chunks (stages overlap, so they may sum past the total)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    lock: threading.Lock = field(default_factory=threading.Lock)
    started: float = field(default_factory=time.perf_counter)  # when the run began (its total)

    def time(self, stage: str, fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            with self.lock:
                self.seconds[stage] += time.perf_counter() - start


def overlapped(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """The items of an iterator produced in a thread of their own, at most `depth` ahead of the consumer.
    When the consumer stops early (an error downstream), the producer stops too instead of waiting forever."""
    done = object()
    stopped = threading.Event()
    handoff: queue.Queue = queue.Queue(maxsize=depth)

    def hand(item: Any) -> bool:
        while not stopped.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not hand(item):
                    return
            hand(done)
        except BaseException as exc:  # handed to the consumer, which raises it
            hand(_Failure(exc))

    threading.Thread(target=produce, name="gpu-prep-host-stages", daemon=True).start()
    try:
        while (item := handoff.get()) is not done:
            if isinstance(item, _Failure):
                raise item.exc
            yield item
    finally:
        stopped.set()


# How long a thread running Python keeps the GIL while another asks for it (CPython's default is 5 ms).
SWITCH_SECONDS = 0.0005


@contextmanager
def quick_handoffs() -> Iterator[None]:
    """While the stages overlap: a tokenizer thread needs the GIL for a moment after each piece, and with
    CPython's default it may wait 5 ms for a thread that is rendering or masking, its core idle meanwhile.
    Handing the GIL over after 0.5 ms measured about 5% faster on chat rows (2 cores)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_SECONDS))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclass
class _Failure:
    exc: BaseException


def in_background(fn: Callable[[], T]) -> Callable[[], T]:
    """Start fn in a daemon thread (one a failing run does not wait for); the callable returned waits for
    fn's result, or raises its exception."""
    box: list[Any] = []
    thread = threading.Thread(target=lambda: box.append(_call(fn)), name="gpu-prep-background", daemon=True)
    thread.start()

    def result() -> T:
        thread.join()
        if isinstance(box[0], _Failure):
            raise box[0].exc
        return box[0]

    return result


def _call(fn: Callable[[], T]) -> T | _Failure:
    try:
        return fn()
    except BaseException as exc:  # handed to whoever waits for the result
        return _Failure(exc)


class Sink:
    """Runs fn on each item put, in order, in a thread of its own, at most one item behind the producer.
    An exception in fn is raised again in the producer, at its next put or when the sink closes."""

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn = fn
        self.handoff: queue.Queue = queue.Queue(maxsize=1)
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._drain, name="gpu-prep-write", daemon=True)

    def _drain(self) -> None:
        while (item := self.handoff.get()) is not _CLOSE:
            if self.failure is None:
                try:
                    self.fn(item)
                except BaseException as exc:  # handed to the producer
                    self.failure = exc

    def put(self, item: Any) -> None:
        if self.failure is not None:
            raise self.failure
        self.handoff.put(item)

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.handoff.put(_CLOSE)
        self.thread.join()
        if self.failure is not None and exc_info[0] is None:
            raise self.failure


_CLOSE = object()
