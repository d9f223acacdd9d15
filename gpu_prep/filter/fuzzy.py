"""fuzzy: near-duplicate removal (preprocessing.fuzzy_dedup) by MinHash signatures over word n-grams and
locality-sensitive hashing of their bands, written once against the array module `xp` (numpy or cupy).

- Words: what Python's str.split() gives (runs of characters that are not whitespace, str.isspace()),
  found in the row's own text as UTF-8 bytes (the text exact dedup hashes: a conversation without its
  system messages). No case folding or other normalisation. Shingles: each run of `ngram` consecutive
  words; a row of fewer words has one shingle of them all; a row of no words has no signature and is never
  a near-duplicate.
- Hashes, 64-bit: a word hashes as a polynomial over its bytes (prefix sums, so a word of any length costs
  its bytes), mixed (splitmix64) with its length; a shingle as its words folded in order.
  Permutation p maps a shingle hash h to the high 32 bits of a_p * h + b_p (mod 2**64, a_p odd: multiply-
  shift hashing); a row's signature holds, per permutation, the least value over its shingles.
- LSH: the signature's first bands * rows values cut into `bands` bands of `rows`; a band's key is its
  values folded with the band's number. Two rows of Jaccard similarity s share at least one key with
  probability 1 - (1 - s**rows)**bands; `bands` unset is chosen as datasketch chooses it (least area of
  false positives below the threshold plus false negatives above it, each weighted one half).

Deciding, in input order over the rows that would be written (after the length rules, exact dedup and
every later stage): a row that shares a band key with a row kept earlier is dropped as `near_duplicate`,
naming that row (file and line); the others are kept and their keys remembered. So every row named is in
the output, and every row dropped shares a band with it. The keys live in a filter.DigestSet (16 bytes a
key: the key, then the kept row's place), bounded by preprocessing.dedup_memory_mb and spilled past it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.filter.dedup import DigestSet
from gpu_prep.splitmix import splitmix64
from gpu_prep.ragged import offsets_from_lengths, row_of, segment_mins

# What Python's str.split() splits at (str.isspace()): these bytes, and the UTF-8 of the characters below.
WHITESPACE = (9, 10, 11, 12, 13, 28, 29, 30, 31, 32)
WIDE_SPACES = tuple(int.from_bytes(chr(c).encode(), "big") for c in (
    0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000))
BASE = 0x100000001B3  # odd: invertible modulo 2**64
BASE_INVERSE = pow(BASE, -1, 1 << 64)
FOLD = 0x9E3779B97F4A7C15
# Text hashed at a time (about 40 bytes of work arrays per byte): on the CPU a batch whose arrays stay in
# cache; on a GPU a larger one, since every batch costs a few hundred kernel launches (not measured yet).
BATCH_BYTES = {"cpu": 1 << 20, "gpu": 16 << 20}
NO_ROW = np.uint64(0xFFFFFFFFFFFFFFFF)  # a kept row names no other


def _u64(xp: Any, value: int) -> Any:
    return xp.uint64(value & 0xFFFFFFFFFFFFFFFF)


@functools.lru_cache(maxsize=16)
def lsh_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """The bands and rows per band (bands * rows <= num_perm) whose collision curve best separates
    similarities below the threshold from those above: least 0.5 * (false positive area) + 0.5 * (false
    negative area), as datasketch's MinHashLSH picks them."""
    best, best_cost = (1, 1), float("inf")
    for bands, rows in ((b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)):
        false_pos = _area(lambda s: 1 - (1 - s ** rows) ** bands, 0.0, threshold)
        false_neg = _area(lambda s: (1 - s ** rows) ** bands, threshold, 1.0)
        cost = 0.5 * false_pos + 0.5 * false_neg
        if cost < best_cost - 1e-12:
            best, best_cost = (bands, rows), cost
    return best


def _area(curve: Any, lo: float, hi: float, steps: int = 200) -> float:
    """The integral of curve from lo to hi (trapezoids)."""
    s = np.linspace(lo, hi, steps + 1)
    y = curve(s)
    return float(((y[1:] + y[:-1]) / 2 * np.diff(s)).sum())


