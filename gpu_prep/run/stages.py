"""The stages a chunk of rows goes through, each a function from a named input to a named result:

    RawChunk --format--> Formatted --filter--> Rows --render--> Rows of RenderedRow
             --tokenize--> Encoded --mask--> MaskResult            (then run/commit.py, in input order)

Row-level Python appears only where no columnar form exists (JSON records into the canonical shape, Jinja
rendering); everything over tokens is array code on the backend's `xp` (mask.py). Nothing here knows about
threads, processes or clusters: run/local.py and cluster/ call these same functions.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_prep.format.contract import BuilderTokenizer, build_row
from gpu_prep.config import PAIR_TYPES, TEMPLATE_ROLES, PipelineConfig
from gpu_prep.tokenization.engines import HfEngine
from gpu_prep.errors import Drop, EngineMismatch
from gpu_prep.failpoint import failpoint
from gpu_prep.filter.dedup import Deduplicator, filter_rows
from gpu_prep.format import (Conversation, Pair, RowError, Segments, Tokens, Unpaired, auto_schema, dedup_text,
                             domain_of, fuzzy_text, hashed_whole, messages_row, source_chars, split_text)
from gpu_prep.filter.fuzzy import MinHasher, text_band_keys
from gpu_prep.mask.project import (Masked, contiguous_places, kept_span_tokens, mask_from_ranges, offset_places, row_of,
                           span_tokens, truncate_and_filter)
from gpu_prep.mask.pairs import cut_pairs, sequence_tokens
from gpu_prep.ragged import offsets_from_lengths
from gpu_prep.read.inputs import RawChunk
from gpu_prep.read.rows import first_rows, read_chunks
from gpu_prep.render.context import RenderContext, RenderedRow, no_template
from gpu_prep.render.row import affix_disagreement, render_row
from gpu_prep.run.context import Decisions, RunContext, Sources
from gpu_prep.run.overlap import Stopwatch, overlapped
from gpu_prep.filter.splits import split_codes

OFFSETS_CHOICE = ("hf: chat masks from the character offsets HF tokenizers reports (a {model} tokenizer, "
                  "not byte-level BPE)")
ENGINE_SAMPLE_BYTES = 256 << 10  # text of the first chunk on which a fast engine must equal HF before it is used
KNOWN_ROLES = frozenset(TEMPLATE_ROLES)


@dataclass(frozen=True)
class Dropped:
    """A row a stage dropped: its place in the chunk, the reason (errors.Drop), a detail, the row as read."""

    row: int
    reason: str
    detail: str
    record: Any


@dataclass
class Rows:
    """The rows of a chunk still alive after a stage: their places in the chunk and what they carry (a
    Conversation / Segments / format.Tokens after format, a RenderedRow after render)."""

    index: list[int] = field(default_factory=list)
    domain: list[str] = field(default_factory=list)
    payload: list[Any] = field(default_factory=list)
    split: list[int] | None = None  # with output.splits: each row's split (its index in splits), from filter on

    def keep(self, reasons: list[tuple[str, str] | None], chunk: RawChunk, drops: list[Dropped]) -> Rows:
        """The rows whose reason is None; the others go to drops."""
        kept = Rows(split=None if self.split is None else [])
        for k, (i, domain, payload, reason) in enumerate(zip(self.index, self.domain, self.payload, reasons)):
            if reason is None:
                kept.index.append(i)
                kept.domain.append(domain)
                kept.payload.append(payload)
                if self.split is not None:
                    kept.split.append(self.split[k])
            else:
                drops.append(Dropped(i, *reason, chunk.records[i]))
        return kept


@dataclass
class Formatted:
    """A chunk in the canonical shape: the rows that have one, and what formatting counted."""

    rows: Rows
    drops: list[Dropped]
    schemas: Counter  # rows formatted, by input type (several with input.type auto)
    notes: Counter  # the parse report: "rows_with_tools", "unknown_role:<role>", what building chat rows did


@dataclass
class Prepared:
    """A chunk through the host stages (format, filter, render): the rows still alive, rendered; the rows
    dropped so far; what formatting counted; the dedup digests the chunk added (checkpoints log them)."""

    chunk: RawChunk
    rows: Rows
    drops: list[Dropped]
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
    # A fast engine's tokens still being checked against HF (engines.Audit): the future gives the Encoded to
    # use, these same tokens or HF's. None: nothing to wait for.
    pending: Future | None = None
    engine_check: dict[str, Any] | None = None  # the check's summary (engines.Audit) once these tokens passed it


@dataclass(frozen=True)
class MaskResult:
    """Loss masks and truncation of a chunk's rows (device arrays until lightened for the driver)."""

    masked: Masked
    valid: np.ndarray  # tokens placed exactly: bytes covered, offsets in order (else tokenizer_mismatch)
    over: np.ndarray  # over max_seq_len where truncation is drop or raise (not kept)
    trained_by_span: np.ndarray  # trained tokens in each trained span, after truncation
    samples_per_row: int = 1  # preference pairs: 2 (prompt + chosen, prompt + rejected)
    drops: list[tuple[int, str, str]] = field(default_factory=list)  # rows dropped by the pair cut (pairs.py)
    pair_counts: Counter | None = None  # pairs.PAIR_COUNTS of the chunk (preference pairs only)
    labels: np.ndarray | None = None  # input.type kto: each kept row's label (1 desirable)


