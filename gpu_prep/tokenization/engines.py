"""Tokenizer engines: HF tokenizers (the reference, any tokenizer.json) and two faster exact engines,
fastokens (reads tokenizer.json itself; BPE of several families) and tiktoken (byte-level BPE only). Each
turns text pieces into (flat int64 ids, int64 token count per piece), adding no special tokens. A fast
engine is built once per process (builds.py) and used only where it is seen to equal HF (checks.py).

tiktoken is built from the tokenizer.json: ranks are the vocabulary ids of each token's bytes, the split
pattern is the Split pre-tokenizer's regex, every added token is a special token, and an NFC normalizer is
applied before encoding. fastokens builds from the file, or, for tokenizers tiktoken could run too, from
such a ranks file (in about half the time: no merges list to parse), which the first run writes to the user
cache dir under the tokenizer.json's sha256 and fastokens' version. Not every such vocabulary survives the
trip (Llama-3 has tokens that no two ranked pieces make, and fastokens refuses the file): a rank file that
fastokens refuses, or whose engine differs from HF, is dropped for good (refuse_ranks), and fastokens is
built from the tokenizer.json as on a first run, so the cache never costs a run its engine.
"""

from __future__ import annotations

import base64
import hashlib
import os
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.cores import usable_cores

NORMAL_FORMS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})  # normalizers that are a Unicode normal form
FAST_ENGINES = ("fastokens", "tiktoken")  # tried in this order under tokenizer.engine auto


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
def byte_decoder() -> dict[int, int]:
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
    decode = byte_decoder()
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
        return cls(encoding, _form(spec), usable_cores())

    def with_threads(self, threads: int | None) -> TiktokenEngine:
        return TiktokenEngine(self.encoding, self.form, threads or usable_cores())

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
        tokenizer.no_truncation()  # lengths are the pipeline's job, as for HF (outline.py)
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


class Unusable(Exception):
    """A fast engine cannot run this tokenizer (the message says why)."""


def build_engine(name: str, spec: dict[str, Any], path: Path) -> Any:
    """The fast engine `name` built for this tokenizer.json; Unusable says why it cannot run it."""
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
