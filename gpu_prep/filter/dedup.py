"""filter: length rules and exact prefix-hash deduplication, over each row's own text.

The text a rule looks at is the row's source text, before any chat template (templates add the same
headers and default system prompt to every row, which would make prefixes collide): a text row's text,
an instruction's prompt followed by its response, a conversation's message contents joined by newlines
(for dedup, without system messages: a system prompt shared by a whole dataset would make every row a
duplicate).

- min_chars: rows shorter than this are dropped; pretraining text only (as the v1 schema says), since
  short chat turns are normal.
- max_chars: rows longer than this are dropped, whatever the input type.
- deduplicate: a row whose first 200 characters (code points; preprocessing.dedup_prefix_chars, null: the
  whole text) have the MD5 of an earlier row's first 200 characters is dropped. The first occurrence in input order among rows that pass the length rules wins,
  even when a later stage drops it (nothing left to train, a template that refuses it).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.backend import Backend
from gpu_prep.durable import claim, temporary_name, writing
from gpu_prep.errors import Drop

DIGEST = np.dtype("V16")  # one MD5 digest, held as 16 bytes in an array: no Python object per row


class DigestSet:
    """Fixed-size digests in sorted numpy runs (16 bytes a row). New digests form a run of their own and runs
    of like size are merged, so n digests cost O(n log n) to add in all and a lookup is a binary search per
    run (at most log2(n) runs). With a budget, the runs in memory are merged into one sorted file (memory-
    mapped: lookups read the pages they touch) whenever they pass it, so memory stays about the budget
    whatever the number of rows (preprocessing.dedup_memory_mb); spill_dir holds those files."""

    def __init__(self, digests: Any = (), budget_bytes: int | None = None, spill_dir: Path | None = None,
                 name: str = "seen") -> None:
        """name: what its spilled files are called after (gpu-prep-NAME-00000)."""
        self.budget, self.spill_dir, self.name = budget_bytes, spill_dir, name
        self.runs: list[np.ndarray] = []
        self.spilled: list[np.ndarray] = []  # sorted runs on disk (np.memmap)
        batch = self._array(digests)
        step = max(1, budget_bytes // DIGEST.itemsize) if budget_bytes else max(1, len(batch))
        for lo in range(0, len(batch), step):  # a slice at a time: a resumed run's whole log is never sorted in memory
            self._add(np.unique(np.asarray(batch[lo:lo + step])))

    @staticmethod
    def _array(digests: Any) -> np.ndarray:
        if isinstance(digests, np.ndarray):
            return digests.view(DIGEST).reshape(-1)
        return np.frombuffer(b"".join(digests), dtype=DIGEST)

    def __len__(self) -> int:
        return sum(len(run) for run in (*self.runs, *self.spilled))

    def __iter__(self):  # noqa: ANN204  bytes, in no particular order
        return (item.tobytes() for run in (*self.runs, *self.spilled) for item in run)

    def array(self) -> np.ndarray:
        """Every digest, as one array in memory (what another DigestSet is made from)."""
        runs = [*self.runs, *(np.asarray(run) for run in self.spilled)]
        return np.concatenate(runs) if runs else np.zeros(0, DIGEST)

    def copy(self) -> DigestSet:
        """Another set of these digests that can grow on its own (a few chunks' worth: it keeps what it adds in
        memory): the runs in memory copied (within the budget), the spilled files shared (never written again)."""
        other = DigestSet(name=self.name)
        other.runs, other.spilled = [run.copy() for run in self.runs], list(self.spilled)
        return other

    def nearest(self, batch: np.ndarray) -> Iterator[np.ndarray]:
        """Per run (in memory or spilled): for each item of batch, the run's least item not below it (its
        last where none is)."""
        for run in (*self.runs, *self.spilled):
            if len(run):
                yield np.asarray(run[np.minimum(np.searchsorted(run, batch), len(run) - 1)])

    def contains(self, batch: np.ndarray) -> np.ndarray:
        found = np.zeros(len(batch), dtype=bool)
        for nearest in self.nearest(batch):
            found |= nearest == batch
        return found

    def add(self, items: Any) -> None:
        """Remember items the set does not hold yet (the caller knows they are new)."""
        self._add(self._array(items))

    def _add(self, new: np.ndarray) -> None:
        if not len(new):
            return
        self.runs.append(np.sort(new))
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]))
        if self.budget is not None and sum(run.nbytes for run in self.runs) > self.budget:
            self._spill()

    def _spill(self) -> None:
        """The runs in memory, merged, to a file of their own, memory-mapped."""
        merged = np.sort(np.concatenate(self.runs)) if len(self.runs) > 1 else self.runs[0]
        directory = self.spill_dir if self.spill_dir is not None else Path(tempfile.mkdtemp(prefix="gpu-prep-seen-"))
        path = directory / temporary_name(f"gpu-prep-{self.name}-{len(self.spilled):05d}")
        claim(path)
        with writing(path), open(path, "wb") as handle:
            handle.write(merged.tobytes())
        self.spilled.append(np.memmap(path, dtype=DIGEST, mode="r"))
        self.runs = []

    def files(self) -> list[Path]:
        """The files the set spilled to (removed once the run is done)."""
        return [Path(run.filename) for run in self.spilled]

    def first_seen(self, digests: Any) -> np.ndarray:
        """For each digest, in order: True where neither the set nor an earlier one of these holds it (and
        remember those)."""
        batch = self._array(digests)
        first = np.zeros(len(batch), dtype=bool)
        if len(batch):
            first[np.unique(batch, return_index=True)[1]] = True
            first &= ~self.contains(batch)
            if first.any():
                self._add(batch[first])
        return first


class Deduplicator:
    """Remembers the digests of rows already kept, across chunks and input files. `added` collects the
    digests remembered since the caller last took them (a checkpoint logs them, --resume reloads them)."""

    def __init__(self, seen: Any = (), budget_bytes: int | None = None, spill_dir: Path | None = None) -> None:
        """budget_bytes, spill_dir: the seen-set's memory budget and where it spills past it (DigestSet)."""
        self.seen = seen if isinstance(seen, DigestSet) else DigestSet(seen, budget_bytes, spill_dir)
        self.added: list[bytes] = []

    def first_seen(self, digests: list[bytes]) -> np.ndarray:
        keep = self.seen.first_seen(digests)
        self.added.extend(d for d, new in zip(digests, keep) if new)
        return keep

    def take_added(self) -> list[bytes]:
        added, self.added = self.added, []
        return added