@dataclass(frozen=True)
class MinHasher:
    ngram: int
    num_perm: int
    bands: int
    rows: int  # per band
    seed: int

    @classmethod
    def from_config(cls, rules: Any) -> MinHasher:
        bands, rows = (rules.bands, rules.num_perm // rules.bands) if rules.bands is not None \
            else lsh_bands(rules.threshold, rules.num_perm)
        return cls(rules.ngram, rules.num_perm, bands, rows, rules.seed)

    def parameters(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The permutations' multipliers (odd) and addends, and each band's starting key: a splitmix64
        stream from the seed, so a config gives the same values everywhere."""
        counter = (np.arange(2 * self.num_perm + self.bands + 1, dtype=np.uint64) + np.uint64(1)) * np.uint64(FOLD)
        stream = splitmix64(np, counter + _u64(np, self.seed * FOLD))
        a = stream[:self.num_perm] | np.uint64(1)
        b = stream[self.num_perm:2 * self.num_perm]
        return a, b, stream[2 * self.num_perm:]

    def signatures(self, xp: Any, data: Any, offsets: Any) -> tuple[Any, Any]:
        """For texts given as UTF-8 bytes (uint8) and int64 offsets: each text's MinHash signature (texts x
        bands * rows, uint32; all 0xFFFFFFFF for a text of no words)."""
        a, b, _ = self.parameters()
        hashes, shingle_offsets = shingle_hashes(xp, data, offsets, self.ngram)
        n, width = len(offsets) - 1, self.bands * self.rows
        rows = row_of(xp, shingle_offsets, len(hashes))  # what segment_mins scatters by where it scatters
        signature = xp.empty((width, n), dtype=xp.uint32)
        for p in range(width):  # a permutation at a time: its values stay in cache
            values = ((hashes * _u64(xp, int(a[p])) + _u64(xp, int(b[p]))) >> _u64(xp, 32)).astype(xp.uint32)
            signature[p] = segment_mins(xp, values, shingle_offsets, 0xFFFFFFFF, rows)
        return signature.T, xp.diff(shingle_offsets) > 0  # and which texts have words

    def band_keys(self, xp: Any, data: Any, offsets: Any) -> tuple[Any, Any]:
        """For texts as in signatures: each text's band keys (texts x bands, uint64) and whether it has any (a
        text of no words has none)."""
        signature, signed = self.signatures(xp, data, offsets)
        n = len(signed)
        bands = signature.reshape(n, self.bands, self.rows).astype(xp.uint64)
        keys = xp.broadcast_to(xp.asarray(self.parameters()[2][:self.bands])[None, :], (n, self.bands))
        for r in range(self.rows):
            keys = splitmix64(xp, keys * _u64(xp, FOLD) + bands[:, :, r])
        return keys, signed


def shingle_hashes(xp: Any, data: Any, offsets: Any, ngram: int) -> tuple[Any, Any]:
    """The 64-bit hash of every word n-gram of every text (texts as in MinHasher.band_keys), in order, and
    each text's offsets into them."""
    n, size = len(offsets) - 1, len(data)
    space = xp.zeros(size + 1, dtype=bool)
    space[:size] = _spaces(xp, data)
    space[size] = True
    boundary = xp.zeros(size + 2, dtype=bool)  # where each text begins (and the end)
    boundary[offsets] = True
    boundary[size + 1] = True
    word = ~space  # byte i is in a word; one past the last byte (the sentinel) is not
    before = xp.concatenate([xp.ones(1, dtype=bool), space[:-1]]) | boundary[:size + 1]  # i - 1 is not in it
    after = xp.concatenate([space[1:], xp.ones(1, dtype=bool)]) | boundary[1:]  # i + 1 is not in it
    starts = xp.flatnonzero(word & before)
    ends = xp.flatnonzero(word & after) + 1
    # Polynomial hash of each word from prefix sums: sum of (byte + 1) * BASE**i over the word, brought back
    # to its own first byte by BASE**-start (BASE is odd, so it has an inverse modulo 2**64).
    prefix = xp.zeros(size + 1, dtype=xp.uint64)
    xp.cumsum((data.astype(xp.uint64) + _u64(xp, 1)) * _powers(xp, BASE, size), out=prefix[1:])
    inverse = _powers(xp, BASE_INVERSE, size + 1)[starts]
    lengths = (ends - starts).astype(xp.uint64)
    words = splitmix64(xp, (prefix[ends] - prefix[starts]) * inverse ^ (lengths * _u64(xp, FOLD)))
    # Words per text, then each text's shingles: max(words - ngram + 1, 1) of them, or none.
    per_text = xp.bincount(xp.searchsorted(offsets, starts, side="right") - 1, minlength=n)[:n]
    word_offsets = offsets_from_lengths(xp, per_text)
    count = xp.where(per_text >= ngram, per_text - ngram + 1, xp.minimum(per_text, 1))
    shingle_offsets = offsets_from_lengths(xp, count)
    total = int(shingle_offsets[-1])
    text = row_of(xp, shingle_offsets, total)
    first = word_offsets[:-1][text] + (xp.arange(total, dtype=xp.int64) - shingle_offsets[:-1][text])
    width = xp.minimum(per_text, ngram)[text]
    hashes = xp.full(total, FOLD, dtype=xp.uint64)
    last = max(len(words) - 1, 0)
    for j in range(ngram):
        folded = splitmix64(xp, hashes * _u64(xp, FOLD) + words[xp.minimum(first + j, last)]) if len(words) else hashes
        hashes = xp.where(width > j, folded, hashes)
    return hashes, shingle_offsets


