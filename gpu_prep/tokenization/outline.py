"""What a run needs to know of a tokenizer before it tokenizes (its outline: model, vocabulary, added tokens,
what it puts around a text), kept in the user cache dir under the tokenizer.json's sha256 and the tokenizers
version. With it there, HF tokenizers loads in a thread of its own while the run starts reading (a warm
load); without it, HF tokenizers loads first and the outline is written for next time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gpu_prep.errors import ConfigError
from gpu_prep.tokenization.builds import in_thread
from gpu_prep.tokenization.engines import file_sha256

OUTLINE_FORMAT = 2  # bumped when what _outline keeps changes: older cache files are not read


def load_outline(spec: str, directory: Path, kept: Path) -> tuple[Any, dict[str, Any], np.ndarray | None]:
    """The HF tokenizers engine of directory/tokenizer.json, the outline kept for it at `kept` (outline_path)
    and the byte length of every id (None: not byte-level BPE). Where the outline is kept already the engine
    loads in a thread of its own (_Loading); else it loads first and the outline is kept for the next run."""
    path = directory / "tokenizer.json"
    outline = _read_outline(kept)
    if outline is None:
        engine = _load_engine(spec, directory, path)
        outline = _outline(engine)
        token_bytes = _byte_lengths(outline["spec"], outline["vocab_size"])
        outline["token_bytes"] = None if token_bytes is None else token_bytes.tolist()
        _keep_outline(kept, outline)
    else:  # known already: HF tokenizers loads while the run starts
        engine = _Loading(in_thread(lambda: _load_engine(spec, directory, path), "hf-load").result)
        outline["spec"]["model"]["vocab"] = _Vocab(_vocab_path(kept), engine)
        token_bytes = None if outline["token_bytes"] is None else np.array(outline["token_bytes"], np.int64)
    return engine, outline, token_bytes


def outline_path(path: Path) -> Path:
    """Where the outline of this tokenizer.json is kept: the user cache dir, under the file's sha256 and the
    tokenizers version that read it."""
    from importlib.metadata import version

    from gpu_prep.tokenization.bundled import cache_root

    return (cache_root() / "tokenizers"
            / f"outline{OUTLINE_FORMAT}-tokenizers-{version('tokenizers')}-{file_sha256(path)}.json")


def _vocab_path(outline: Path) -> Path:
    return outline.with_name(outline.stem + "-vocab.json")


def _read_outline(path: Path) -> dict[str, Any] | None:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def _keep_outline(path: Path, outline: dict[str, Any]) -> None:
    """The outline in the cache for the next run (half a second saved)."""
    from gpu_prep.tokenization.bundled import keep_cache_file

    model = outline["spec"]["model"]
    light = {**outline, "spec": {**outline["spec"], "model": {k: v for k, v in model.items() if k != "vocab"}}}
    # The vocabulary goes in a file of its own, read only when asked for (_Vocab); the outline carries the
    # byte length of every id instead, which every chat run needs and which takes 4 ms to read as a list.
    keep_cache_file(_vocab_path(path), orjson.dumps(model["vocab"]))
    keep_cache_file(path, orjson.dumps(light))


def _outline(engine: Any) -> dict[str, Any]:
    """The parts of tokenizer.json this package reads (model type and vocabulary, pre-tokenizer,
    normalizer, added tokens), the vocabulary size and the texts the tokenizer puts around a plain text,
    taken from the loaded engine: parsing the file again would also build the whole merges list in Python,
    for nothing."""
    def state(component: Any) -> Any:
        return orjson.loads(component.__getstate__()) if component is not None else None

    added = sorted(engine.get_added_tokens_decoder().items())
    prefix_ids, suffix_ids = _added_around(engine)
    return {
        "spec": {
            "model": {"type": type(engine.model).__name__, "vocab": engine.get_vocab(with_added_tokens=False)},
            "pre_tokenizer": state(engine.pre_tokenizer),
            "normalizer": state(engine.normalizer),
            "added_tokens": [{"id": i, "content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
                              "single_word": t.single_word, "special": t.special} for i, t in added],
        },
        "vocab_size": int(engine.get_vocab_size(with_added_tokens=True)),
        "prefix_text": "".join(engine.id_to_token(i) for i in prefix_ids),
        "suffix_text": "".join(engine.id_to_token(i) for i in suffix_ids),
    }


def _added_around(engine: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a plain text (BOS; [CLS] ... [SEP])."""
    with_special = engine.encode("a", add_special_tokens=True).ids
    plain = engine.encode("a", add_special_tokens=False).ids
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start:start + len(plain)] == plain:
            return with_special[:start], with_special[start + len(plain):]
    return [], []


def _byte_lengths(spec: dict[str, Any], vocab_size: int) -> np.ndarray | None:
    """Byte length of every id for byte-level BPE; None for vocabularies whose tokens do not spell out
    the text byte for byte (WordPiece drops spaces and may lowercase)."""
    model = spec.get("model", {})
    if model.get("type") != "BPE" or not _contains_type(spec.get("pre_tokenizer"), "ByteLevel"):
        return None
    vocab = model.get("vocab") or {}
    size = max(vocab_size, max(vocab.values(), default=-1) + 1)
    table = np.zeros(size, dtype=np.int64)
    for token, index in vocab.items():
        table[index] = len(token)  # one byte-level character per byte
    for added in spec.get("added_tokens", []):
        table[added["id"]] = len(added["content"].encode("utf-8"))
    return table


def _contains_type(node: Any, kind: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == kind or any(_contains_type(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_contains_type(v, kind) for v in node)
    return False


class _Vocab(Mapping):
    """The vocabulary (token -> id) of a tokenizer whose outline came from the cache, read from its own file
    the first time something asks (building a tiktoken engine or its ranks file, looking up a token that is
    not an added one); a run that asks nothing never parses it (80 ms of a held GIL for Qwen's 151,643
    tokens). Without the file, the HF engine's vocabulary."""

    def __init__(self, path: Path, engine: Any) -> None:
        self._path, self._engine, self._vocab = path, engine, None

    def _load(self) -> dict[str, int]:
        if self._vocab is None:
            try:
                self._vocab = orjson.loads(self._path.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                self._vocab = self._engine.get_vocab(with_added_tokens=False)
        return self._vocab

    def __getitem__(self, token: str) -> int:
        return self._load()[token]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


class _Loading:
    """The HF tokenizers engine while it loads in a thread of its own: any use of it waits for it."""

    def __init__(self, result: Callable[[], Any]) -> None:
        self._result = result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result(), name)


def _load_engine(spec: str, directory: Path, path: Path) -> Any:
    from tokenizers import Tokenizer as Engine

    try:
        engine = Engine.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise ConfigError(f"tokenizer {spec!r}: cannot load {directory}: {exc}") from None
    # Some tokenizer.json files carry padding or truncation settings: lengths are this pipeline's job.
    engine.no_padding()
    engine.no_truncation()
    return engine
