"""tokenize: text pieces -> flat token ids + per-piece counts, and where each token lies in the text.

The tokenizer is a directory with tokenizer.json (run by HF tokenizers) and, usually, tokenizer_config.json
(its chat_template and special tokens; without it the tokenizer has neither, as HF loads it), or the name of
a bundled one. What the run needs to know of it before
it tokenizes (its outline: model, vocabulary, added tokens, what it puts around a text) is kept in the
user cache dir under the tokenizer.json's sha256 and the tokenizers version; with it there, HF tokenizers
loads in a thread of its own while the run starts reading (a warm load), else first and the outline is
written for next time. For byte-level BPE every token stands for
a fixed byte string, so a lookup table gives each token's byte length and positions are a running sum (no
offsets needed, so any exact engine may run it). Every other family (SentencePiece-style BPE with byte
fallback, Unigram, WordPiece) reports the characters each token came from, and masks use those.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gpu_prep.tokenization import early
from gpu_prep.tokenization.engines import NORMAL_FORMS, Audit, HfEngine, choose_engine, file_sha256, rank_recipe, start_builds
from gpu_prep.errors import ConfigError
from gpu_prep.read.hub import looks_like_model_id, resolve_model_id
from gpu_prep.durable import copy_atomic, write_atomic
from gpu_prep.render.templates import tokenizer_templates

# End-of-turn tokens of the common template families; those present in the vocabulary, plus the eos token,
# close a turn (and are trained with a trained turn).
KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|end_of_turn|>",
                     "<｜end▁of▁sentence｜>", "<|endoftext|>", "</s>")


# The files of a tokenizer folder that describe the tokenizer (copied beside the shards).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.txt", "vocab.json",
                   "merges.txt")
COPY_DIR = "tokenizer"  # the output folder that holds them


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _contains_type(node: Any, kind: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == kind or any(_contains_type(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_contains_type(v, kind) for v in node)
    return False


class _Loading:
    """The HF tokenizers engine while it loads in a thread of its own: any use of it waits for it."""

    def __init__(self, result: Callable[[], Any]) -> None:
        self._result = result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result(), name)


@dataclass
class Tokenizer:
    name: str
    directory: Path
    engine: Any  # tokenizers.Tokenizer (or _Loading, which waits for it)
    config: dict[str, Any]
    token_bytes: np.ndarray | None  # int64 byte length of every id (byte-level BPE), else None
    normalizer: dict[str, Any]  # the tokenizer.json normalizer spec ({} for none)
    model: str  # "BPE", "WordPiece", ...
    prefix_text: str
    suffix_text: str
    special_tokens: dict[str, str] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict, repr=False)  # the parts of tokenizer.json in use
    vocab_size: int = 0  # ids, added tokens included
    active: Any = None  # the engine encode() runs: HF until use_engine() picks
    engine_choice: str = "hf: default"
    audit: Audit | None = None  # checks the fast engine the run chose, all the way through
    source: str = ""  # what the run was told: a directory, "bundled <name>", or "<model id>@<commit>"
    _summary: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.active is None:
            self.active = HfEngine(self.engine)

    def templates(self) -> dict[str, tuple[str, str]]:
        """The chat templates the tokenizer folder holds, by name ("default": the main one) -> (text, file)."""
        return tokenizer_templates(self.directory, self.config)

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's main chat template (None: it has none)."""
        return self.templates().get("default", (None, ""))[0]

    @property
    def normalizer_kinds(self) -> list[str]:
        spec = self.normalizer
        if not spec:
            return []
        return [n.get("type") for n in spec.get("normalizers", [])] if spec.get("type") == "Sequence" else [spec.get("type")]

    @property
    def normalization(self) -> str | None:
        """The Unicode form the tokenizer normalizes to, when that is all its normalizer does."""
        kinds = self.normalizer_kinds
        return kinds[0] if len(kinds) == 1 and kinds[0] in NORMAL_FORMS else None

    def lowercases(self) -> bool:
        """Whether the tokenizer's normalizer lower-cases (BERT uncased)."""
        spec = self.normalizer
        parts = spec.get("normalizers", [spec]) if spec.get("type") == "Sequence" else [spec]
        return any(p.get("type") == "Lowercase" or p.get("lowercase") is True for p in parts)

    @property
    def byte_spans(self) -> bool:
        """Whether chat masks can come from each token's byte length (byte-level BPE whose normalizer is at
        most a Unicode normal form, which gpu-prep applies itself); otherwise they come from the character
        offsets the tokenizer reports (SentencePiece-style BPE, Unigram, WordPiece, other normalizers)."""
        return self.token_bytes is not None and (not self.normalizer_kinds or self.normalization is not None)

    def encode_offsets(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """encode() by HF tokenizers, with where each token lies in its piece: (flat ids, tokens per piece,
        start and end character of every token)."""
        return HfEngine(self.engine).encode_offsets(pieces)

    @property
    def eos_text(self) -> str | None:
        return self.special_tokens.get("eos_token")

    def end_of_turn_tokens(self) -> tuple[str, ...]:
        # Only added tokens: "</s>" is an ordinary piece of text in some byte-level vocabularies.
        added = {token["content"] for token in self.spec.get("added_tokens", [])}
        found = [t for t in KNOWN_END_OF_TURN if t in added]
        if self.eos_text and self.eos_text not in found:
            found.append(self.eos_text)
        return tuple(found)

    def encode(self, pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat int64 ids, int64 token count per piece); no special tokens are added."""
        return self.active.encode(pieces)

    def _engine_key(self) -> tuple:
        return early.file_key(self.directory / "tokenizer.json")

    def prepare_engines(self, requested: str) -> None:
        """Start building the fast engines a run may use (auto | hf | fastokens | tiktoken), in threads of their
        own, before it reads any input."""
        start_builds(requested, self.spec, self.directory / "tokenizer.json", self._engine_key())

    def use_engine(self, requested: str, pieces: list[str], sample_size: int,
                   threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Pick the engine for this run (auto | hf | fastokens | tiktoken), checked on the first sample_size
        of these pieces of the input, and return the pieces encoded by it (as encode() does). A fast engine
        gets an audit that goes on checking it."""
        hf = HfEngine(self.engine)
        self.active, self.engine_choice, encoded = choose_engine(
            requested, self.spec, self.directory / "tokenizer.json", hf, pieces, sample_size, threads,
            cache_key=self._engine_key())
        self.audit = Audit(hf, self.active.name) if self.active.name != hf.name else None
        path = self.directory / "tokenizer.json"
        recipe = rank_recipe(self.spec, path) if self.active.name == "fastokens" else None
        if recipe is not None and os.path.isfile(recipe["ranks"]):  # the next run may start from it (early.py)
            early.remember("fastokens", self._engine_key(), path, recipe)
        else:
            early.forget()
        return encoded

    def restore_engine(self, name: str, choice: str, threads: int | None = None) -> None:
        """Run the engine an interrupted run chose (--resume), without checking it again on other rows (the
        audit goes on checking it)."""
        self.use_engine(name, [], 0, threads)
        self.engine_choice = choice

    def distrust_engine(self, why: str) -> None:
        """The audit saw the fast engine differ from HF: HF encodes from here on."""
        self.active = HfEngine(self.engine)
        self.engine_choice = f"hf: {why}; encoded by HF from there on"

    def count_tokens(self, text: str) -> int:
        """How many tokens the text is, no special tokens added."""
        return len(self.engine.encode(text, add_special_tokens=False).ids)

    def first_tokens(self, text: str, count: int) -> str:
        """The text its first `count` tokens spell (all of it when it has no more)."""
        encoding = self.engine.encode(text, add_special_tokens=False)
        return text if len(encoding.ids) <= count else text[:encoding.offsets[count][0]]

    def decode(self, ids: Any) -> str:
        return self.engine.decode([int(i) for i in ids], skip_special_tokens=False)

    def files(self) -> list[Path]:
        """The tokenizer's own files in its folder (never model weights), in a fixed order."""
        found = [self.directory / name for name in TOKENIZER_FILES if (self.directory / name).is_file()]
        return found + sorted((self.directory / "additional_chat_templates").glob("*.jinja"))

    def special_ids(self) -> dict[str, int | None]:
        """The ids of bos, eos, pad and unk (None where the tokenizer has none), and eod, which ends every
        pretraining document (input.append_eod): the eos token's, else the token the tokenizer closes
        every text with (BERT's [SEP]); a run's input.eod_token overrides it (run/context.py)."""
        ids = {f"{key}_id": self.special_id(key) for key in ("bos", "eos", "pad", "unk")}
        eod = self.eos_text or self.suffix_text
        return {**ids, "eod_id": self.token_id(eod) if eod else None}

    def special_id(self, key: str) -> int | None:
        """The id of the tokenizer's `key` token ("eos", "pad", ...; tokenizer_config.json), None without one."""
        text = self.special_tokens.get(f"{key}_token")
        return None if text is None else self.token_id(text)

    def token_id(self, token: str) -> int | None:
        """The id of one token of the vocabulary, as HF's token_to_id gives it (added tokens first)."""
        added = next((t["id"] for t in self.spec.get("added_tokens", []) if t["content"] == token), None)
        return added if added is not None else self.spec.get("model", {}).get("vocab", {}).get(token)

    def summary(self) -> dict[str, Any]:
        """What meta.json says of the tokenizer: where it came from, one sha256 over its files, its size and
        special ids (hashed once: the manifest and every domain's meta.json ask). The files themselves are
        copied beside the shards (copy_to)."""
        if self._summary is not None:
            return self._summary
        digest = hashlib.sha256()
        for path in self.files():  # each file's name and bytes, without copying them into one string
            for part in (path.relative_to(self.directory).as_posix().encode(), b"\0", path.read_bytes(), b"\0"):
                digest.update(part)
        self._summary = {"source": self.source or self.name, "sha256": digest.hexdigest(), "files": COPY_DIR,
                         "vocab_size": self.vocab_size, **self.special_ids()}
        return self._summary

    def identity(self) -> dict[str, Any]:
        return {
            **self.summary(),
            "name": self.name,
            "model": self.model,
            "engine": self.active.name,
            "engine_choice": self.engine_choice,
            "byte_level": self.token_bytes is not None,
            "normalization": self.normalization,
        }

    def copy_to(self, out_dir: Path, template: str | None) -> None:
        """The tokenizer's files into out_dir/tokenizer, so a trainer loads the exact tokenizer that made the
        shards; the chat template the run used goes in as chat_template.jinja, where it is not the tokenizer's."""
        target = out_dir / COPY_DIR
        for path in self.files():
            destination = target / path.relative_to(self.directory)
            destination.parent.mkdir(parents=True, exist_ok=True)
            copy_atomic(path, destination)
        if template is not None and template != self.chat_template:
            write_atomic(target / "chat_template.jinja", template.encode("utf-8"))


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


OUTLINE_FORMAT = 2  # bumped when what _outline keeps changes: older cache files are not read


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


def _outline_path(path: Path) -> Path:
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


def _added_around(engine: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer's post-processor puts before and after a plain text (BOS; [CLS] ... [SEP])."""
    with_special = engine.encode("a", add_special_tokens=True).ids
    plain = engine.encode("a", add_special_tokens=False).ids
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start:start + len(plain)] == plain:
            return with_special[:start], with_special[start + len(plain):]
    return [], []


# Files a tokenizer.json can be made from with transformers: what each is, the tokenizer_config.json
# transformers needs beside it to know the class, and the packages the conversion needs.
CONVERTIBLE = {
    "tokenizer.model": ("a SentencePiece model", '{"tokenizer_class": "LlamaTokenizer", "legacy": false, '
                        '"bos_token": "<s>", "eos_token": "</s>"} (its own class and tokens)',
                        "transformers sentencepiece protobuf"),
    "vocab.txt": ("a WordPiece vocabulary", '{"tokenizer_class": "BertTokenizer"} (add "do_lower_case": false '
                  'for a cased one)', "transformers"),
}


def _conversion(path: Path, name: str) -> str:
    """How to make a tokenizer.json from `path`, a file of the kind CONVERTIBLE names `name`."""
    what, config, packages = CONVERTIBLE[name]
    folder, named = (str(path.parent), "") if path.name == name else ("FOLDER", f" as {name}")
    return (f"{path.name} is {what}; make a tokenizer.json from it with transformers (pip install {packages}): "
            f"with it{named} in {folder} and a tokenizer_config.json such as {config}, run python -c \"from "
            f"transformers import AutoTokenizer; AutoTokenizer.from_pretrained('{folder}').save_pretrained('OUT')\" "
            "and give OUT as the tokenizer")


def _file_given(spec: str, path: Path) -> str:
    """What to give instead of a file (the tokenizer is a folder)."""
    head = f"tokenizer {spec!r} is a file; give the folder that holds tokenizer.json and tokenizer_config.json"
    if path.name == "tokenizer.json":
        return f"{head}: {path.parent}"
    kind = "tokenizer.model" if path.name.endswith(".model") or ".model." in path.name else path.name
    return f"{head}. {_conversion(path, kind)}" if kind in CONVERTIBLE else head


def _no_folder(spec: str, path: Path, hub: ConfigError) -> str:
    """What reads as a model id that the hub has not got, but whose organisation is a folder here (tok/lama3
    beside tok/llama3): most likely a path mistyped."""
    names = sorted(p.name for p in path.parent.iterdir() if p.is_dir())
    close = [str(path.parent / name) for name in difflib.get_close_matches(path.name, names, n=3)]
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    return (f"tokenizer {spec!r}: there is no folder {path} (the folder {path.parent} is here, so this most likely "
            f"names a path in it){hint}; as a model id: {hub}")


def _with_special_tokens_map(config: dict[str, Any], path: Path) -> dict[str, Any]:
    """The tokenizer config with the special tokens of special_tokens_map.json put in, as transformers does
    where the config is of the older kind (no added_tokens_decoder): the map's entries win. Folders saved so
    (Llama-2's and Mistral's first releases) name their bos and eos there alone."""
    if "added_tokens_decoder" in config or not path.is_file():
        return config
    tokens = orjson.loads(path.read_bytes())
    if not isinstance(tokens, dict):
        raise ValueError(f"{path.name} holds {type(tokens).__name__}, not an object")
    return {**config, **tokens}


def load_tokenizer(spec: str, revision: str | None = None) -> Tokenizer:
    """A tokenizer directory, the name of a bundled tokenizer (gpu_prep.tokenization.bundled), or a model id in the
    Hugging Face hub cache (at revision, else main)."""
    from gpu_prep.tokenization.bundled import bundled_names, bundled_tokenizer_dir
    from gpu_prep.tokenization.engines import in_thread

    directory, source = Path(spec), spec
    if directory.is_file():  # not a hub id, however it reads
        raise ConfigError(_file_given(spec, directory))
    if not directory.is_dir():
        if spec in bundled_names():
            directory, source = bundled_tokenizer_dir(spec), f"bundled {spec}"
        elif looks_like_model_id(spec):
            try:
                directory, commit = resolve_model_id(spec, revision)
            except ConfigError as exc:  # a model id, unless its organisation is a folder here: then a path mistyped
                raise ConfigError(_no_folder(spec, directory, exc) if directory.parent.is_dir() else str(exc)) from None
            source = f"{spec}@{commit}"
        else:
            raise ConfigError(f"tokenizer {spec!r}: no such directory, not a bundled tokenizer "
                              f"({', '.join(bundled_names())}) and not a model id (organisation/name)")
    files = {name: directory / name for name in ("tokenizer.json", "tokenizer_config.json")}
    if not files["tokenizer.json"].is_file():
        source_file = next((name for name in CONVERTIBLE if (directory / name).is_file()), None)
        hint = f"; {_conversion(directory / source_file, source_file)}" if source_file else ""
        raise ConfigError(f"tokenizer {spec!r}: tokenizer.json is missing in {directory}{hint}")
    try:
        with_config = files["tokenizer_config.json"].is_file()  # without: no special tokens, as HF loads it
        config = orjson.loads(files["tokenizer_config.json"].read_bytes()) if with_config else {}
        config = _with_special_tokens_map(config, directory / "special_tokens_map.json")
        kept = _outline_path(files["tokenizer.json"])
    except (ValueError, OSError) as exc:
        raise ConfigError(f"tokenizer {spec!r}: cannot load {directory}: {exc}") from None
    outline = _read_outline(kept)
    if outline is None:
        engine = _load_engine(spec, directory, files["tokenizer.json"])
        outline = _outline(engine)
        token_bytes = _byte_lengths(outline["spec"], outline["vocab_size"])
        outline["token_bytes"] = None if token_bytes is None else token_bytes.tolist()
        _keep_outline(kept, outline)
    else:  # known already: HF tokenizers loads while the run starts
        engine = _Loading(in_thread(lambda: _load_engine(spec, directory, files["tokenizer.json"]), "hf-load").result)
        outline["spec"]["model"]["vocab"] = _Vocab(_vocab_path(kept), engine)
        token_bytes = None if outline["token_bytes"] is None else np.array(outline["token_bytes"], np.int64)
    tokenizer_spec = outline["spec"]
    special = {key: text for key in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token",
                                     "mask_token")
               if (text := _token_text(config.get(key))) is not None}
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    return Tokenizer(
        name=spec, directory=directory, engine=engine, config=config,
        token_bytes=token_bytes,
        normalizer=tokenizer_spec.get("normalizer") or {},
        model=tokenizer_spec.get("model", {}).get("type", "?"),
        prefix_text=outline["prefix_text"],
        suffix_text=outline["suffix_text"],
        special_tokens=special,
        spec=tokenizer_spec,
        vocab_size=outline["vocab_size"],
        source=source,
    )
