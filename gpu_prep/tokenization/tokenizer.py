"""tokenize: text pieces -> flat token ids + per-piece counts, and where each token lies in the text.

The tokenizer is a directory with tokenizer.json (run by HF tokenizers) and, usually, tokenizer_config.json
(its chat_template and special tokens; without it the tokenizer has neither, as HF loads it), the name of
a bundled one, or a model id in the hub cache (resolve.py); what the run knows of it before HF tokenizers
has loaded comes from a cache (outline.py). For byte-level BPE every token stands for
a fixed byte string, so a lookup table gives each token's byte length and positions are a running sum (no
offsets needed, so any exact engine may run it). Every other family (SentencePiece-style BPE with byte
fallback, Unigram, WordPiece) reports the characters each token came from, and masks use those.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError
from gpu_prep.render.templates import tokenizer_templates
from gpu_prep.tokenization import early
from gpu_prep.tokenization.builds import start_builds
from gpu_prep.tokenization.checks import Audit, choose_engine
from gpu_prep.tokenization.engines import NORMAL_FORMS, HfEngine, rank_recipe
from gpu_prep.tokenization.outline import load_outline, outline_path
from gpu_prep.tokenization.resolve import read_config, special_tokens, tokenizer_folder

# End-of-turn tokens of the common template families; those present in the vocabulary, plus the eos token,
# close a turn (and are trained with a trained turn).
KNOWN_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|end_of_turn|>",
                     "<｜end▁of▁sentence｜>", "<|endoftext|>", "</s>")


# The files of a tokenizer folder that describe the tokenizer (copied beside the shards).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.txt", "vocab.json",
                   "merges.txt")
COPY_DIR = "tokenizer"  # the output folder that holds them


@dataclass
class Tokenizer:
    name: str
    directory: Path
    engine: Any  # tokenizers.Tokenizer (or outline._Loading, which waits for it)
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
        copied beside the shards (run/manifest.py's copy_tokenizer)."""
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


def load_tokenizer(spec: str, revision: str | None = None) -> Tokenizer:
    """A tokenizer directory, the name of a bundled tokenizer (gpu_prep.tokenization.bundled), or a model id in the
    Hugging Face hub cache (at revision, else main)."""
    directory, source = tokenizer_folder(spec, revision)
    try:
        config = read_config(directory)
        kept = outline_path(directory / "tokenizer.json")
    except (ValueError, OSError) as exc:
        raise ConfigError(f"tokenizer {spec!r}: cannot load {directory}: {exc}") from None
    engine, outline, token_bytes = load_outline(spec, directory, kept)
    tokenizer_spec = outline["spec"]
    special = special_tokens(config)
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