def _spaces(xp: Any, data: Any) -> Any:
    """Which bytes of UTF-8 text belong to a whitespace character (as str.isspace() has it)."""
    table = xp.zeros(256, dtype=bool)
    table[xp.asarray(WHITESPACE)] = True
    space = table[data]
    lead = xp.zeros(256, dtype=bool)
    lead[xp.asarray([0xC2, 0xE1, 0xE2, 0xE3])] = True  # the first bytes of WIDE_SPACES
    at = xp.flatnonzero(lead[data])
    if not len(at):
        return space
    last = len(data) - 1
    b0, b1, b2 = (data[xp.minimum(at + k, last)].astype(xp.int64) for k in range(3))
    wide = xp.asarray(WIDE_SPACES, dtype=xp.int64)
    two = xp.isin((b0 << 8) | b1, wide) & (b0 == 0xC2)
    three = xp.isin((b0 << 16) | (b1 << 8) | b2, wide) & (b0 != 0xC2)
    for k, hit in ((0, two | three), (1, two | three), (2, three)):
        space[at[hit] + k] = True
    return space


_POWERS: dict[tuple[str, int], Any] = {}  # by array module and base: the longest run of powers made so far


def _powers(xp: Any, base: int, n: int) -> Any:
    """base ** 0, base ** 1, ... base ** (n - 1), modulo 2**64 (made once per batch size, then sliced)."""
    made = _POWERS.get((xp.__name__, base))
    if made is None or len(made) < n:
        # base ** (4096 i + j) = (base ** 4096) ** i * base ** j: two short running products and one multiply.
        low = xp.full(4096, base, dtype=xp.uint64)
        low[:1] = 1
        high = xp.full(-(-max(n, BATCH_BYTES["cpu"] + 1) // 4096), pow(base, 4096, 1 << 64), dtype=xp.uint64)
        high[:1] = 1
        made = _POWERS[(xp.__name__, base)] = (xp.cumprod(high)[:, None] * xp.cumprod(low)[None, :]).reshape(-1)
    return made[:n]


def encode_texts(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Texts as one UTF-8 byte array and int64 offsets (lone surrogates kept as their bytes)."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    lengths = np.fromiter((len(e) for e in encoded), np.int64, len(encoded))
    return np.frombuffer(b"".join(encoded), np.uint8), offsets_from_lengths(np, lengths)


def text_band_keys(backend: Any, hasher: MinHasher, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """MinHasher.band_keys of texts on the backend's device, a batch of about BATCH_BYTES at a time, back on
    the host."""
    keys, signed = [], []
    lo = 0
    while lo < len(texts):
        hi, size = lo, 0
        while hi < len(texts) and (hi == lo or size + len(texts[hi]) <= BATCH_BYTES.get(backend.name, BATCH_BYTES["cpu"])):
            size += len(texts[hi])
            hi += 1
        data, offsets = encode_texts(texts[lo:hi])
        k, s = hasher.band_keys(backend.xp, backend.asarray(data), backend.asarray(offsets))
        keys.append(backend.to_host(k))
        signed.append(backend.to_host(s))
        lo = hi
    if not keys:
        return np.zeros((0, hasher.bands), np.uint64), np.zeros(0, bool)
    return np.concatenate(keys), np.concatenate(signed)


class NearIndex:
    """The band keys of the rows kept so far, each with the kept row's place (file index << 32 | line), as
    16-byte records in a DigestSet: memory bounded by its budget, spilled past it. `added` collects the
    records remembered since the caller last took them (the checkpoint logs them; resume reloads them)."""

    def __init__(self, records: Any = (), budget_bytes: int | None = None, spill_dir: Path | None = None) -> None:
        self.seen = DigestSet(records, budget_bytes, spill_dir, name="near")
        self.added: list[bytes] = []

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """The place of the kept row holding each key (uint64), NO_ROW where none does."""
        found = np.full(len(keys), NO_ROW, dtype=np.uint64)
        for nearest in self.seen.nearest(_records(keys, np.zeros(len(keys), np.uint64))):
            hit = nearest.view(">u8").reshape(-1, 2)  # (key, place): the probe (key, 0) finds its key's record
            match = hit[:, 0] == keys
            found[match] = hit[match, 1]
        return found

    def decide(self, keys: np.ndarray, signed: np.ndarray, places: np.ndarray) -> np.ndarray:
        """For rows in order (keys: rows x bands; places: each row's own): the place of the kept row each
        shares a band with, NO_ROW for the rows kept; the kept rows' keys are remembered. A row is named by
        its lowest band that a kept row holds, whether that row was kept in an earlier call or in this one,
        so names do not depend on how the rows are cut into calls."""
        n, bands = keys.shape
        named = np.full(n, NO_ROW, dtype=np.uint64)
        if not n:
            return named
        earlier = self.lookup(keys.reshape(-1)).reshape(n, bands)
        rows = np.flatnonzero(signed)
        # Rows that share a band's key with another row of this call are settled one by one, in order.
        flat = keys[rows].reshape(-1)
        band = np.tile(np.arange(bands), len(rows))
        order = np.lexsort((band, flat))
        same = (flat[order][1:] == flat[order][:-1]) & (band[order][1:] == band[order][:-1])
        shared = np.zeros(len(order), dtype=bool)
        shared[1:] |= same
        shared[:-1] |= same
        contested = np.zeros(len(rows), dtype=bool)
        contested[order[shared] // bands] = True
        # The others share keys with no row of this call: named by the lowest band an earlier call's row holds.
        plain = rows[~contested]
        hit = earlier[plain] != NO_ROW
        found = hit.any(axis=1)
        named[plain[found]] = earlier[plain[found], np.argmax(hit[found], axis=1)]
        holder: dict[tuple[int, int], int] = {}  # (band, key) -> the row of this call that was kept with it
        for row in rows[contested].tolist():
            own = [(j, int(keys[row, j])) for j in range(bands)]
            for j, key in own:
                if earlier[row, j] != NO_ROW or (j, key) in holder:
                    named[row] = earlier[row, j] if earlier[row, j] != NO_ROW else places[holder[(j, key)]]
                    break
            else:
                holder.update(dict.fromkeys(own, row))
        keep_rows = rows[named[rows] == NO_ROW]
        if len(keep_rows):
            records = _records(keys[keep_rows].reshape(-1), np.repeat(places[keep_rows], bands))
            self.seen.add(records)
            self.added.append(records.tobytes())
        return named

    def take_added(self) -> list[bytes]:
        added, self.added = self.added, []
        return added


def _records(keys: np.ndarray, places: np.ndarray) -> np.ndarray:
    """16-byte records: the key, then the place, big-endian (so records sort by key, then place)."""
    pairs = np.empty((len(keys), 2), dtype=">u8")
    pairs[:, 0], pairs[:, 1] = keys, places
    return pairs.reshape(-1).view("V16")
