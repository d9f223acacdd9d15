"""Ragged arrays: flat values + int64 offsets (the Arrow / cuDF list layout), written once against the
array module `xp` (numpy or cupy). Row i of a ragged array is values[offsets[i]:offsets[i + 1]].

The primitives every stage over tokens builds on (mask, packing, the GPU backend's WordPiece scatter); they
import nothing of gpu_prep, so any module may use them.
"""

from __future__ import annotations

from typing import Any


def row_of(xp: Any, offsets: Any, n: int) -> Any:
    """The row index of each of n flat elements, given int64 row offsets (len rows + 1).

    Counts the rows that start at or before each element: one pass (bincount + cumsum) instead of a
    binary search per element, and no repeat() (whose CuPy semantics changed between releases)."""
    starts = xp.bincount(offsets[1:-1], minlength=n + 1)[:n]
    return xp.cumsum(starts)


def offsets_from_lengths(xp: Any, lengths: Any) -> Any:
    out = xp.zeros(len(lengths) + 1, dtype=xp.int64)
    xp.cumsum(lengths, dtype=xp.int64, out=out[1:])
    return out


def segment_sums(xp: Any, values: Any, offsets: Any, running: bool | None = None) -> Any:
    """Sum of integer (or bool) values within each row, as int64 (rows may be empty). numpy adds each row in
    place (add.reduceat over the rows that have values, as segment_mins does), without the running total of
    every element that CuPy, which has no reduceat, takes the differences of: over a chunk's tokens that total
    is a fresh int64 array as long as the chunk, and numpy's cumsum holds the GIL while it fills it.
    running: which, when not by the module (tests)."""
    if running is None:
        running = xp.__name__ != "numpy"
    if running:
        total = offsets_from_lengths(xp, values)
        return total[offsets[1:]] - total[offsets[:-1]]
    out = xp.zeros(len(offsets) - 1, dtype=xp.int64)
    filled = offsets[1:] > offsets[:-1]
    if len(values):
        out[filled] = xp.add.reduceat(values, offsets[:-1][filled], dtype=xp.int64)
    return out


def reorder(xp: Any, offsets: Any, order: Any) -> tuple[Any, Any]:
    """Rows taken in `order` (a permutation, or any selection of rows): the index that gathers their values,
    and their offsets."""
    starts = offsets[:-1][order]
    new_offsets = offsets_from_lengths(xp, offsets[1:][order] - starts)
    total = int(new_offsets[-1])
    row = row_of(xp, new_offsets, total)  # not repeat(): its CuPy semantics changed between releases
    return (starts - new_offsets[:-1])[row] + xp.arange(total), new_offsets


def segment_mins(xp: Any, values: Any, offsets: Any, fill: int, rows: Any = None, scatter: bool | None = None) -> Any:
    """The least value within each row; `fill` for an empty row. rows: row_of(xp, offsets, len(values)) where
    the caller has it. numpy reduces each row in one pass (reduceat over the rows that have values; an empty
    row starts where the next one does, so skipping it leaves every other row's range whole); CuPy has no
    minimum.reduceat and scatters instead (minimum.at). scatter: which, when not by the module (tests)."""
    out = xp.full(len(offsets) - 1, fill, dtype=values.dtype)
    if not len(values):
        return out
    if scatter is None:
        scatter = xp.__name__ != "numpy"
    if scatter:
        xp.minimum.at(out, row_of(xp, offsets, len(values)) if rows is None else rows, values)
        return out
    filled = offsets[1:] > offsets[:-1]
    out[filled] = xp.minimum.reduceat(values, offsets[:-1][filled])
    return out
