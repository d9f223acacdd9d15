"""Tokenizer engines: HF tokenizers (the reference, any tokenizer.json) and two faster exact engines,
fastokens (reads tokenizer.json itself; BPE of several families) and tiktoken (byte-level BPE only). Each
turns text pieces into (flat int64 ids, int64 token count per piece), adding no special tokens.

A fast engine is trusted only where it is seen to equal HF, twice over:
- before a run uses it, `choose_engine` compares it with HF on the first 256 KiB of the run's own input and
  falls back (to the next fast engine, then HF) on any difference;
- while the run goes, an `Audit` re-encodes a seeded share of every chunk's pieces with HF in a thread of its
  own, and a chunk is masked and written only once its check is in. A difference stops trusting the fast
  engine: that chunk and every later one are encoded by HF (or, under --strict, the run stops).

tiktoken is built from the tokenizer.json: ranks are the vocabulary ids of each token's bytes, the split
pattern is the Split pre-tokenizer's regex, every added token is a special token, and an NFC normalizer is
applied before encoding. fastokens builds from the file, or, for tokenizers tiktoken could run too, from
such a ranks file (in about half the time: no merges list to parse), which the first run writes to the user
cache dir under the tokenizer.json's sha256 and fastokens' version. Not every such vocabulary survives the
trip (Llama-3 has tokens that no two ranked pieces make, and fastokens refuses the file): a rank file that
fastokens refuses, or whose engine differs from HF, is dropped for good (refuse_ranks), and fastokens is
built from the tokenizer.json as on a first run, so the cache never costs a run its engine. Neither built
engine can be saved, so
each is built once per process, in a thread of its own (both release the GIL) while the run reads its first
rows.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import unicodedata
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.splitmix import splitmix64

NORMAL_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # normalizers that are a Unicode normal form
FAST_ENGINES = ("fastokens", "tiktoken")  # tried in this order under tokenizer.engine auto
AUDIT_RATE = 0.01  # share of pieces the audit re-encodes with HF
AUDIT_SEED = 0x5EED


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


def _ranks(spec: dict[str, Any]) -> dict[bytes, int]:
    """Each vocabulary token's bytes -> its id (a byte-level BPE vocabulary)."""
    decode = _byte_decoder()
    return {token.translate(decode).encode("latin-1"): i for token, i in spec["model"]["vocab"].items()}


def _split_pattern(spec: dict[str, Any]) -> str:
    return spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]


def _added(spec: dict[str, Any]) -> dict[str, int]:
    return {t["content"]: t["id"] for t in spec.get("added_tokens", [])}


def _form(spec: dict[str, Any]) -> str | None:
    """The normal form gpu-prep applies before an engine built from ranks (they do not normalize)."""
    return (spec.get("normalizer") or {}).get("type")


def rank_recipe(spec: dict[str, Any], path: Path) -> dict[str, Any] | None:
    """How fastokens builds this tokenizer.json's vocabulary from a rank file instead: the file (kept by an
    earlier run, see ranks_cache_path), the arguments from_tiktoken takes and the normal form applied first
    (FastokensEngine.build, and early.py from the hint it keeps). None where the tokenizer allows no rank
    file (tiktoken_problem), or where one written for it was refused (refuse_ranks)."""
    if tiktoken_problem(spec) is not None:
        return None
    ranks = ranks_cache_path(path)
    if _refusal(ranks).exists():
        return None
    return {"ranks": str(ranks), "pattern": _split_pattern(spec), "added": _added(spec), "form": _form(spec)}


def _refusal(ranks: Path) -> Path:
    return ranks.with_suffix(".refused")


def refuse_ranks(ranks: Path, why: str) -> None:
    """This rank file does not stand for its tokenizer.json: drop it, and keep why in its place, so that no
    later run writes or builds from one for this file (rank_recipe); each builds from the tokenizer.json."""
    from gpu_prep.tokenization.bundled import keep_cache_file

    keep_cache_file(_refusal(ranks), why.encode("utf-8"))
    ranks.unlink(missing_ok=True)