@dataclass
class Done:
    """A chunk through every stage but accounting and writing, which happen in input order in one place
    (run/commit.py); a cluster's workers send these back to the driver."""

    prepared: Prepared
    mask: MaskResult | None  # None: nothing was left to tokenize
    engine_check: dict[str, Any] | None = None  # the engine check's summary once this chunk was checked


# ---------------------------------------------------------------- format


def format_rows(chunk: RawChunk, base: PipelineConfig, sources: Sources | None = None,
                tokenizer: BuilderTokenizer | None = None) -> Formatted:
    """Each record into its canonical shape, by its dataset's input type (sources, by file index; else base).
    tokenizer: what builders that take one are handed (RunContext.builder_tokenizer)."""
    out = Formatted(Rows(), [], Counter(), Counter())
    for i, record in enumerate(chunk.records):
        if record is None:
            out.drops.append(Dropped(i, *chunk.errors[i]))
            continue
        config, own_domain = sources.get(chunk.file_index[i], (base, None)) if sources else (base, None)
        auto = config.input.type == "auto"
        schema = config.input.type
        try:
            record = messages_row(record, config) if isinstance(record, list) else record
            domain = domain_of(record, config.output.domain_key, own_domain)
            if auto:
                schema = auto_schema(record, config)
            shape = build_row(schema, record, config, tokenizer)
        except RowError as err:
            out.drops.append(Dropped(i, err.reason, err.detail, record))
            continue
        if isinstance(shape, Tokens) and shape.domain is not None:  # a plugin's builder named it
            domain = shape.domain
        out.schemas[schema] += 1
        if isinstance(shape, (Conversation, Pair, Unpaired)):
            # Rows with tools, and roles chat templates do not know (rendered as the template sees fit,
            # never dropped silently: see messages_left_out_by_template).
            out.notes.update(["rows_with_tools"] * bool(shape.tools) + list(shape.notes))
            parts = [shape.messages] if isinstance(shape, Conversation) else \
                [shape.prompt, *shape.completions] if shape.conversational else []
            out.notes.update(f"unknown_role:{m['role']}" for part in parts for m in part if m["role"] not in KNOWN_ROLES)
        out.rows.index.append(i)
        out.rows.domain.append(domain)
        out.rows.payload.append(shape)
    return out


def first_rows_formatted(run: RunContext) -> None:
    """Where the run has no chat template and the rows' own shape says whether they need one (input.type
    auto, preference rows), the first row of each input is formatted now, as the run formats it: a
    conversation among them stops the run before the output directory is touched (a --overwrite run keeps its
    previous output), not mid-run. Rows further on can still be conversations; those stop the run when they
    come."""
    if run.render.template is not None or not any(c.input.type == "auto" or c.input.type in PAIR_TYPES
                                                  for c in run.config.all_configs()):
        return
    for chunk in read_chunks(run.files, len(run.files), rows=first_rows(run.files, [1] * len(run.files))):
        for shape in format_rows(chunk, run.config, run.sources, run.builder_tokenizer).rows.payload:
            if isinstance(shape, Conversation):
                raise no_template("chat rows", run.render.template_source)
            if isinstance(shape, (Pair, Unpaired)) and shape.conversational:
                raise no_template("conversational preference rows", run.render.template_source,
                                  "name one with chat_template")


