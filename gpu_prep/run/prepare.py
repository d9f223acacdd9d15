"""The host stages, over a chunk of rows: format (records into their canonical shapes), filter (length rules,
dedup, near-duplicate band keys, splits) and render (the chat template); prepare runs them chunk by chunk into
a Prepared (the stages and their results: run/stages.py)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator

import numpy as np

from gpu_prep.config import PAIR_TYPES, TEMPLATE_ROLES, PipelineConfig
from gpu_prep.errors import Drop, Dropped, RowError
from gpu_prep.failpoint import failpoint
from gpu_prep.filter.dedup import Deduplicator, filter_rows
from gpu_prep.filter.fuzzy import MinHasher, text_band_keys
from gpu_prep.filter.splits import split_codes
from gpu_prep.format import (Conversation, Pair, Segments, Shape, Tokens, Unpaired, auto_schema, dedup_text, domain_of,
                             fuzzy_text, hashed_whole, messages_row, source_chars, split_text)
from gpu_prep.format.contract import BuilderTokenizer, build_row
from gpu_prep.read.inputs import RawChunk
from gpu_prep.read.row import DroppedRow
from gpu_prep.read.rows import first_rows, read_chunks
from gpu_prep.render.context import RenderContext, RenderedRow, no_template
from gpu_prep.render.row import affix_disagreement, render_row
from gpu_prep.run.context import Decisions, RunContext, Sources
from gpu_prep.run.overlap import Stopwatch
from gpu_prep.run.stages import Formatted, Prepared, Rows

KNOWN_ROLES = frozenset(TEMPLATE_ROLES)


# ---------------------------------------------------------------- format


def format_rows(chunk: RawChunk, base: PipelineConfig, sources: Sources | None = None,
                tokenizer: BuilderTokenizer | None = None) -> Formatted:
    """Each record into its canonical shape, by its dataset's input type (sources, by file index; else base).
    tokenizer: what builders that take one are handed (RunContext.builder_tokenizer)."""
    rows: Rows[Shape] = Rows()
    out = Formatted(rows, [], Counter(), Counter())
    for i, record in enumerate(chunk.records):
        if record is None:
            out.drops.append(chunk.errors[i])
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
            out.drops.append(DroppedRow(i, err.dropped, record))
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


def filter_reasons(run: RunContext, rows: Rows[Shape], dedup: Deduplicator | None) -> list[Dropped | None]:
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
    return [None if r is None else Dropped(r, f"{n} characters; {whole if r == Drop.DUPLICATE and hashed_whole(shape) else details[r]}")
            for r, n, shape in zip(reasons, chars.tolist(), rows.payload)]


def band_keys(run: RunContext, rows: Rows[Shape], chunk_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """preprocessing.fuzzy_dedup's band keys of the rows still alive, placed by chunk row."""
    hasher = MinHasher.from_config(run.config.preprocessing.fuzzy_dedup)
    keys = np.zeros((chunk_rows, hasher.bands), np.uint64)
    signed = np.zeros(chunk_rows, bool)
    texts = [fuzzy_text(shape) for shape in rows.payload]
    keys[rows.index], signed[rows.index] = text_band_keys(run.backend, hasher, texts)
    return keys, signed


# ---------------------------------------------------------------- render


def render_rows(rows: Rows[Shape], chunk: RawChunk, contexts: dict[int, RenderContext], ctx: RenderContext
                ) -> tuple[Rows[RenderedRow | None], list[Dropped | None]]:
    """Each row rendered with its dataset's context (contexts, by file index) or ctx; per row why it could
    not be (None: rendered)."""
    rendered: list[RenderedRow | None] = []
    reasons: list[Dropped | None] = []
    for i, shape in zip(rows.index, rows.payload):
        try:
            rendered.append(render_row(shape, contexts.get(chunk.file_index[i], ctx)))
            reasons.append(None)
        except RowError as err:
            rendered.append(None)
            reasons.append(err.dropped)
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
