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

from typing import Any

import numpy as np

from gpu_prep.backend import Backend
from gpu_prep.errors import Drop



DIGEST = np.dtype("V16")  # one MD5 digest, held as 16 bytes in an array: no Python object per row


class DigestSet:
    """Fixed-size digests in sorted numpy runs (16 bytes a row). New digests form a run of their own and runs
    of like size are merged, so n digests cost O(n log n) to add in all and a lookup is a binary search per
    run (at most log2(n) runs)."""

    def __init__(self, digests: Any = ()) -> None:
        batch = np.unique(self._array(digests))  # sorted
        self.runs: list[np.ndarray] = [batch] if len(batch) else []

    @staticmethod
    def _array(digests: Any) -> np.ndarray:
        if isinstance(digests, np.ndarray):
            return digests.view(DIGEST).reshape(-1)
        return np.frombuffer(b"".join(digests), dtype=DIGEST)

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)

    def __iter__(self):  # noqa: ANN204  bytes, in no particular order
        return (item.tobytes() for run in self.runs for item in run)

    def array(self) -> np.ndarray:
        """Every digest, as one array (what another DigestSet is made from)."""
        return np.concatenate(self.runs) if self.runs else np.zeros(0, DIGEST)

    def contains(self, batch: np.ndarray) -> np.ndarray:
        found = np.zeros(len(batch), dtype=bool)
        for run in self.runs:
            at = np.minimum(np.searchsorted(run, batch), len(run) - 1)
            found |= run[at] == batch
        return found

    def _add(self, new: np.ndarray) -> None:
        self.runs.append(np.sort(new))
        while len(self.runs) > 1 and len(self.runs[-2]) <= 2 * len(self.runs[-1]):
            last = self.runs.pop()
            self.runs[-1] = np.sort(np.concatenate([self.runs[-1], last]))

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

    def __init__(self, seen: Any = ()) -> None:
        self.seen = seen if isinstance(seen, DigestSet) else DigestSet(seen)
        self.added: list[bytes] = []

    def first_seen(self, digests: list[bytes]) -> np.ndarray:
        keep = self.seen.first_seen(digests)
        self.added.extend(d for d, new in zip(digests, keep) if new)
        return keep

    def take_added(self) -> list[bytes]:
        added, self.added = self.added, []
        return added


def filter_rows(backend: Backend, texts: list[str], keys: list[str], is_pretraining: np.ndarray, config: Any,
                dedup: Deduplicator | None) -> list[str | None]:
    """A drop reason, or None, for each row; rows are checked in order so dedup keeps first occurrences.

    texts: what the length rules measure; keys: what dedup hashes a prefix of."""
    rules = config.preprocessing
    chars, digests = backend.text_stats(texts, keys, rules.dedup_prefix_chars, digests=dedup is not None)
    reasons: list[str | None] = [None] * len(texts)
    too_short = is_pretraining & (chars < rules.min_chars)
    too_long = chars > rules.max_chars
    for i in np.nonzero(too_short)[0]:
        reasons[i] = Drop.TOO_SHORT
    for i in np.nonzero(too_long & ~too_short)[0]:
        reasons[i] = Drop.TOO_LONG
    if dedup is not None:
        candidates = [i for i, r in enumerate(reasons) if r is None]
        for i, first in zip(candidates, dedup.first_seen([digests[i] for i in candidates])):
            if not first:
                reasons[i] = Drop.DUPLICATE
    return reasons
