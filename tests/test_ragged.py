"""The ragged-array primitives (ragged.py) against plain loops, the length and dedup filter (filter.py), and
failpoints (failpoint.py), which the crash tests rely on."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_prep.backend import CPU
from gpu_prep.config import parse_config
from gpu_prep.errors import Drop
from gpu_prep.filter.dedup import Deduplicator, filter_rows
from gpu_prep.ragged import offsets_from_lengths, row_of, segment_sums


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=12))
def test_offsets_rows_and_sums_match_plain_loops(lengths: list[int]) -> None:
    offsets = offsets_from_lengths(np, np.array(lengths, dtype=np.int64))
    assert offsets.tolist() == [sum(lengths[:k]) for k in range(len(lengths) + 1)]
    n = int(offsets[-1])
    assert row_of(np, offsets, n).tolist() == [r for r, size in enumerate(lengths) for _ in range(size)]
    values = np.arange(n, dtype=np.int64) * 3 + 1
    want = [int(values[offsets[r]:offsets[r + 1]].sum()) for r in range(len(lengths))]
    assert segment_sums(np, values, offsets).tolist() == want
    # The running-total form CuPy takes gives the same sums, also of int8 masks and bools past their range.
    assert segment_sums(np, values, offsets, running=True).tolist() == want
    for small in (np.full(n, 100, np.int8), np.ones(n, bool)):
        got, running = segment_sums(np, small, offsets), segment_sums(np, small, offsets, running=True)
        assert got.dtype == running.dtype == np.int64
        assert got.tolist() == running.tolist() == [int(small[offsets[r]:offsets[r + 1]].sum(dtype=np.int64))
                                                    for r in range(len(lengths))]


def test_filter_drops_short_text_long_rows_and_later_duplicates() -> None:
    config = parse_config({"input": {"type": "text"}, "preprocessing": {"min_chars": 3, "max_chars": 8}})
    texts = ["ab", "abcd", "abcdefghij", "abcd", "xyz"]
    pretraining = np.array([True, True, True, True, False])
    dedup = Deduplicator()
    chars = np.array([len(t) for t in texts])
    reasons = filter_rows(CPU, chars, texts, pretraining, config, dedup)
    assert reasons == [Drop.TOO_SHORT, None, Drop.TOO_LONG, Drop.DUPLICATE, None]
    # only rows that passed the length rules are remembered, and the next chunk sees them
    assert len(dedup.take_added()) == 2 and dedup.take_added() == []
    assert filter_rows(CPU, np.array([3]), ["xyz"], np.array([True]), config, dedup) == [Drop.DUPLICATE]
    assert filter_rows(CPU, np.array([3]), [], np.array([True]), config, None) == [None]  # deduplicate off


def test_a_failpoint_kills_the_process_the_nth_time_only() -> None:
    code = "from gpu_prep.failpoint import failpoint\nfor k in range(5):\n    print(k, flush=True)\n    failpoint('here')\n"
    env = {**os.environ, "GPU_PREP_FAILPOINT": "here:3"}
    killed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert killed.returncode == -9 and killed.stdout.split() == ["0", "1", "2"]
    env.pop("GPU_PREP_FAILPOINT")
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert free.returncode == 0 and free.stdout.split() == ["0", "1", "2", "3", "4"]


def test_the_dedup_set_keeps_first_occurrences_in_16_bytes_a_digest() -> None:
    import hashlib

    from gpu_prep.filter.dedup import Deduplicator, DigestSet

    digests = [hashlib.md5(str(i % 700).encode()).digest() for i in range(3000)]  # repeats across batches
    dedup, reference = Deduplicator(), set()
    for start in range(0, len(digests), 256):
        batch = digests[start:start + 256] + digests[start:start + 3]  # repeats inside a batch too
        want = []
        for d in batch:
            want.append(d not in reference)
            reference.add(d)
        assert dedup.first_seen(batch).tolist() == want
    assert len(dedup.seen) == 700 and set(dedup.seen) == reference
    assert sum(run.nbytes for run in dedup.seen.runs) == 700 * 16
    assert len(dedup.seen.runs) <= 10  # runs of like size were merged
    again = Deduplicator(DigestSet(np.frombuffer(b"".join(reference), dtype="V16")))  # as a checkpoint reloads
    assert not again.first_seen(digests[:50]).any()
