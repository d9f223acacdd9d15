"""The stages a chunk of rows goes through, each a function from a named input to a named result, and those
results (Rows, Formatted, Prepared, Encoded, MaskResult, Done):

    stage     function (module)            input                     result                     runs on
    format    format_rows (prepare.py)     RawChunk                  Formatted: Rows[Shape]     host
    filter    filter_reasons (prepare.py)  Rows[Shape]               Dropped or None, a row     host; digests: backend
    render    render_rows (prepare.py)     Rows[Shape]               Rows[RenderedRow]          host (Jinja)
    tokenize  Tokenizing (tokenize.py)     list[RenderedRow]         Encoded                    the tokenizer engine
    mask      mask_rows (masking.py)       list[RenderedRow], Encoded  MaskResult               xp
    commit    Committer (commit.py)        Done, in input order      counts, shards             host

prepare (prepare.py) takes each chunk read through format, filter and render into a Prepared;
prepare_and_tokenize (tokenize.py) adds its tokens; mask_chunk (masking.py) makes the Done that run/commit.py
accounts for and writes. A row a stage drops leaves the Rows for a list of DroppedRow (read/row.py): its
place in the chunk, why (errors.Dropped) and the row as read.

Row-level Python appears only where no columnar form exists (JSON records into the canonical shape, Jinja
rendering); everything over tokens is array code on the backend's `xp` (mask/). Nothing here knows about
threads, processes or clusters: run/local.py and cluster/ call these same functions.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from gpu_prep.errors import Dropped
from gpu_prep.format import Shape
from gpu_prep.mask.project import Masked
from gpu_prep.read.inputs import RawChunk
from gpu_prep.read.row import DroppedRow
from gpu_prep.render.context import RenderedRow

T = TypeVar("T")  # what each row of a Rows carries


@dataclass
class Rows(Generic[T]):
    """The rows of a chunk still alive after a stage: their places in the chunk and what they carry
    (Rows[Shape] after format: a Conversation, Segments, format.Tokens, Pair or Unpaired; Rows[RenderedRow]
    after render)."""

    index: list[int] = field(default_factory=list)
    domain: list[str] = field(default_factory=list)
    payload: list[T] = field(default_factory=list)
    split: list[int] | None = None  # with output.splits: each row's split (its index in splits), from filter on

    def keep(self, dropped: list[Dropped | None], chunk: RawChunk, drops: list[DroppedRow]) -> Rows[T]:
        """The rows not dropped (None); the others go to drops."""
        kept: Rows[T] = Rows(split=None if self.split is None else [])
        for k, (i, domain, payload, why) in enumerate(zip(self.index, self.domain, self.payload, dropped)):
            if why is None:
                kept.index.append(i)
                kept.domain.append(domain)
                kept.payload.append(payload)
                if self.split is not None:
                    kept.split.append(self.split[k])
            else:
                drops.append(DroppedRow(i, why, chunk.records[i]))
        return kept


@dataclass
class Formatted:
    """A chunk in the canonical shape: the rows that have one, and what formatting counted."""

    rows: Rows[Shape]
    drops: list[DroppedRow]
    schemas: Counter  # rows formatted, by input type (several with input.type auto)
    notes: Counter  # the parse report: "rows_with_tools", "unknown_role:<role>", what building chat rows did


@dataclass
class Prepared:
    """A chunk through the host stages (format, filter, render): the rows still alive, rendered; the rows
    dropped so far; what formatting counted; the dedup digests the chunk added (checkpoints log them)."""

    chunk: RawChunk
    rows: Rows[RenderedRow]  # on a cluster's driver, what accounting reads of each (cluster/worker.py's lighten)
    drops: list[DroppedRow]
    schemas: Counter
    notes: Counter
    digests: list[bytes]
    # preprocessing.fuzzy_dedup: each chunk row's LSH band keys (rows x bands, uint64) and whether it has
    # any (False: no words, or dropped before the keys were taken); decided at commit (fuzzy.NearIndex).
    bands: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(frozen=True)
class Encoded:
    """A chunk's pieces as token ids."""

    ids: np.ndarray  # flat, every piece of every row in order
    per_piece: np.ndarray  # tokens of each piece
    # Where each token lies in its piece, in characters, as the tokenizer reports it (None: not asked for;
    # byte-level BPE places tokens by their byte lengths instead).
    starts: np.ndarray | None = None
    ends: np.ndarray | None = None
    # A fast engine's tokens still being checked against HF (tokenization/checks.py's Audit): the future gives the Encoded to
    # use, these same tokens or HF's. None: nothing to wait for.
    pending: Future | None = None
    engine_check: dict[str, Any] | None = None  # the check's summary (tokenization/checks.py's Audit) once these tokens passed it


@dataclass(frozen=True)
class MaskResult:
    """Loss masks and truncation of a chunk's rows (device arrays until lightened for the driver)."""

    masked: Masked
    valid: np.ndarray  # tokens placed exactly: bytes covered, offsets in order (else tokenizer_mismatch)
    over: np.ndarray  # over max_seq_len where truncation is drop or raise (not kept)
    trained_by_span: np.ndarray  # trained tokens in each trained span, after truncation
    samples_per_row: int = 1  # preference pairs: 2 (prompt + chosen, prompt + rejected)
    drops: list[tuple[int, Dropped]] = field(default_factory=list)  # rows dropped by the pair cut (pairs.py), by row
    pair_counts: Counter | None = None  # pairs.PAIR_COUNTS of the chunk (preference pairs only)
    labels: np.ndarray | None = None  # input.type kto: each kept row's label (1 desirable)


@dataclass
class Done:
    """A chunk through every stage but accounting and writing, which happen in input order in one place
    (run/commit.py); a cluster's workers send these back to the driver."""

    prepared: Prepared
    mask: MaskResult | None  # None: nothing was left to tokenize
    engine_check: dict[str, Any] | None = None  # the engine check's summary once this chunk was checked


def row_keys(prepared: Prepared) -> np.ndarray:
    """Each live row's place in the input as one uint64: file index and line."""
    chunk = prepared.chunk
    return np.fromiter(((chunk.file_index[i] << 32) | chunk.line[i] for i in prepared.rows.index), np.uint64,
                       len(prepared.rows.index))
