"""pack: how a shard's samples become the sequences a trainer reads (preprocessing.packing).

A shard's samples are appended to its raw temporaries in input order; when the shard closes, a Layout
says which token ranges of that raw stream (segments) make each final sequence, in order:

- none: one sample per sequence;
- wrapped: the samples concatenated and cut every seq_len tokens; a sample cut at a sequence's end goes on
  as the first segment of the next one;
- bfd: whole samples, longest first, each put into the open sequence it fills best (the one with the
  least room left that still holds it), a new one when none does. No sample is ever split.

Packing works per shard (its samples are all on disk when it closes), so the result depends only on the
input order and max_tokens_per_shard, never on chunk sizes or workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
import numpy as np

from gpu_prep.ragged import offsets_from_lengths

STRATEGIES = ("none", "wrapped", "bfd")


@dataclass(frozen=True)
class Layout:
    starts: np.ndarray  # int64: where each segment begins in the raw token stream, in final order
    lengths: np.ndarray  # int64: each segment's tokens
    groups: np.ndarray  # int64: sequence j is segments [groups[j], groups[j + 1])
    packed: bool

    @property
    def segment_offsets(self) -> np.ndarray:
        """Final token offsets of the segments (segments + 1 entries)."""
        return offsets_from_lengths(np, self.lengths)

    @property
    def sequence_offsets(self) -> np.ndarray:
        """Final token offsets of the sequences (sequences + 1 entries), a subset of segment_offsets."""
        return self.segment_offsets[self.groups]

    @property
    def num_sequences(self) -> int:
        return len(self.groups) - 1


def unpacked(offsets: np.ndarray) -> Layout:
    count = len(offsets) - 1
    return Layout(offsets[:-1], np.diff(offsets), np.arange(count + 1, dtype=np.int64), packed=False)


def wrapped(offsets: np.ndarray, seq_len: int) -> Layout:
    """The segment boundaries are the sample boundaries and the multiples of seq_len; each segment belongs
    to the sequence its start falls in."""
    total = int(offsets[-1])
    bounds = np.union1d(offsets, np.arange(0, total, seq_len, dtype=np.int64))
    groups = offsets_from_lengths(np, np.bincount(bounds[:-1] // seq_len, minlength=-(-total // seq_len)))
    return Layout(bounds[:-1], np.diff(bounds), groups, packed=True)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Items packed into bins of `capacity`: (the items in final order, bin offsets into that order).

    Items go longest first (ties: input order), each into the bin with the least room left that still
    holds it, else a new bin; a bin lists its items in the order they went in. Which bins have r free
    slots is a stack per r, and which r have any is one bit each of an integer, so finding the best bin
    is a shift and a lowest-set-bit, whatever the number of bins.
    """
    if len(lengths) and int(lengths.max()) > capacity:
        raise ValueError(f"a sample of {int(lengths.max())} tokens does not fit a sequence of {capacity}")
    order = np.argsort(-lengths, kind="stable")
    bin_of = np.empty(len(lengths), dtype=np.int64)
    free_bits = 0  # bit r set: some bin has exactly r free slots
    with_free: dict[int, list[int]] = {}
    bins = 0
    for item, size in zip(order.tolist(), lengths[order].tolist(), strict=True):
        above = free_bits >> size
        if above:
            room = size + (above & -above).bit_length() - 1
            stack = with_free[room]
            chosen = stack.pop()
            if not stack:
                free_bits ^= 1 << room
        else:
            room, chosen = capacity, bins
            bins += 1
        bin_of[item] = chosen
        left = room - size
        if left:
            if not with_free.setdefault(left, []):
                free_bits |= 1 << left
            with_free[left].append(chosen)
    final = order[np.argsort(bin_of[order], kind="stable")]
    return final, offsets_from_lengths(np, np.bincount(bin_of, minlength=bins))


def bfd(offsets: np.ndarray, seq_len: int) -> Layout:
    lengths = np.diff(offsets)
    order, groups = best_fit_decreasing(lengths, seq_len)
    return Layout(offsets[:-1][order], lengths[order], groups, packed=True)


def layout(strategy: str, offsets: np.ndarray, seq_len: int | None) -> Layout:
    if strategy == "none":
        return unpacked(offsets)
    assert seq_len is not None
    return wrapped(offsets, seq_len) if strategy == "wrapped" else bfd(offsets, seq_len)


def padding_tokens(num_sequences: int, num_tokens: int, seq_len: int) -> int:
    """The padding a trainer adds when it pads every sequence to seq_len."""
    return num_sequences * seq_len - num_tokens


def summary(parts: list[dict[str, Any]], seq_len: int) -> dict[str, Any]:
    """Sequences (num_samples), the samples in them (num_segments) and the padding to seq_len, summed over
    parts (shard records, or domains), with the padding's share of the padded length."""
    sequences = sum(p["num_samples"] for p in parts)
    padding = sum(p["padding_tokens"] for p in parts)
    return {"num_samples": sequences, "num_segments": sum(p["num_segments"] for p in parts),
            "padding_tokens": padding, "padding_share": round(padding / (sequences * seq_len), 6) if sequences else 0.0}