# ---------------------------------------------------------------- filter


def filter_reasons(run: RunContext, rows: Rows, dedup: Deduplicator | None) -> list[tuple[str, str] | None]:
    """Per row: None (kept) or why the length rules or dedup drop it."""
    chars = np.fromiter((source_chars(shape) for shape in rows.payload), np.int64, len(rows.payload))
    keys = [dedup_text(shape) for shape in rows.payload] if dedup is not None else []
    pretraining = np.fromiter((isinstance(s, Segments) and s.train_all for s in rows.payload), bool, len(chars))
    reasons = filter_rows(run.backend, chars, keys, pretraining, run.config, dedup)
    rules = run.config.preprocessing
    details = {Drop.TOO_SHORT: f"shorter than min_chars {rules.min_chars}",
               Drop.TOO_LONG: f"longer than max_chars {rules.max_chars}",
               Drop.DUPLICATE: "its text has the MD5 of an earlier row's" if rules.dedup_prefix_chars is None
               else f"its first {rules.dedup_prefix_chars} characters have the MD5 of an earlier row's"}
    whole = "it equals an earlier row (rows of this kind are hashed whole)"
    return [None if r is None else (r, f"{n} characters; {whole if r == Drop.DUPLICATE and hashed_whole(shape) else details[r]}")
            for r, n, shape in zip(reasons, chars.tolist(), rows.payload)]


