"""A fast engine is trusted only where it is seen to equal HF tokenizers, twice over:
- before a run uses it, `choose_engine` compares it with HF on the first 256 KiB of the run's own input and
  falls back (to the next fast engine, then HF) on any difference;
- while the run goes, an `Audit` re-encodes a seeded share of every chunk's pieces with HF in a thread of its
  own, and a chunk is masked and written only once its check is in. A difference stops trusting the fast
  engine: that chunk and every later one are encoded by HF (or, under --strict, the run stops).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.splitmix import splitmix64
from gpu_prep.tokenization.builds import candidates, fast_engine, forget_build
from gpu_prep.tokenization.engines import HfEngine, refuse_ranks

AUDIT_RATE = 0.01  # share of pieces the audit re-encodes with HF
AUDIT_SEED = 0x5EED


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


def choose_engine(requested: str, spec: dict[str, Any], path: Path, hf: HfEngine, pieces: list[str],
                  sample_size: int, threads: int | None, cache_key: Any) -> tuple[Any, str, tuple[np.ndarray, np.ndarray]]:
    """The engine to run, a sentence saying why, and `pieces` encoded by that engine. `requested`: auto |
    hf | fastokens | tiktoken.

    A fast engine is used only if it equals HF on the first sample_size pieces (with none, as a resumed run
    restores the choice it made, it is taken as it is). HF encodes the sample in a thread of its own while
    the fast engine encodes all the pieces, so the check adds HF's share of the work and nothing else. The
    sentence also says why each engine tried before it was not taken."""
    if requested == "hf":
        return hf, "hf: requested", hf.encode(pieces)
    sample = pieces[:sample_size]
    reasons, reference = [], None
    with ThreadPoolExecutor(1, thread_name_prefix="gpu-prep-engine-check") as pool:
        for name in candidates(requested):
            built, problem = fast_engine(name, spec, path, cache_key)
            if built is None:
                reasons.append(f"{name} cannot run this tokenizer ({problem})")
                continue
            if sample and reference is None:
                reference = pool.submit(hf.encode, sample)
            fast = built.with_threads(threads)
            encoded = fast.encode(pieces)
            if getattr(fast, "note", None):
                reasons.append(fast.note)
            if reference is None:
                return fast, "; ".join([f"{name}: chosen earlier in this run", *reasons]), encoded
            counts = encoded[1][:len(sample)]
            difference = first_difference((encoded[0][:int(counts.sum())], counts), reference.result(), sample)
            if difference is None:
                return fast, "; ".join([f"{name}: identical to HF on a sample of {len(sample)} pieces of this input",
                                        *reasons]), encoded
            if getattr(fast, "ranks", None):
                # Built from a cached rank file that is not this tokenizer (its ids are not in merge order):
                # drop the file and choose again, fastokens now built from the tokenizer.json.
                refuse_ranks(Path(fast.ranks), f"fastokens built from it differs from HF ({difference})")
                forget_build(name, cache_key)
                active, choice, encoded = choose_engine(requested, spec, path, hf, pieces, sample_size, threads,
                                                        cache_key)
                return active, f"{choice}; a cached rank file made fastokens differ from HF and was dropped", encoded
            reasons.append(f"{name} differs from HF on this input ({difference}); falling back")
    return hf, "hf: " + "; ".join(reasons), hf.encode(pieces)


class Audit:
    """Checks a fast engine all the way through a run: a seeded share of the pieces is encoded again by HF,
    in a thread of its own. Which pieces is decided by each piece's key (its row's place in the input and
    its number in the row), so the same pieces are checked however the run is chunked, spread over workers
    or interrupted. Batches are checked in the order submitted: once one differs, every later one is known
    to come from an engine no longer trusted."""

    def __init__(self, hf: HfEngine, engine: str, rate: float | None = None, seed: int = AUDIT_SEED) -> None:
        self.hf, self.engine, self.seed = hf, engine, seed
        self.rate = AUDIT_RATE if rate is None else rate
        self.difference: str | None = None  # the first difference seen: the engine is no longer trusted
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="gpu-prep-engine-audit")

    def picks(self, keys: np.ndarray) -> np.ndarray:
        """The places of the pieces (by their uint64 keys) that are checked."""
        mixed = splitmix64(np, keys.astype(np.uint64) ^ np.uint64(self.seed))
        return np.flatnonzero((mixed >> np.uint64(11)) < np.uint64(int(self.rate * (1 << 53))))

    def submit(self, pieces: list[str], keys: np.ndarray, ids: np.ndarray, counts: np.ndarray,
               then: Callable[[dict[str, Any]], Any]) -> Future:
        """Check these pieces' encoding (flat ids, tokens per piece) in the background; the future gives
        then(check), check saying how many pieces were checked and the difference (None: HF agrees on this
        batch and every earlier one)."""
        return self._pool.submit(self._check, pieces, keys, ids, counts, then)

    def _check(self, pieces: list[str], keys: np.ndarray, ids: np.ndarray, counts: np.ndarray,
               then: Callable[[dict[str, Any]], Any]) -> Any:
        checked = 0
        if self.difference is None:
            picked = self.picks(keys)
            piece_picked = np.zeros(len(counts), dtype=bool)
            piece_picked[picked] = True
            got = (ids[np.repeat(piece_picked, counts)], counts[picked])
            texts = [pieces[i] for i in picked]
            difference = first_difference(got, self.hf.encode(texts), texts)
            checked = len(picked)
            if difference is not None:
                self.difference = f"{self.engine} differs from HF: {difference}"
        return then({"engine": self.engine, "share": self.rate, "seed": self.seed, "pieces_checked": checked,
                     "difference": self.difference})


def add_checks(total: dict[str, Any] | None, check: dict[str, Any]) -> dict[str, Any]:
    """Two engine checks' summaries as one (the pieces counted, the first difference kept)."""
    if total is None:
        return dict(check)
    return {**total, "pieces_checked": total["pieces_checked"] + check["pieces_checked"],
            "difference": total["difference"] or check["difference"]}