def length_drops(backend: Backend, chars: np.ndarray, is_pretraining: np.ndarray, min_chars: int,
                 max_chars: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows the length rules drop, as (too short, too long) row indices, a row in one at most: compared
    as columns on the backend's device (min_chars holds for pretraining text only)."""
    xp = backend.xp
    chars, pretraining = backend.asarray(chars), backend.asarray(is_pretraining)
    top = int(np.iinfo(np.int64).max)  # CuPy refuses Python ints past int64 (the config allows them)
    min_chars, max_chars = min(min_chars, top), min(max_chars, top)
    too_short = pretraining & (chars < min_chars)
    too_long = (chars > max_chars) & ~too_short
    return backend.to_host(xp.nonzero(too_short)[0]), backend.to_host(xp.nonzero(too_long)[0])


def filter_rows(backend: Backend, chars: np.ndarray, keys: list[str], is_pretraining: np.ndarray, config: Any,
                dedup: Deduplicator | None) -> list[str | None]:
    """A drop reason, or None, for each row; rows are checked in order so dedup keeps first occurrences.

    chars: each row's length in characters, what the length rules measure; keys: what dedup hashes a
    prefix of (only read with dedup)."""
    rules = config.preprocessing
    digests = backend.digests(keys, rules.dedup_prefix_chars) if dedup is not None else []
    reasons: list[str | None] = [None] * len(chars)
    too_short, too_long = length_drops(backend, chars, is_pretraining, rules.min_chars, rules.max_chars)
    for i in too_short.tolist():
        reasons[i] = Drop.TOO_SHORT
    for i in too_long.tolist():
        reasons[i] = Drop.TOO_LONG
    if dedup is not None:
        candidates = [i for i, r in enumerate(reasons) if r is None]
        for i, first in zip(candidates, dedup.first_seen([digests[i] for i in candidates])):
            if not first:
                reasons[i] = Drop.DUPLICATE
    return reasons
