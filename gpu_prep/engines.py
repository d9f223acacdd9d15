"""Tokenizer engines: HF tokenizers (the reference, any tokenizer.json) and tiktoken (byte-level BPE only,
several times faster). Each turns text pieces into (flat int64 ids, int64 token count per piece), adding no
special tokens.

tiktoken is built from the tokenizer.json itself: ranks are the vocabulary ids of each token's bytes, the
split pattern is the Split pre-tokenizer's regex, every added token is a special token, and an NFC
normalizer is applied before encoding. Whether that reproduces HF exactly is checked, not assumed: before
a run uses it, `choose_engine` compares both on a sample of the run's own input and falls back to HF on
any difference.
"""

from __future__ import annotations

import os
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np

NORMAL_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # normalizers that are a Unicode normal form


def _pack(batches: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    counts = np.fromiter((len(b) for b in batches), np.int64, len(batches))
    return np.fromiter(chain.from_iterable(batches), np.int64, int(counts.sum())), counts


class HfEngine:
    name = "hf"

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return _pack([e.ids for e in self.engine.encode_batch_fast(pieces, add_special_tokens=False)])

    def encode_offsets(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """encode() plus the start and end character, in its piece, of every token."""
        encodings = self.engine.encode_batch(pieces, add_special_tokens=False)
        ids, counts = _pack([e.ids for e in encodings])
        flat = np.fromiter(chain.from_iterable(chain.from_iterable(e.offsets for e in encodings)), np.int64,
                           2 * len(ids)).reshape(-1, 2)
        return ids, counts, flat[:, 0].copy(), flat[:, 1].copy()


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[int, int]:
    """The byte-level BPE alphabet, inverted: code point of each printable stand-in -> the byte it stands
    for, as a str.translate table that maps a vocabulary token to a latin-1 string of its bytes."""
    printable = {*range(33, 127), *range(161, 173), *range(174, 256)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = b
        else:
            table[256 + extra] = b
            extra += 1
    return table


def tiktoken_problem(spec: dict[str, Any]) -> str | None:
    """Why this tokenizer.json cannot be run by tiktoken, or None."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        return f"model is {model.get('type')}, not BPE"
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    if kinds != ["Split", "ByteLevel"] or steps[1].get("use_regex", True) or "Regex" not in steps[0].get("pattern", {}):
        return f"pre-tokenizer {kinds} is not one regex Split followed by ByteLevel"
    if steps[0].get("behavior") != "Isolated" or steps[0].get("invert"):
        return "the Split pre-tokenizer does not isolate its matches"
    normalizer = spec.get("normalizer") or {}
    if normalizer and normalizer.get("type") not in NORMAL_FORMS:
        return f"normalizer {normalizer.get('type')} is not a Unicode normal form"
    if any(t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in spec.get("added_tokens", [])):
        return "an added token strips spaces or matches single words only"
    return None


@dataclass
class TiktokenEngine:
    encoding: Any  # tiktoken.Encoding
    form: str | None
    threads: int
    name: str = "tiktoken"
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> TiktokenEngine:
        import tiktoken

        decode = _byte_decoder()
        ranks = {token.translate(decode).encode("latin-1"): i for token, i in spec["model"]["vocab"].items()}
        steps = spec["pre_tokenizer"]["pretokenizers"]
        special = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
        encoding = tiktoken.Encoding("gpu-prep", pat_str=steps[0]["pattern"]["Regex"], mergeable_ranks=ranks,
                                     special_tokens=special)
        form = (spec.get("normalizer") or {}).get("type")
        return cls(encoding, form, os.cpu_count() or 1)

    def _encode_slice(self, pieces: list[str]) -> list[np.ndarray]:
        form, special, encode = self.form, self.encoding.special_tokens_set, self.encoding.encode_to_numpy
        if form:
            pieces = [p if unicodedata.is_normalized(form, p) else unicodedata.normalize(form, p) for p in pieces]
        return [encode(p, allowed_special=special, disallowed_special=()) for p in pieces]

    def encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # Each thread takes a run of pieces and gets numpy buffers back (the BPE itself runs without the
        # GIL): no Python int per token and no future per piece, which together cost a quarter of the time
        # encode_batch takes on chat rows.
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="gpu-prep-tiktoken")
        step = max(1, -(-len(pieces) // (self.threads * 8)))
        runs = self._pool.map(self._encode_slice, [pieces[i:i + step] for i in range(0, len(pieces), step)])
        arrays = [a for run in runs for a in run]
        counts = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        ids = np.concatenate(arrays).astype(np.int64) if arrays else np.zeros(0, np.int64)
        return ids, counts


def first_difference(a: Any, b: Any, pieces: list[str]) -> str | None:
    """None when two engines' outputs agree; else which piece differs first."""
    (ids_a, counts_a), (ids_b, counts_b) = a, b
    if np.array_equal(counts_a, counts_b) and np.array_equal(ids_a, ids_b):
        return None
    ends_a, ends_b = np.cumsum(counts_a), np.cumsum(counts_b)
    for i, piece in enumerate(pieces):
        start_a, start_b = ends_a[i] - counts_a[i], ends_b[i] - counts_b[i]
        if not np.array_equal(ids_a[start_a:ends_a[i]], ids_b[start_b:ends_b[i]]):
            return f"piece {i} ({piece[:60]!r}...) tokenizes differently"
    return "the outputs differ"


_BUILT: dict[Any, TiktokenEngine] = {}  # building one takes a good part of a second: once per process


def build_fast_engine(requested: str, spec: dict[str, Any], cache_key: Any) -> TiktokenEngine | None:
    """The tiktoken engine choose_engine will consider, built once per process (as part of loading the
    tokenizer, before any input is read); None when tiktoken cannot run this tokenizer."""
    if requested == "hf" or tiktoken_problem(spec) is not None:
        return None
    if cache_key is None or cache_key not in _BUILT:
        try:
            built = TiktokenEngine.from_spec(spec)
        except ImportError:
            return None
        if cache_key is None:
            return built
        _BUILT[cache_key] = built
    return _BUILT[cache_key]


def choose_engine(requested: str, spec: dict[str, Any], hf: HfEngine, pieces: list[str], sample_size: int,
                  threads: int | None = None, cache_key: Any = None) -> tuple[Any, str, tuple[np.ndarray, np.ndarray]]:
    """The engine to run, a sentence saying why, and `pieces` encoded by that engine. `requested`: auto |
    hf | tiktoken.

    The fast engine is used only if it equals HF on the first sample_size pieces. HF encodes those in a
    thread of its own while the fast engine encodes all the pieces, so the check adds HF's share of the
    work and nothing else. cache_key identifies the tokenizer.json (path, size, mtime) so a process builds
    its tiktoken once."""
    if requested == "hf":
        return hf, "hf: requested", hf.encode(pieces)
    built = build_fast_engine(requested, spec, cache_key)
    if built is None:
        problem = tiktoken_problem(spec) or "tiktoken is not installed"
        return hf, f"hf: tiktoken cannot run this tokenizer ({problem})", hf.encode(pieces)
    fast = TiktokenEngine(built.encoding, built.form, threads or os.cpu_count() or 1)
    sample = pieces[:sample_size]
    with ThreadPoolExecutor(1, thread_name_prefix="gpu-prep-engine-check") as pool:
        reference = pool.submit(hf.encode, sample)
        encoded = fast.encode(pieces)
        want = reference.result()
    counts = encoded[1][:len(sample)]
    difference = first_difference((encoded[0][:int(counts.sum())], counts), want, sample)
    if difference is not None:
        return hf, f"hf: tiktoken differs from HF on this input ({difference}); falling back", hf.encode(pieces)
    return fast, f"tiktoken: identical to HF on a sample of {len(sample)} pieces of this input", encoded
