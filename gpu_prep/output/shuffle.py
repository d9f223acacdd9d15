"""Shuffled output (output.shuffle, output.shuffle_seed): each domain's samples in a seeded order, across the
whole run, in bounded memory.

Sample i of a domain (in the order the run commits them, which is input order, on a cluster too) gets the key
splitmix64(i ^ splitmix64(seed ^ h)), h a hash of the domain's split and name (so domains of one size are not
shuffled alike); the domain is written in ascending key order. splitmix64 is a bijection, so
distinct samples have distinct keys and the order is a permutation, the same in every process and on resume.

Two passes. While the run goes, each sample is appended to one of BUCKETS temporary files, picked by the top
bits of its key (a scatter: sequential appends, no sample held in memory). When the run ends, the buckets are
read back one at a time, in bucket order, each sorted by key and appended to the domain's shards: memory
holds one bucket (a domain's samples / BUCKETS), and ordering by (bucket, key) is ordering by key.

A bucket file is a run of blocks, one per append: a header of two int64 (samples, tokens), then the samples'
keys (uint64), lengths (int64) and labels (int8: input.type kto's, else 0), token ids (int64) and loss mask
(int8). Their lengths in bytes are the
scatter's whole state: a checkpoint records them and --resume cuts the files back to them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.splitmix import splitmix64
from gpu_prep.durable import claim, temporary_name, writing
from gpu_prep.ragged import offsets_from_lengths, reorder

BUCKETS = 64
_BUCKET_SHIFT = np.uint64(64 - 6)  # log2(BUCKETS) top bits of a key
_MASK64 = (1 << 64) - 1


def sample_keys(first: int, count: int, seed: int, domain: str = "") -> np.ndarray:
    """The keys of a domain's samples first .. first + count - 1 under seed (each domain its own order)."""
    named = int.from_bytes(hashlib.blake2b(domain.encode("utf-8"), digest_size=8).digest(), "little")
    salt = splitmix64(np, np.array([(seed ^ named) & _MASK64], dtype=np.uint64))[0]
    return splitmix64(np, np.arange(first, first + count, dtype=np.uint64) ^ salt)


def bucket_name(bucket: int) -> str:
    return temporary_name(f"shuffle-{bucket:02d}")


class Scatter:
    """The first pass of one domain's shuffle: samples appended to bucket files under the domain's directory."""

    def __init__(self, directory: Path, seed: int, domain: str, state: dict[str, Any] | None = None,
                 group: int = 1, labels: bool = False) -> None:
        """domain: what tells this domain's order from another's (its split and name); group: samples that
        move together, in their order (a preference pair's two: one key for both); labels: the samples carry
        a label each (input.type kto)."""
        self.directory, self.seed, self.domain, self.group, self.labels = directory, seed, domain, group, labels
        self.count = 0 if state is None else state["count"]  # samples (groups) scattered so far
        self.lengths = [0] * BUCKETS if state is None else list(state["lengths"])  # bytes of each bucket file
        if state is not None:  # back to the checkpoint: what was appended since goes
            for bucket, length in enumerate(self.lengths):
                path = self.path(bucket)
                if length == 0:
                    path.unlink(missing_ok=True)
                    continue
                with writing(path), open(path, "r+b") as handle:
                    handle.seek(0, 2)
                    if handle.tell() < length:
                        raise ValueError(f"{path} is shorter than the checkpoint says ({length} bytes)")
                    handle.truncate(length)

    def path(self, bucket: int) -> Path:
        return self.directory / bucket_name(bucket)

    def state(self) -> dict[str, Any]:
        return {"count": self.count, "lengths": list(self.lengths)}

    def add(self, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Samples (ids[offsets[k]:offsets[k + 1]], and their labels) appended to their buckets."""
        count = len(offsets) - 1
        if count == 0:
            return
        labels = np.zeros(count, np.int8) if labels is None else labels
        # A group's samples share its key and keep their order (the sort in gather is stable).
        keys = np.repeat(sample_keys(self.count, count // self.group, self.seed, self.domain), self.group)
        self.count += count // self.group
        lengths = np.diff(offsets).astype(np.int64)
        buckets = (keys >> _BUCKET_SHIFT).astype(np.int64)
        token_bucket = np.repeat(buckets, lengths)
        self.directory.mkdir(parents=True, exist_ok=True)
        for bucket in np.unique(buckets).tolist():
            pick, token_pick = buckets == bucket, token_bucket == bucket
            block = b"".join([
                np.array([int(pick.sum()), int(token_pick.sum())], dtype="<i8").tobytes(),
                keys[pick].astype("<u8").tobytes(), lengths[pick].astype("<i8").tobytes(),
                labels[pick].astype("<i1").tobytes(),
                ids[token_pick].astype("<i8").tobytes(), loss_mask[token_pick].astype("<i1").tobytes()])
            path = self.path(bucket)
            claim(path)
            with writing(path), open(path, "ab") as handle:
                handle.write(block)
            self.lengths[bucket] += len(block)

    def gather(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]]:
        """The second pass: each non-empty bucket's samples in key order, as (ids, loss_mask, offsets, labels or
        None)."""
        for bucket, length in enumerate(self.lengths):
            if length == 0:
                continue
            with writing(self.path(bucket)), open(self.path(bucket), "rb") as handle:
                data = handle.read(length)
            keys, lengths, labels, ids, masks = [], [], [], [], []
            at = 0
            while at < len(data):
                samples, tokens = np.frombuffer(data, "<i8", 2, at).tolist()
                at += 16
                for parts, dtype, n in ((keys, "<u8", samples), (lengths, "<i8", samples), (labels, "<i1", samples),
                                        (ids, "<i8", tokens), (masks, "<i1", tokens)):
                    parts.append(np.frombuffer(data, dtype, n, at))
                    at += n * np.dtype(dtype).itemsize
            key, length_of, label, token_ids, mask = (np.concatenate(p) for p in (keys, lengths, labels, ids, masks))
            order = np.argsort(key, kind="stable")
            gather, new_offsets = reorder(np, offsets_from_lengths(np, length_of), order)
            yield token_ids[gather], mask[gather], new_offsets, label[order] if self.labels else None

    def files(self) -> list[Path]:
        """The bucket files this scatter has written (removed once the run's output is complete)."""
        return [self.path(b) for b, length in enumerate(self.lengths) if length]