def band_keys(run: RunContext, rows: Rows, chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """preprocessing.fuzzy_dedup's band keys of the rows still alive, placed by chunk row."""
    hasher = MinHasher.from_config(run.config.preprocessing.fuzzy_dedup)
    keys = np.zeros((chunk_rows, hasher.bands), np.uint64)
    signed = np.zeros(chunk_rows, bool)
    texts = [fuzzy_text(shape) for shape in rows.payload]
    keys[rows.index], signed[rows.index] = text_band_keys(run.backend, hasher, texts)
    return keys, signed


# ---------------------------------------------------------------- render


def render_rows(rows: Rows, chunk: RawChunk, contexts: dict[int, RenderContext], ctx: RenderContext
                ) -> tuple[Rows, list[tuple[str, str] | None]]:
    """Each row rendered with its dataset's context (contexts, by file index) or ctx; per row the reason
    it could not be (None: rendered)."""
    rendered, reasons = [], []
    for i, shape in zip(rows.index, rows.payload):
        try:
            rendered.append(render_row(shape, contexts.get(chunk.file_index[i], ctx)))
            reasons.append(None)
        except RowError as err:
            rendered.append(None)
            reasons.append((err.reason, err.detail))
    return Rows(rows.index, rows.domain, rendered, rows.split), reasons


def dataset_contexts(ctx: RenderContext, config: PipelineConfig, sources: Sources) -> dict[int, RenderContext]:
    """By file index: the context of each dataset that has its own settings (with its own mask policy), one
    per dataset."""
    own: dict[int, RenderContext] = {}
    by_config = {}
    for file_index, (cfg, _) in sources.items():
        if cfg is not config:
            own[file_index] = by_config.setdefault(id(cfg), dataclasses.replace(ctx, config=cfg))
    return own


def prepare(chunks: Iterator[RawChunk], run: RunContext, dedup: Deduplicator | None, clock: Stopwatch,
            decisions: Decisions) -> Iterator[Prepared]:
    """The host stages, chunk by chunk: read -> format -> filter -> render. Jinja-free rendering is trusted
    only once it matched Jinja on the first chunk's rows (decisions.affix)."""
    ctx = run.render if decisions.affix is not False else dataclasses.replace(run.render, affix=None)
    contexts = dataset_contexts(ctx, run.config, run.sources)
    fuzzy = run.config.preprocessing.fuzzy_dedup
    while (chunk := clock.time("read", next, chunks, None)) is not None:
        failpoint("read")
        formatted = clock.time("format", format_rows, chunk, run.config, run.sources, run.builder_tokenizer)
        rows = formatted.rows
        if ctx.affix is not None and decisions.affix is None and rows.index:
            if clock.time("render", affix_disagreement, rows.payload, ctx) is not None:
                ctx = dataclasses.replace(ctx, affix=None)
                contexts = dataset_contexts(ctx, run.config, run.sources)
            decisions.settle_affix(ctx.affix is not None)
        rows = rows.keep(clock.time("filter", filter_reasons, run, rows, dedup), chunk, formatted.drops)
        if (splits := run.config.output.splits) is not None:
            rows.split = split_codes([split_text(shape) for shape in rows.payload], splits,
                                     run.config.output.split_seed).tolist()
        bands = clock.time("filter", band_keys, run, rows, len(chunk)) if fuzzy is not None else None
        rows, reasons = clock.time("render", render_rows, rows, chunk, contexts, ctx)
        rows = rows.keep(reasons, chunk, formatted.drops)
        digests = dedup.take_added() if dedup is not None else []
        yield Prepared(chunk, rows, formatted.drops, formatted.schemas, formatted.notes, digests, bands)


# ---------------------------------------------------------------- tokenize


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
    through (engines.Audit): a chunk that comes after a difference is encoded again by HF, or under --strict
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


def row_keys(prepared: Prepared) -> np.ndarray:
    """Each live row's place in the input as one uint64: file index and line."""
    chunk = prepared.chunk
    return np.fromiter(((chunk.file_index[i] << 32) | chunk.line[i] for i in prepared.rows.index), np.uint64,
                       len(prepared.rows.index))


# ---------------------------------------------------------------- mask


def mask_rows(run: RunContext, rendered: list[RenderedRow], tokens: Encoded) -> MaskResult:
    """Loss masks, truncation and the rows left with nothing to train."""
    backend, xp, rules = run.backend, run.backend.xp, run.config.preprocessing
    ids, tokens_per_piece = tokens.ids, tokens.per_piece
    num_rows, num_pieces = len(rendered), len(tokens_per_piece)
    piece_offsets = offsets_from_lengths(np, np.fromiter((len(r.pieces) for r in rendered), np.int64, num_rows))
    piece_tokens = offsets_from_lengths(np, tokens_per_piece)  # where each piece's tokens begin
    token_offsets = piece_tokens[piece_offsets]
    piece_trained = np.fromiter((t for r in rendered for t in r.piece_trained), np.int8, num_pieces)
    spans = np.array([s for r in rendered for s in r.spans], dtype=np.int64).reshape(-1, 2)
    span_offsets = offsets_from_lengths(np, np.fromiter((len(r.spans) for r in rendered), np.int64, num_rows))
    row_bytes = np.fromiter((r.num_bytes for r in rendered), np.int64, num_rows)
    has_spans = np.diff(span_offsets) > 0

    ids_d, offsets_d = backend.asarray(ids), backend.asarray(token_offsets)
    has_spans_d = backend.asarray(has_spans)
    if tokens.starts is not None:  # the tokenizer's own offsets, in characters
        piece_chars = np.fromiter((len(p) for r in rendered for p in r.pieces), np.int64, num_pieces)
        places, ordered = offset_places(xp, backend.asarray(tokens.starts), backend.asarray(tokens.ends),
                                        backend.asarray(tokens_per_piece), backend.asarray(piece_chars),
                                        backend.asarray(piece_offsets))
        valid = ordered | ~has_spans_d
    else:
        if run.tok.token_bytes is None:
            positions = xp.zeros(len(ids) + 1, dtype=xp.int64)
        else:
            positions = offsets_from_lengths(xp, backend.asarray(run.tok.token_bytes)[ids_d])
        places = contiguous_places(xp, positions, offsets_d)
        # Rows masked by byte spans must be covered byte for byte by their tokens; rows masked by pieces need not.
        covered = positions[offsets_d[1:]] - positions[offsets_d[:-1]]
        valid = (covered == backend.asarray(row_bytes)) | ~has_spans_d
    span_offsets_d = backend.asarray(span_offsets)
    first, stop = span_tokens(xp, places, backend.asarray(spans[:, 0].copy()), backend.asarray(spans[:, 1].copy()),
                              span_offsets_d)
    by_span = mask_from_ranges(xp, places, first, stop)
    if piece_trained.all():  # pretraining text: every token counts
        loss_mask = xp.ones(len(ids), dtype=xp.int8)
    elif piece_trained.any():
        piece_of_token = row_of(xp, backend.asarray(piece_tokens), len(ids))
        loss_mask = xp.maximum(by_span, backend.asarray(piece_trained)[piece_of_token])
    else:  # chat: byte spans say it all
        loss_mask = by_span
    if any(r.given is not None for r in rendered):  # pre-tokenized rows bring their masks
        host = backend.to_host(loss_mask).astype(np.int8)
        for k, row in enumerate(rendered):
            if row.given is not None:
                host[token_offsets[k]:token_offsets[k + 1]] = row.given[1]
        loss_mask = backend.asarray(host)
    # The tokens of each row's closing pieces (its last ones) outlive truncation.
    closing = np.fromiter((r.closing_pieces for r in rendered), np.int64, num_rows)
    ends = piece_offsets[1:]
    keep_tail = piece_tokens[ends] - piece_tokens[np.maximum(ends - closing, piece_offsets[:-1])]
    lengths = np.diff(token_offsets)
    pairs = run.config.input.type in PAIR_TYPES  # cut by pairs.cut_pairs, below, not here
    over = lengths > rules.max_seq_len if rules.truncation in ("drop", "raise") and not pairs \
        else np.zeros(num_rows, dtype=bool)
    # split: the writer cuts rows into windows, so none is truncated here
    limit = max(int(lengths.max(initial=1)), 1) if rules.truncation == "split" or pairs else rules.max_seq_len
    # structured: chat rows come cut to fit by render.py; other rows (text in an auto mix) lose their first tokens
    side = "left" if rules.truncation in ("left", "structured") else "right"
    masked = truncate_and_filter(xp, ids_d, loss_mask, offsets_d, limit, valid & ~backend.asarray(over),
                                 backend.asarray(keep_tail), side=side)
    kept = xp.zeros(num_rows, dtype=xp.int64)
    kept[masked.kept_rows] = 1
    if pairs:
        # cut_pairs masks and cuts the sequences itself: the device's mask and truncation are not copied over
        host = dataclasses.replace(masked, loss_mask=None, truncated_rows=None, **{
            name: backend.to_host(getattr(masked, name)) for name in ("ids", "offsets", "kept_rows", "no_trained_rows")})
        differs = np.fromiter((r.generation_prompt_differs for r in rendered), bool, num_rows)
        sides = 2 if run.config.input.type == "preference" else 1
        sequences = sequence_tokens(tokens_per_piece, np.diff(piece_offsets), sides + 1)  # each side, the prompt alone
        samples, drops, counts, by_span = cut_pairs(host, sequences, rules, num_rows, differs, sides)
        labels = None if sides == 2 else np.array([rendered[r].label for r in samples.kept_rows.tolist()], np.int8)
        return MaskResult(samples, backend.to_host(valid), over, by_span, sides, drops, counts, labels)
    by_role = kept_span_tokens(xp, first, stop, span_offsets_d, offsets_d, limit, side, kept)
    return MaskResult(masked, backend.to_host(valid), over, backend.to_host(by_role))


def mask_chunk(run: RunContext, clock: Stopwatch, item: tuple[Prepared, Encoded | None]) -> Done:
    prepared, tokens = item
    if tokens is None:
        return Done(prepared, None)
    if tokens.pending is not None:
        tokens = clock.time("engine check", tokens.pending.result)
    return Done(prepared, clock.time("mask", mask_rows, run, prepared.rows.payload, tokens), tokens.engine_check)