def _normalized(pieces: list[str], form: str | None) -> list[str]:
    """The pieces in the Unicode normal form the tokenizer's normalizer asks for (engines built from ranks
    do not normalize)."""
    if not form:
        return pieces
    # ASCII is the same in every normal form, and isascii() reads a flag the string already has: no scan.
    return [p if p.isascii() or unicodedata.is_normalized(form, p) else unicodedata.normalize(form, p)
            for p in pieces]


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

        encoding = tiktoken.Encoding("gpu-prep", pat_str=_split_pattern(spec), mergeable_ranks=_ranks(spec),
                                     special_tokens=_added(spec))
        return cls(encoding, _form(spec), os.cpu_count() or 1)

    def with_threads(self, threads: int | None) -> TiktokenEngine:
        return TiktokenEngine(self.encoding, self.form, threads or os.cpu_count() or 1)

    def _encode_slice(self, pieces: list[str]) -> list[np.ndarray]:
        special, encode = self.encoding.special_tokens_set, self.encoding.encode_to_numpy
        return [encode(p, allowed_special=special, disallowed_special=()) for p in _normalized(pieces, self.form)]

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


class FastokensEngine:
    """fastokens: ids come back as one flat buffer (no Python int per token); its own threads
    (FASTOKENS_BPE_THREADS, read when it first encodes) run the batch. Built from the tokenizer.json, or from
    a ranks file cached by an earlier run (then `form` is the normal form gpu-prep applies first, and `ranks`
    names the file). `note` says why a rank file was not used, where one was refused."""

    name = "fastokens"

    def __init__(self, tokenizer: Any, form: str | None = None, ranks: str | None = None,
                 note: str | None = None) -> None:
        self.tokenizer, self.form, self.ranks, self.note = tokenizer, form, ranks, note

    @classmethod
    def build(cls, spec: dict[str, Any], path: Path) -> FastokensEngine:
        """From the cached ranks file where the tokenizer allows one (rank_recipe), else from the
        tokenizer.json, writing the ranks file for the next run. A ranks file fastokens refuses is dropped
        (refuse_ranks) and the engine built from the tokenizer.json instead."""
        import fastokens

        recipe, note = rank_recipe(spec, path), None
        if recipe is not None and os.path.isfile(recipe["ranks"]):
            try:
                tokenizer = fastokens.Tokenizer.from_tiktoken(recipe["ranks"], pattern=recipe["pattern"],
                                                              special_tokens=recipe["added"])
                return cls(tokenizer, recipe["form"], recipe["ranks"])  # as early.py builds it from its hint
            except Exception as exc:  # noqa: BLE001
                # fastokens rebuilds each token's merge from the ranks and names the token it could not.
                note = f"fastokens refused the cached rank file ({_first_line(exc)}); built from tokenizer.json"
                refuse_ranks(Path(recipe["ranks"]), note)
                recipe = None
        tokenizer = fastokens.Tokenizer.from_file(str(path))
        tokenizer.no_truncation()  # lengths are the pipeline's job, as for HF (tokenizer.load_tokenizer)
        tokenizer.no_padding()
        if recipe is not None:
            _write_ranks(spec, Path(recipe["ranks"]))
        return cls(tokenizer, note=note)

    def with_threads(self, threads: int | None) -> FastokensEngine:
        if threads:
            os.environ["FASTOKENS_BPE_THREADS"] = str(threads)
        return self

    def encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = self.tokenizer.encode_batch_flat(_normalized(pieces, self.form), add_special_tokens=False)
        ends = np.frombuffer(offsets, np.uint64).astype(np.int64)
        return np.frombuffer(ids, np.uint32).astype(np.int64), np.diff(ends)


def ranks_cache_path(path: Path) -> Path:
    """Where the ranks file of this tokenizer.json lives: the user cache dir, under the file's sha256 and
    the fastokens version that reads it."""
    from importlib.metadata import version

    from gpu_prep.tokenization.bundled import cache_root

    return cache_root() / "engines" / f"fastokens-{version('fastokens')}-{file_sha256(path)}.tiktoken"


