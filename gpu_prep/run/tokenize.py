"""The tokenize stage: each rendered row's pieces into token ids, by the engine the run's first rows chose
(Tokenizing), a fast engine's tokens checked against HF as the run goes; and prepare_and_tokenize, the host
stages (prepare.py) with tokenizing after them (the stages and their results: run/stages.py)."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gpu_prep.errors import EngineMismatch
from gpu_prep.failpoint import failpoint
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.read.inputs import RawChunk
from gpu_prep.render.context import RenderedRow
from gpu_prep.run.context import Decisions, RunContext
from gpu_prep.run.overlap import Stopwatch, overlapped
from gpu_prep.run.prepare import prepare
from gpu_prep.run.stages import Encoded, Prepared, row_keys
from gpu_prep.tokenization.engines import HfEngine

OFFSETS_CHOICE = ("hf: chat masks from the character offsets HF tokenizers reports (a {model} tokenizer, "
                  "not byte-level BPE)")
ENGINE_SAMPLE_BYTES = 256 << 10  # text of the first chunk on which a fast engine must equal HF before it is used


def tokenize_rows(encode: Callable, rendered: list[RenderedRow]) -> Encoded:
    """The rows' pieces through encode (-> ids and tokens per piece, and with offsets where each token
    starts and ends)."""
    encoded = Encoded(*encode([p for row in rendered for p in row.pieces]))
    if all(row.given is None for row in rendered):
        return encoded
    # Pre-tokenized rows bring their ids: each has one empty piece, which takes them (placed at its start).
    columns = [encoded.ids] if encoded.starts is None else [encoded.ids, encoded.starts, encoded.ends]
    parts: list[list[np.ndarray]] = [[] for _ in columns]
    piece, at = 0, 0
    counts = encoded.per_piece.copy()
    for row in rendered:
        if row.given is not None:
            counts[piece] = len(row.given[0])
            given = [row.given[0]] + [np.zeros(len(row.given[0]), np.int64)] * (len(columns) - 1)
        else:
            n = int(counts[piece:piece + len(row.pieces)].sum())
            given = [column[at:at + n] for column in columns]
            at += n
        for part, array in zip(parts, given):
            part.append(array)
        piece += len(row.pieces)
    ids, *places = (np.concatenate(part).astype(np.int64, copy=False) for part in parts)
    return Encoded(ids, counts, *places)


def _engine_sample_size(rendered: list[RenderedRow]) -> int:
    """How many of the first pieces of the input make about ENGINE_SAMPLE_BYTES (at least one row's)."""
    count = size = 0
    for row in rendered:
        count += len(row.pieces)
        size += row.num_bytes
        if size >= ENGINE_SAMPLE_BYTES:
            break
    return count


class Tokenizing:
    """Tokenizes chunks with the engine the run's first rows chose (decisions.engine; a resumed run and a
    cluster's workers are handed the choice). A fast engine's chunks are checked against HF all the way
    through (tokenization/checks.py's Audit): a chunk that comes after a difference is encoded again by HF, or under --strict
    the run stops."""

    def __init__(self, run: RunContext, decisions: Decisions) -> None:
        self.run, self.decisions = run, decisions
        self.encode = None
        self._lock = threading.Lock()
        if decisions.engine is not None:
            run.tok.restore_engine(*decisions.engine, run.threads)
            self.encode = run.backend.encoder(run.tok)

    def __call__(self, rendered: list[RenderedRow], clock: Stopwatch, keys: np.ndarray) -> Encoded:
        """keys: each row's place in the input (row_keys), which picks the pieces the engine check looks at."""
        failpoint("tokenize")
        tok = self.run.tok
        if self.run.render.offsets and any(row.spans for row in rendered):
            # Chat masks on a tokenizer that is not byte-level BPE: HF tokenizers, with offsets.
            if self.decisions.engine is None:
                self.decisions.settle_engine("hf", OFFSETS_CHOICE.format(model=tok.model))
                tok.restore_engine(*self.decisions.engine, self.run.threads)
            return clock.time("tokenize", tokenize_rows, tok.encode_offsets, rendered)
        if self.encode is not None:
            return self._audited(rendered, clock, self.encode, keys)
        # The first rows choose the engine, checking it on a sample of them.
        first = functools.partial(tok.use_engine, self.run.config.tokenizer.engine,
                                  sample_size=_engine_sample_size(rendered), threads=self.run.threads)
        tokens = self._audited(rendered, clock, first, keys)
        self.encode = self.run.backend.encoder(tok)
        self.decisions.settle_engine(tok.active.name, tok.engine_choice)
        return tokens

    def _audited(self, rendered: list[RenderedRow], clock: Stopwatch, encode: Callable, keys: np.ndarray) -> Encoded:
        raw = []

        def keeping(pieces: list[str]) -> tuple[np.ndarray, np.ndarray]:
            raw.append((pieces, encode(pieces)))
            return raw[-1][1]

        tokens = clock.time("tokenize", tokenize_rows, keeping, rendered)
        audit = self.run.tok.audit
        if audit is None or self.run.tok.active.name != audit.engine:
            return tokens
        (pieces, (ids, counts)), = raw
        per_row = np.fromiter((len(row.pieces) for row in rendered), np.int64, len(rendered))
        starts = np.cumsum(per_row) - per_row
        # A piece's key: its row's key and its number in the row.
        piece_keys = (np.repeat(keys.astype(np.uint64) << np.uint64(10), per_row)
                      + (np.arange(len(pieces)) - np.repeat(starts, per_row)).astype(np.uint64))
        return dataclasses.replace(tokens, pending=audit.submit(pieces, piece_keys, ids, counts,
                                                                functools.partial(self._settle, rendered, tokens)))

    def _settle(self, rendered: list[RenderedRow], tokens: Encoded, check: dict[str, Any]) -> Encoded:
        """In the audit's thread, once a chunk is checked: its tokens as they are, or HF's once the fast engine
        differed from HF on it or on an earlier chunk."""
        tok = self.run.tok
        difference = check["difference"]
        if difference is None:
            return dataclasses.replace(tokens, pending=None, engine_check=check)
        with self._lock:
            if tok.active.name != "hf":
                if self.run.strict:
                    raise EngineMismatch(f"{difference}; --strict stops the run (without it, HF encodes from "
                                         "that chunk on; tokenizer.engine hf avoids the fast engine)")
                tok.distrust_engine(difference)
                self.decisions.replace_engine("hf", tok.engine_choice)
        return dataclasses.replace(tokenize_rows(HfEngine(tok.engine).encode, rendered), engine_check=check)


# Chunks the host stages may run ahead of tokenizing: while the fast engine is still being built (about a
# second), reading and rendering go on instead of waiting; a chunk is a few megabytes of text.
READ_AHEAD = 4


def prepare_and_tokenize(chunks: Iterator[RawChunk], run: RunContext, dedup: Deduplicator | None, clock: Stopwatch,
                         decisions: Decisions, overlap: bool = True) -> Iterator[tuple[Prepared, Encoded | None]]:
    """Chunks read -> formatted, filtered, rendered (with overlap, a chunk ahead in a thread of its own)
    and tokenized."""
    tokenizing = Tokenizing(run, decisions)
    prepared = prepare(chunks, run, dedup, clock, decisions)
    for item in overlapped(prepared, READ_AHEAD) if overlap else prepared:
        yield item, tokenizing(item.rows.payload, clock, row_keys(item)) if item.rows.index else None
