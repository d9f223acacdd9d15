"""splitmix64 over arrays of uint64, written against the array module `xp` (numpy or cupy): one step of
Vigna's generator (add the golden gamma, then the finaliser), a bijection in which every bit of the result
depends on every bit of the input. Uint64 array arithmetic wraps, as the algorithm wants.

It picks the pieces the engine check re-encodes (tokenization.checks.Audit), orders output.shuffle's samples, and
mixes fuzzy_dedup's hashes; it imports nothing of gpu_prep, so any module may use it."""

from __future__ import annotations

from typing import Any

GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(xp: Any, x: Any) -> Any:
    """splitmix64 of each uint64 of x (an array; a 0-d array for one value)."""
    x = x + xp.uint64(GOLDEN)
    x = (x ^ (x >> xp.uint64(30))) * xp.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> xp.uint64(27))) * xp.uint64(0x94D049BB133111EB)
    return x ^ (x >> xp.uint64(31))
