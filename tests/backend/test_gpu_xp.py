"""The array code written against `xp` gives on CuPy what it gives on numpy (run with `pytest -m gpu` on a
GPU): fuzzy_dedup's shingle hashes, signatures and band keys, and the scatter form of segment_mins that
CuPy takes. These need CuPy alone, not cuDF, so a machine with a GPU and CuPy checks them even where the
GPU backend as a whole cannot run. Without a GPU they skip (tests/conftest.py says why)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpu_prep.filter.fuzzy import MinHasher, encode_texts, shingle_hashes
from gpu_prep.ragged import segment_mins

pytestmark = pytest.mark.gpu


def _texts(n: int, seed: int = 4) -> list[str]:
    """Documents of every size from none to a few thousand words, sharing a vocabulary (so shingles repeat
    across them), with Unicode words and whitespace of several kinds."""
    rng = random.Random(seed)
    vocabulary = [f"w{k}" for k in range(400)] + ["é", "日本語", "🙂", "naïve", "x" * 300]
    spaces = [" ", " ", " ", "\n", "\t", "\u3000", "\u00a0", "  "]
    return ["".join(rng.choice(vocabulary) + rng.choice(spaces) for _ in range(rng.choice([0, 1, 3, 40, 2000])))
            for _ in range(n)]


def test_band_keys_and_signatures_are_the_same_on_cupy() -> None:
    import cupy

    data, offsets = encode_texts(_texts(600))
    hasher = MinHasher(5, 128, 9, 13, 42)
    want_hashes, want_starts = shingle_hashes(np, data, offsets, 5)
    got_hashes, got_starts = shingle_hashes(cupy, cupy.asarray(data), cupy.asarray(offsets), 5)
    assert (cupy.asnumpy(got_starts) == want_starts).all() and (cupy.asnumpy(got_hashes) == want_hashes).all()
    want_sig, want_signed = hasher.signatures(np, data, offsets)
    got_sig, got_signed = hasher.signatures(cupy, cupy.asarray(data), cupy.asarray(offsets))
    assert (cupy.asnumpy(got_sig) == want_sig).all() and (cupy.asnumpy(got_signed) == want_signed).all()
    want_keys, _ = hasher.band_keys(np, data, offsets)
    got_keys, _ = hasher.band_keys(cupy, cupy.asarray(data), cupy.asarray(offsets))
    assert (cupy.asnumpy(got_keys) == want_keys).all()


@pytest.mark.parametrize("dtype", ["uint32", "uint64"])
def test_segment_mins_scatter_on_cupy(dtype: str) -> None:
    import cupy

    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 6, size=5000)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = rng.integers(0, np.iinfo(dtype).max, size=int(offsets[-1]), dtype=dtype)
    want = segment_mins(np, values, offsets, np.iinfo(dtype).max)
    got = segment_mins(cupy, cupy.asarray(values), cupy.asarray(offsets), np.iinfo(dtype).max)
    assert (cupy.asnumpy(got) == want).all()


def test_the_json_byte_scan_decides_on_cupy_as_on_numpy() -> None:
    # gpu_prep/read/jsonscan.py, which the GPU backend runs before handing a range to cuDF: on every trap and on
    # clean chats (raw and ASCII-escaped, emoji as surrogate pairs), each line alone and all together.
    import json

    import cupy

    from corpora import sharegpt_chats
    from gpu_prep.read.jsonscan import scan
    from test_jsonscan import SYNTAX_TRAPS

    values = {"messages": (91, True), "role": (34, False), "content": (34, False), "a": (34, False)}
    chats = [json.dumps({"messages": c["messages"]}, ensure_ascii=ascii).encode()
             for c in sharegpt_chats(200) for ascii in (False, True)]
    lines = [*SYNTAX_TRAPS, *chats, b"", b"   "]
    for line in lines:
        rows = int(bool(line.strip()))
        assert scan(cupy, line + b"\n", rows, values) == scan(np, line + b"\n", rows, values), line[:80]
    block = b"\n".join(chats) + b"\n"
    assert scan(cupy, block, len(chats), values) == scan(np, block, len(chats), values) is not None


def test_the_length_rules_drop_the_same_rows_on_cupy() -> None:
    import cupy

    from gpu_prep.backend import CPU, GpuBackend
    from gpu_prep.filter.dedup import length_drops

    rng = np.random.default_rng(3)
    chars, pretraining = rng.integers(0, 400, size=20_000), rng.random(20_000) < 0.5
    device = GpuBackend("gpu", cupy, strings=False)
    for rules in ((0, 10**9), (50, 300), (200, 100), (10**19, 10**19)):
        want = length_drops(CPU, chars, pretraining, *rules)
        got = length_drops(device, chars, pretraining, *rules)
        assert all(isinstance(g, np.ndarray) and (g == w).all() for g, w in zip(got, want)), rules
