"""Train/validation splits: which split each row goes to (output.splits, output.split_seed).

A row's split depends on its own text and the seed alone: blake2b of the text keyed by the seed, read as a
number in [0, 1), against the shares' running sums in the order the config names them. So a row keeps its
split when rows are added or the input is reordered, equal rows always share a split (a duplicate cannot
leak from train into validation), and a cluster's workers decide exactly as one process does.
"""

from __future__ import annotations

import hashlib

import numpy as np

_UNIT = float(1 << 53)


def split_codes(texts: list[str], shares: dict[str, float], seed: int) -> np.ndarray:
    """The index (into shares' names) of each text's split."""
    key = seed.to_bytes(16, "little", signed=True)
    draws = np.fromiter(
        (int.from_bytes(hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=8, key=key).digest(), "little")
         >> 11 for t in texts), np.uint64, len(texts))
    bounds = np.cumsum(np.fromiter(shares.values(), np.float64, len(shares)))
    # Exactly representable: a 53-bit draw over 2**53 is a float64 in [0, 1) with no rounding.
    codes = np.searchsorted(bounds, draws.astype(np.float64) / _UNIT, side="right")
    return np.minimum(codes, len(shares) - 1)  # shares summing to a hair under 1 leave the last split the rest