def file_sha256(path: Path) -> str:
    """The file's sha256, taken once per process for each size and modification time of it (the
    tokenizer.json names both caches and goes into every meta.json)."""
    stat = path.stat()
    return _sha256_of(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_ranks(spec: dict[str, Any], path: Path) -> None:
    """The vocabulary as a tiktoken ranks file (a line per token: base64 of its bytes, its id), kept in the
    cache for the next run."""
    from gpu_prep.tokenization.bundled import keep_cache_file

    keep_cache_file(path, b"".join(base64.b64encode(token) + b" %d\n" % i for token, i in _ranks(spec).items()))


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


class Unusable(Exception):
    """A fast engine cannot run this tokenizer (the message says why)."""


def _build(name: str, spec: dict[str, Any], path: Path) -> Any:
    if name == "tiktoken":
        if (problem := tiktoken_problem(spec)) is not None:
            raise Unusable(problem)
        try:
            return TiktokenEngine.from_spec(spec)
        except ImportError:
            raise Unusable("tiktoken is not installed") from None
    try:
        return FastokensEngine.build(spec, path)
    except ImportError:
        raise Unusable("fastokens is not installed") from None
    except Exception as exc:  # noqa: BLE001  fastokens raises a bare ValueError/RuntimeError naming the part it lacks
        raise Unusable(_first_line(exc)) from None


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def in_thread(work: Callable[[], Any], name: str = "engine-build") -> Future:
    """work() in a thread of its own. Not a daemon: a daemon thread still inside a Rust engine when the
    interpreter exits is unwound through Rust's panic guard, and the process aborts ("FATAL: exception not
    rethrown") instead of exiting with its code; a run that fails early waits for the build (a second) instead."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as exc:  # noqa: BLE001  handed to whoever waits
            future.set_exception(exc)

    threading.Thread(target=run, name=f"gpu-prep-{name}").start()
    return future


_BUILDS: dict[tuple[str, Any], Future] = {}  # building one takes about a second: once per process
_BUILDS_LOCK = threading.Lock()
# Engines kept built, the most recent first: a run uses one, and a process that runs many tokenizers in turn
# (a notebook, a test suite) must not keep them all (a Qwen3 fastokens engine holds about 350 MB).
KEPT_BUILDS = 4


def _forget_old_builds() -> None:
    """Drop the oldest finished builds past KEPT_BUILDS (under _BUILDS_LOCK); one still building stays, as
    someone waits for it."""
    for key in [k for k, f in _BUILDS.items() if f.done()][:max(0, len(_BUILDS) - KEPT_BUILDS)]:
        del _BUILDS[key]


def candidates(requested: str) -> tuple[str, ...]:
    """The fast engines tokenizer.engine lets a run try, in order."""
    return FAST_ENGINES if requested == "auto" else () if requested == "hf" else (requested,)


def start_builds(requested: str, spec: dict[str, Any], path: Path, cache_key: Any) -> None:
    """Start building, in a thread of its own, the first fast engine a run may use (as part of loading the
    tokenizer; the run reads its first rows meanwhile); the next is built only once that one is out (a
    build it would not use costs a core its second). cache_key names the tokenizer.json (path, size,
    mtime): a process builds each engine of it once."""
    for name in candidates(requested)[:1]:
        with _BUILDS_LOCK:
            if (name, cache_key) not in _BUILDS:
                _forget_old_builds()
                _BUILDS[(name, cache_key)] = _started_early(name, spec, path, cache_key) \
                    or in_thread(lambda name=name: _build(name, spec, path))


def _started_early(name: str, spec: dict[str, Any], path: Path, cache_key: Any) -> Future | None:
    """The build the console script started before its imports (gpu_prep.tokenization.early), where it is this engine of
    this file; if that build failed, the usual one, started then."""
    from gpu_prep.tokenization import early

    started = early.claim(name, cache_key, lambda: rank_recipe(spec, path) if name == "fastokens" else None)
    if started is None:
        return None

    def take() -> FastokensEngine:
        try:
            tokenizer, form, ranks = started.result()
        except Exception:  # noqa: BLE001  the guess went wrong: build as a run without one does
            return _build(name, spec, path)
        # Built from the rank file: named, so that a rank file whose engine differs from HF is dropped as the
        # run's own build from it would be (choose_engine).
        return FastokensEngine(tokenizer, form, ranks)

    return in_thread(take)


def fast_engine(name: str, spec: dict[str, Any], path: Path, cache_key: Any) -> tuple[Any, str | None]:
    """(the built engine, None), or (None, why it cannot run this tokenizer)."""
    future = None
    while future is None:  # (a build forgotten, by other tokenizers' builds, before it was taken: again)
        start_builds(name, spec, path, cache_key)
        with _BUILDS_LOCK:
            future = _BUILDS.get((name, cache_key))
    try:
        return future.result(), None
    except Unusable as exc:
        return None, str(exc)


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
                with _BUILDS_LOCK:
                    _BUILDS.pop((name, cache_key), None)
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
