"""The pipeline, stage by stage: read -> format -> filter -> render -> tokenize -> mask -> write.

Input is processed in chunks of rows; each stage works on a whole chunk. Row-level Python appears only
where no columnar form exists (JSON records into the canonical shape, Jinja rendering); everything over
tokens is array code on the backend's `xp`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep import __version__, pack
from gpu_prep.accounting import PIECES, Accounting
from gpu_prep.affix import detect_affix
from gpu_prep.backend import CPU, Backend, select_backend
from gpu_prep.chat_template import ChatTemplate
from gpu_prep.checkpoint import Checkpointer, load_for_resume, run_identity
from gpu_prep.config import TEMPLATE_ROLES, PipelineConfig
from gpu_prep.errors import ConfigError, Drop, InputError, Interrupted
from gpu_prep.failpoint import failpoint
from gpu_prep.filter import DEDUP_PREFIX_CHARS, Deduplicator, filter_rows
from gpu_prep.format import (
    Conversation,
    RowError,
    Segments,
    build_auto,
    dedup_text,
    domain_of,
    get_builder,
    source_text,
    string_fields,
)
from gpu_prep.mask import (
    kept_span_tokens,
    mask_from_ranges,
    offsets_from_lengths,
    row_of,
    segment_sums,
    span_tokens,
    truncate_and_filter,
)
from gpu_prep.mix import HANDLERS, Dataset, mixed_rows, with_tokenizer
from gpu_prep.overlap import Sink, Stopwatch, in_background, overlapped, quick_handoffs
from gpu_prep.read import InputFile, RawChunk, expand_inputs, file_kind, read_chunks
from gpu_prep.render import RenderContext, RenderedRow, affix_disagreement, render_row
from gpu_prep.templates import resolve_template
from gpu_prep.tokenize import Tokenizer, load_tokenizer
from gpu_prep.write import DatasetWriter, Storage, sha256_file, write_json_atomic

DEFAULT_TOKENIZER = "qwen2.5"
MANIFEST = "manifest.json"
RUN_MARKER = ".gpu-prep-run"
ENGINE_SAMPLE_BYTES = 256 << 10  # text of the first chunk on which a fast engine must equal HF before it is used


@dataclass
class Rows:
    """The rows of a chunk still alive after a stage: their positions in the chunk and what they carry."""

    index: list[int]
    domain: list[str]
    payload: list[Any]


Drops = list[tuple[int, str, str, Any]]  # (row of the chunk, reason, detail, the row as read)


def dataset_totals(config: PipelineConfig, datasets: list[Dataset], acct: Accounting) -> list[dict[str, Any]]:
    """Per dataset: rows read, written and dropped by reason, tokens written, and the share of the output's
    rows and tokens it makes beside the sampling ratio asked for."""
    rows_out = sum(c.rows_written for c in acct.counts) or 1
    tokens_out = sum(acct.tokens_by_file) or 1
    out = []
    for spec, dataset in zip(config.datasets or [], datasets):
        counts = [acct.counts[f.index] for f in dataset.files]
        dropped: Counter = Counter()
        for c in counts:
            dropped.update(c.dropped)
        written = sum(c.rows_written for c in counts)
        tokens = sum(acct.tokens_by_file[f.index] for f in dataset.files)
        out.append({"name": spec.name, "files": [f.path for f in dataset.files], "sampling": spec.sampling,
                    "rows_read": sum(c.rows_read for c in counts), "rows_written": written,
                    "rows_dropped": dict(sorted(dropped.items())), "tokens": tokens,
                    "share_of_rows": written / rows_out, "share_of_tokens": tokens / tokens_out})
    return out


Sources = dict[int, tuple[PipelineConfig, "str | None"]]  # file index -> its dataset's config and domain


def _format(chunk: RawChunk, base: PipelineConfig, drops: Drops, sources: Sources | None = None) -> Rows:
    rows = Rows([], [], [])
    for i, record in enumerate(chunk.records):
        file_index = chunk.file_index[i]
        if record is None:
            drops.append((i, *chunk.errors[i]))
            continue
        config, own_domain = sources.get(file_index, (base, None)) if sources else (base, None)
        auto = config.input.type == "auto"
        schema = config.input.type
        if isinstance(record, list):  # a conversation written as its messages alone
            if config.input.type not in ("chat", "auto"):
                drops.append((i, Drop.NOT_AN_OBJECT, "a row that is a list of messages is read "
                              f"by input.type chat or auto, not {config.input.type}", record))
                continue
            record = {config.input.messages_key: record}
        try:
            domain = domain_of(record, config.output.domain_key)
            if own_domain is not None and config.output.domain_key is None:  # a dataset's own domain
                domain = own_domain
            shape = (build_auto if auto else get_builder(config.input.type))(record, config)
            if auto:
                schema, shape = shape
        except RowError as err:
            drops.append((i, err.reason, err.detail, record))
            continue
        chunk.schemas[schema] = chunk.schemas.get(schema, 0) + 1
        if isinstance(shape, Conversation):
            _note(chunk, shape)
        rows.index.append(i)
        rows.domain.append(domain)
        rows.payload.append(shape)
    return rows


KNOWN_ROLES = frozenset(TEMPLATE_ROLES)


def _note(chunk: RawChunk, conv: Conversation) -> None:
    """Count what the parse report shows: rows with tools, and roles chat templates do not know (they are
    rendered as the template sees fit, never dropped silently: see messages_left_out_by_template)."""
    keys = ["rows_with_tools"] * bool(conv.tools) + list(conv.notes)
    keys += [f"unknown_role:{m['role']}" for m in conv.messages if m["role"] not in KNOWN_ROLES]
    for key in keys:
        chunk.notes[key] = chunk.notes.get(key, 0) + 1


def _drop_where(rows: Rows, reasons: list[tuple[str, str] | None], chunk: RawChunk, drops: Drops) -> Rows:
    kept = Rows([], [], [])
    for i, domain, payload, reason in zip(rows.index, rows.domain, rows.payload, reasons):
        if reason is None:
            kept.index.append(i)
            kept.domain.append(domain)
            kept.payload.append(payload)
        else:
            drops.append((i, *reason, chunk.records[i]))
    return kept


def _filter(backend: Backend, rows: Rows, config: PipelineConfig, dedup: Deduplicator | None) -> list:
    texts = [source_text(shape) for shape in rows.payload]
    keys = [dedup_text(shape, text) for shape, text in zip(rows.payload, texts)]
    pretraining = np.fromiter((isinstance(s, Segments) and s.train_all for s in rows.payload), bool, len(texts))
    reasons = filter_rows(backend, texts, keys, pretraining, config, dedup)
    rules = config.preprocessing
    details = {Drop.TOO_SHORT: f"shorter than min_chars {rules.min_chars}",
               Drop.TOO_LONG: f"longer than max_chars {rules.max_chars}",
               Drop.DUPLICATE: f"its first {DEDUP_PREFIX_CHARS} characters have the MD5 of an earlier row's"}
    return [None if r is None else (r, f"{len(t)} characters; {details[r]}") for r, t in zip(reasons, texts)]


def _render(rows: Rows, ctx: RenderContext, contexts: dict[int, RenderContext] | None = None,
            chunk: RawChunk | None = None) -> tuple[Rows, list]:
    """Each row rendered with its context: ctx, or its dataset's (contexts, by file index of the chunk)."""
    rendered, reasons = [], []
    for i, shape in zip(rows.index, rows.payload):
        own = contexts.get(chunk.file_index[i], ctx) if contexts and chunk is not None else ctx
        try:
            rendered.append(render_row(shape, own))
            reasons.append(None)
        except RowError as err:
            rendered.append(None)
            reasons.append((err.reason, err.detail))
    return Rows(rows.index, rows.domain, rendered), reasons


def _engine_sample_size(rendered: list[RenderedRow]) -> int:
    """How many of the first pieces of the input make about ENGINE_SAMPLE_BYTES (at least one row's)."""
    count = size = 0
    for row in rendered:
        count += len(row.pieces)
        size += row.num_bytes
        if size >= ENGINE_SAMPLE_BYTES:
            break
    return count


def _tokenize(encode: Callable, rendered: list[RenderedRow]) -> tuple[np.ndarray, np.ndarray]:
    ids, counts = encode([p for row in rendered for p in row.pieces])
    if all(row.given is None for row in rendered):
        return ids, counts
    # Pre-tokenized rows bring their ids: each has one empty piece, which takes them.
    parts, piece, at = [], 0, 0
    counts = counts.copy()
    for row in rendered:
        if row.given is not None:
            counts[piece] = len(row.given[0])
            parts.append(row.given[0])
        else:
            n = int(counts[piece:piece + len(row.pieces)].sum())
            parts.append(ids[at:at + n])
            at += n
        piece += len(row.pieces)
    return np.concatenate(parts).astype(np.int64, copy=False), counts


def _mask(backend: Backend, tok: Tokenizer, rendered: list[RenderedRow], ids: np.ndarray,
          tokens_per_piece: np.ndarray, max_seq_len: int, truncation: str = "right") -> Any:
    """Loss masks, truncation and the rows left with nothing to train. Returns the Masked arrays, which
    rows the tokens cover byte for byte, and which rows are over max_seq_len where truncation is drop or
    raise (those are not kept)."""
    xp = backend.xp
    num_pieces = len(tokens_per_piece)
    piece_offsets = offsets_from_lengths(np, np.fromiter((len(r.pieces) for r in rendered), np.int64, len(rendered)))
    token_offsets = offsets_from_lengths(np, segment_sums(np, tokens_per_piece, piece_offsets))
    piece_trained = np.fromiter((t for r in rendered for t in r.piece_trained), np.int8, num_pieces)
    spans = np.array([s for r in rendered for s in r.spans], dtype=np.int64).reshape(-1, 2)
    span_offsets = offsets_from_lengths(np, np.fromiter((len(r.spans) for r in rendered), np.int64, len(rendered)))
    row_bytes = np.fromiter((r.num_bytes for r in rendered), np.int64, len(rendered))
    has_spans = np.diff(span_offsets) > 0

    ids_d, offsets_d = backend.asarray(ids), backend.asarray(token_offsets)
    if tok.token_bytes is None:
        positions = xp.zeros(len(ids) + 1, dtype=xp.int64)
    else:
        positions = offsets_from_lengths(xp, backend.asarray(tok.token_bytes)[ids_d])
    # Rows masked by byte spans must be covered byte for byte by their tokens; rows masked by pieces need not.
    covered = positions[offsets_d[1:]] - positions[offsets_d[:-1]]
    valid = (covered == backend.asarray(row_bytes)) | ~backend.asarray(has_spans)
    span_offsets_d = backend.asarray(span_offsets)
    first, stop = span_tokens(xp, positions, offsets_d, backend.asarray(spans[:, 0].copy()),
                              backend.asarray(spans[:, 1].copy()), span_offsets_d)
    by_span = mask_from_ranges(xp, positions, first, stop)
    if piece_trained.all():  # pretraining text: every token counts
        loss_mask = xp.ones(len(ids), dtype=xp.int8)
    elif piece_trained.any():
        piece_of_token = row_of(xp, backend.asarray(offsets_from_lengths(np, tokens_per_piece)), len(ids))
        loss_mask = xp.maximum(by_span, backend.asarray(piece_trained)[piece_of_token])
    else:  # chat: byte spans say it all
        loss_mask = by_span
    if any(r.given is not None for r in rendered):  # pre-tokenized rows bring their masks
        host = backend.to_host(loss_mask).astype(np.int8)
        for k, row in enumerate(rendered):
            if row.given is not None:
                host[token_offsets[k]:token_offsets[k + 1]] = row.given[1]
        loss_mask = backend.asarray(host)
    closing = np.fromiter((r.closing_piece for r in rendered), bool, len(rendered))
    keep_tail = np.zeros(len(rendered), dtype=np.int64)
    keep_tail[closing] = tokens_per_piece[piece_offsets[1:][closing] - 1]
    lengths = np.diff(token_offsets)
    over = lengths > max_seq_len if truncation in ("drop", "raise") else np.zeros(len(rendered), dtype=bool)
    limit = max(int(lengths.max(initial=1)), 1) if truncation == "split" else max_seq_len  # split: the writer cuts
    side = "left" if truncation in ("left", "structured") else "right"
    masked = truncate_and_filter(xp, ids_d, loss_mask, offsets_d, limit, valid & ~backend.asarray(over),
                                 backend.asarray(keep_tail), side=side)
    kept = xp.zeros(len(rendered), dtype=xp.int64)
    kept[masked.kept_rows] = 1
    by_role = kept_span_tokens(xp, first, stop, span_offsets_d, offsets_d, limit, side, kept)
    return masked, backend.to_host(valid), over, backend.to_host(by_role)


def _write(backend: Backend, masked: Any, valid: np.ndarray, over: np.ndarray, span_trained: np.ndarray,
           rows: Rows, chunk: RawChunk, writer: DatasetWriter, acct: Accounting, rules: Any, drops: Drops) -> None:
    """Append the chunk's samples to their domains and count them; the rows dropped here go to drops."""
    ids, loss_mask = backend.to_host(masked.ids), backend.to_host(masked.loss_mask)
    offsets, kept = backend.to_host(masked.offsets), backend.to_host(masked.kept_rows)
    truncated = set(backend.to_host(masked.truncated_rows).tolist())
    truncated.update(r for r, row in enumerate(rows.payload) if row.notes)  # turns dropped to fit (structured)
    def drop(r: int, reason: str, detail: str) -> None:
        drops.append((rows.index[r], reason, detail, chunk.records[rows.index[r]]))

    for r in np.nonzero(~valid)[0]:
        drop(r, Drop.TOKENIZER_MISMATCH, "the tokens do not cover the rendered text byte for byte")
    for r in np.nonzero(valid & over)[0]:
        detail = f"over max_seq_len {rules.max_seq_len} tokens"
        if rules.truncation == "raise":
            i = rows.index[r]
            where = f"{acct.files[chunk.file_index[i]].path}:{chunk.line[i]}"
            raise InputError(f"{where}: {detail} (preprocessing.truncation is 'raise')")
        drop(r, Drop.TOO_MANY_TOKENS, detail)
    for r in backend.to_host(masked.no_trained_rows):
        drop(r, Drop.NO_TRAINED_TOKENS, "no trained token within max_seq_len")
    lengths = np.diff(offsets)
    for k, r in enumerate(kept):
        file_index = chunk.file_index[rows.index[r]]
        acct.written(file_index, int(r) in truncated)
        acct.tokens_by_file[file_index] += int(lengths[k])
    _append_by_domain(writer, [rows.domain[r] for r in kept], ids, loss_mask, offsets)
    acct.tokens += len(ids)
    trained = int(loss_mask.sum())
    acct.trained_tokens += trained
    # Trained tokens by the role of the message they are in; whole trained pieces (instruction responses,
    # text, segments, pre-tokenized labels) are counted under PIECES.
    codes: dict[str, int] = {}
    span_codes = np.fromiter((codes.setdefault(role, len(codes)) for row in rows.payload for role in row.span_roles),
                             np.int64, len(span_trained))
    per_role = np.bincount(span_codes, weights=span_trained, minlength=len(codes)).astype(np.int64)
    acct.trained_by_role.update({role: int(per_role[c]) for role, c in codes.items() if per_role[c]})
    if trained > int(per_role.sum()):
        acct.trained_by_role[PIECES] += trained - int(per_role.sum())


def _append_by_domain(writer: DatasetWriter, domains: list[str], ids: np.ndarray, loss_mask: np.ndarray,
                      offsets: np.ndarray) -> None:
    """Hand each domain its samples, in input order: one stable sort of the samples by domain and one
    gather of their tokens, whatever the number of domains."""
    names = list(dict.fromkeys(domains))  # in order of first appearance
    if len(names) == 1:
        writer.append(names[0], ids, loss_mask, offsets)
        return
    code = {name: k for k, name in enumerate(names)}
    codes = np.fromiter((code[d] for d in domains), np.int64, len(domains))
    order = np.argsort(codes, kind="stable")
    lengths = np.diff(offsets)[order]
    sorted_offsets = offsets_from_lengths(np, lengths)
    gather = np.repeat(offsets[:-1][order] - sorted_offsets[:-1], lengths) + np.arange(sorted_offsets[-1])
    ids, loss_mask = ids[gather], loss_mask[gather]
    bounds = offsets_from_lengths(np, np.bincount(codes, minlength=len(names)))
    for k, name in enumerate(names):
        first, last = sorted_offsets[bounds[k]], sorted_offsets[bounds[k + 1]]
        writer.append(name, ids[first:last], loss_mask[first:last],
                      sorted_offsets[bounds[k]:bounds[k + 1] + 1] - first)


def _prepare(chunks: Iterator[RawChunk], config: PipelineConfig, ctx: RenderContext, backend: Backend,
             dedup: Deduplicator | None, clock: Stopwatch, decided: dict[str, Any],
             sources: Sources | None = None) -> Iterator[tuple[RawChunk, Rows, Drops, list[bytes]]]:
    """The host stages, chunk by chunk: read -> format -> filter -> render. Each chunk comes with the dedup
    digests it added; decided["affix"] records whether Jinja-free rendering was trusted (None: not yet)."""
    if decided.get("affix") is False:
        ctx = dataclasses.replace(ctx, affix=None)
    affix_pending = ctx.affix is not None and decided.get("affix") is None
    contexts, contexts_of = None, None  # the datasets' own contexts, and the ctx they were made from
    while (chunk := clock.time("read", next, chunks, None)) is not None:
        failpoint("read")
        drops: Drops = []
        rows = clock.time("format", _format, chunk, config, drops, sources)
        if affix_pending and rows.index:
            # Trust the Jinja-free rendering only once it matched Jinja on the first chunk's rows.
            if clock.time("render", affix_disagreement, rows.payload, ctx) is not None:
                ctx = dataclasses.replace(ctx, affix=None)
            affix_pending = False
            decided["affix"] = ctx.affix is not None
        rows = _drop_where(rows, clock.time("filter", _filter, backend, rows, config, dedup), chunk, drops)
        if contexts is None or contexts_of is not ctx:
            contexts, contexts_of = _dataset_contexts(ctx, config, sources), ctx
        rows, reasons = clock.time("render", _render, rows, ctx, contexts, chunk)
        digests = dedup.take_added() if dedup is not None else []
        yield chunk, _drop_where(rows, reasons, chunk, drops), drops, digests


def _dataset_contexts(ctx: RenderContext, config: PipelineConfig, sources: Sources | None) -> dict[int, RenderContext]:
    """By file index: the context of each dataset that has its own settings (with its own cache of mask
    decisions), one per dataset."""
    own: dict[int, RenderContext] = {}
    by_config = {}
    for file_index, (cfg, _) in (sources or {}).items():
        if cfg is not config:
            own[file_index] = by_config.setdefault(id(cfg), dataclasses.replace(ctx, config=cfg, _trains={}))
    return own


def check_output(out_dir: Path, overwrite: bool, resume: bool) -> None:
    """Refuse an output that cannot be used, before any work (or deletion) is done."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"output {str(out_dir)!r} is a file, not a directory")
    if not (out_dir.is_dir() and any(out_dir.iterdir())):
        return
    if not (out_dir / MANIFEST).exists() and not (out_dir / RUN_MARKER).exists():
        raise ConfigError(f"output {str(out_dir)!r} holds files that are not a gpu-prep run; refusing to touch them")
    if not (overwrite or resume):
        raise ConfigError(f"output {str(out_dir)!r} is not empty; pass --resume to finish an interrupted run "
                          "or --overwrite to replace it")


def prepare_output(out_dir: Path, overwrite: bool, resume: bool = False) -> None:
    """Empty (or, resuming, keep) an output check_output accepted, and mark it as a gpu-prep run."""
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if resume:
            return
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Marks the directory as gpu-prep's from the start, so a run that stopped early can be replaced.
    (out_dir / RUN_MARKER).write_text("a gpu-prep run; finished once manifest.json exists\n", encoding="utf-8")


def remove_partial_files(out_dir: Path) -> None:
    """After a failed run: remove the temporary files of shards that were never finished."""
    for path in out_dir.rglob(".*.tmp"):
        path.unlink(missing_ok=True)


def render_context(config: PipelineConfig, tok: Tokenizer) -> RenderContext:
    text, template_eot = resolve_template(config.chat_template, tok.chat_template)
    template = ChatTemplate(text, tok.special_tokens) if text else None
    affix = detect_affix(template.render) if template is not None and config.input.type == "chat" else None
    return RenderContext(
        config=config,
        template=template,
        affix=affix,
        end_of_turn=tuple(config.input.end_of_turn_tokens or dict.fromkeys([*tok.end_of_turn_tokens(), *template_eot])),
        normalization=tok.normalization,
        span_problem=tok.span_problem(),
        prefix_text=tok.prefix_text,
        suffix_text=tok.suffix_text,
        eos_text=tok.eos_text,
        vocab_size=int(tok.engine.get_vocab_size(with_added_tokens=True)),
        first_tokens=tok.first_tokens,
        count_tokens=tok.count_tokens,
    )


@dataclass
class Options:
    """How a run goes, as opposed to what it makes: none of these changes a byte of the output."""

    chunk_rows: int = 2048
    workers: int | None = None
    rejects: Path | None = None
    strict: bool = False
    progress: Callable[[int], None] | None = None
    cluster: str | None = None  # a Dask cluster to run on: "local:N" or a scheduler's address
    announce: Callable[[str], None] | None = None  # told the cluster's dashboard address
    plugins: tuple[str, ...] = ()  # --plugin modules, which a cluster's workers load too
    part_bytes: int | None = None  # a cluster's parts of JSON Lines files (default cluster.PART_BYTES)
    device: str = "auto"  # what a cluster's workers run on (the output is the same on either)
    tokenizer: str = DEFAULT_TOKENIZER  # the tokenizer the run loaded, which a cluster's workers load too


def run_inputs(config: PipelineConfig, inputs: list[str]) -> tuple[list[InputFile], list[Dataset] | None]:
    """The run's input files, and its datasets when the config names them (their files, in order)."""
    if not config.datasets:
        if not inputs:
            raise ConfigError("no input: give files, folders or globs, or a config with datasets")
        return expand_inputs(inputs), None
    if inputs:
        raise ConfigError("the config's datasets name the inputs: give none on the command line")
    files: list[InputFile] = []
    datasets = []
    for spec in config.datasets:
        own = []
        for found in expand_inputs(spec.data_paths):
            if spec.builder is None and file_kind(found.path) is None:
                raise ConfigError(f"dataset {spec.name!r}: {found.path} has no known extension; "
                                  "name its format with the dataset's builder (json, jsonl or parquet)")
            own.append(InputFile(len(files) + len(own), found.path, found.size_bytes, spec.builder))
        files.extend(own)
        datasets.append(Dataset(spec.name, own, dataset_handlers(spec)))
    return files, datasets


def columnar_reader(config: PipelineConfig, backend: Backend) -> Any:
    """What reads JSON Lines as columns on this backend when the config asks for it (gpu.reader cudf) and
    its rows are read by string fields; None: line by line."""
    fields = string_fields(config)
    return backend.columnar_reader(fields) if config.gpu.reader == "cudf" and fields else None


def dataset_handlers(spec: Any) -> list[tuple[Any, dict[str, Any], str, Any]]:
    """A dataset's data handlers as Dataset takes them (by name, so plugins' handlers are found)."""
    return [(HANDLERS[h.name], h.fn_kwargs(), h.name, h.arguments.get("remove_columns")) for h in spec.data_handlers]


def dataset_sources(config: PipelineConfig, datasets: list[Dataset]) -> Sources:
    """By file index: the config of the file's dataset and the domain it names."""
    own = [config.dataset_config(k) for k in range(len(datasets))]
    return {f.index: (own[k], spec.domain) for k, (spec, d) in enumerate(zip(config.datasets or [], datasets))
            for f in d.files}


@dataclass
class Done:
    """A chunk through every stage but accounting and writing, which happen in input order in one place
    (a cluster's workers send these back to the driver)."""

    chunk: RawChunk
    rows: Rows
    drops: Drops
    digests: list[bytes]  # the dedup digests the chunk added (checkpoints log them)
    masked: tuple[Any, np.ndarray, np.ndarray, np.ndarray] | None  # _mask's result; None: nothing tokenized


class Tokenizing:
    """Tokenizes chunks with the engine the run's first rows chose (decided["engine"]; a resumed run and a
    cluster's workers are handed the choice)."""

    def __init__(self, tok: Tokenizer, backend: Backend, requested: str, decided: dict[str, Any],
                 threads: int | None) -> None:
        self.tok, self.backend, self.requested, self.decided, self.threads = tok, backend, requested, decided, threads
        self.encode = None
        if decided.get("engine") is not None:
            tok.restore_engine(*decided["engine"], threads)
            self.encode = backend.encoder(tok)

    def __call__(self, rendered: list[RenderedRow], clock: Stopwatch) -> tuple[np.ndarray, np.ndarray]:
        failpoint("tokenize")
        if self.encode is not None:
            return clock.time("tokenize", _tokenize, self.encode, rendered)
        # The first rows choose the engine, checking it on a sample of them.
        first = functools.partial(self.tok.use_engine, self.requested, sample_size=_engine_sample_size(rendered),
                                  threads=self.threads)
        tokens = clock.time("tokenize", _tokenize, first, rendered)
        self.encode = self.backend.encoder(self.tok)
        self.decided["engine"] = [self.tok.active.name, self.tok.engine_choice]
        return tokens


def mask_chunk(backend: Backend, tok: Tokenizer, config: PipelineConfig, clock: Stopwatch,
               item: tuple[RawChunk, Rows, Drops, list[bytes], Any]) -> Done:
    chunk, rows, drops, digests, tokens = item
    masked = None
    if tokens is not None:
        rules = config.preprocessing
        masked = clock.time("mask", _mask, backend, tok, rows.payload, *tokens, rules.max_seq_len, rules.truncation)
    return Done(chunk, rows, drops, digests, masked)


def account_and_write(done: Done, backend: Backend, config: PipelineConfig, acct: Accounting,
                      writer: DatasetWriter, clock: Stopwatch) -> None:
    """Account for a chunk and write it (the only place accounting and writing happen)."""
    acct.read(done.chunk.file_index)
    acct.schemas.update(done.chunk.schemas)
    acct.notes.update(done.chunk.notes)
    for row in done.rows.payload:
        acct.left_out.update(row.left_out)
        acct.notes.update(row.notes)
    drops = list(done.drops)
    if done.masked is not None:
        clock.time("write", _write, backend, *done.masked, done.rows, done.chunk, writer, acct, config.preprocessing,
                   drops)
    # In row order, whichever stage dropped them: the rejects file and the examples do not depend on chunks.
    for i, reason, detail, row in sorted(drops, key=lambda drop: drop[0]):
        acct.dropped(done.chunk.file_index[i], done.chunk.line[i], reason, detail, row)


def prepare_and_tokenize(chunks: Iterator[RawChunk], config: PipelineConfig, ctx: RenderContext, backend: Backend,
                         tok: Tokenizer, dedup: Deduplicator | None, clock: Stopwatch, decided: dict[str, Any],
                         sources: Sources | None, threads: int | None) -> Iterator[tuple[RawChunk, Rows, Drops, list[bytes], Any]]:
    """Chunks read -> formatted, filtered, rendered (a chunk ahead, in a thread of its own) and tokenized."""
    tokenizing = Tokenizing(tok, backend, config.tokenizer.engine, decided, threads)
    for chunk, rows, drops, digests in overlapped(_prepare(chunks, config, ctx, backend, dedup, clock, decided, sources)):
        yield chunk, rows, drops, digests, tokenizing(rows.payload, clock) if rows.index else None


def decide(chunks: Iterator[RawChunk], config: PipelineConfig, ctx: RenderContext, backend: Backend, tok: Tokenizer,
           dedup: Deduplicator | None, decided: dict[str, Any], sources: Sources | None, threads: int | None) -> None:
    """Make the decisions a run makes on its first rows (is Jinja-free rendering trusted, which tokenizer
    engine) on those rows, without writing anything: what a cluster's driver hands its workers."""
    def pending() -> bool:
        return decided.get("engine") is None or (ctx.affix is not None and decided.get("affix") is None)

    if not pending():  # decided before the run was stopped: the driver's tokenizer takes the engine again
        Tokenizing(tok, backend, config.tokenizer.engine, decided, threads)
        return
    for _ in prepare_and_tokenize(chunks, config, ctx, backend, tok, dedup, Stopwatch(), decided, sources, threads):
        if not pending():
            return


def _process(config: PipelineConfig, files: list, tok: Tokenizer, backend: Backend, out_dir: Path,
             clock: Stopwatch, options: Options, checkpoints: Checkpointer,
             resumed: dict[str, Any] | None, datasets: list[Dataset] | None = None,
             cluster_info: dict[str, Any] | None = None) -> tuple[Accounting, dict[str, Any]]:
    """Every chunk through every stage, here or on a cluster; returns the accounting and the domains
    written. resumed: the checkpoint a resumed run carries on from; cluster_info gets what the manifest
    says of a cluster."""
    ctx = render_context(config, tok)
    resumed = resumed or {}
    decided: dict[str, Any] = {"affix": resumed.get("affix"), "engine": resumed.get("engine")}
    acct = Accounting(files, rejects=options.rejects, strict=options.strict, state=resumed.get("accounting"))
    split = config.preprocessing.max_seq_len if config.preprocessing.truncation == "split" else None
    storage = Storage.from_config(config, ctx.vocab_size)
    writer = DatasetWriter(out_dir, storage, config.output.max_tokens_per_shard, split)
    writer.restore(resumed.get("writer", []))
    dedup = Deduplicator(checkpoints.seen()) if config.preprocessing.deduplicate else None
    sources: Sources = {}
    if datasets is not None:
        with_tokenizer(datasets, tok)
        sources = dataset_sources(config, datasets)

    def state() -> dict[str, Any]:
        return {"accounting": acct.state(), "writer": writer.state(), **decided}

    def finish(done: Done) -> None:
        account_and_write(done, backend, config, acct, writer, clock)
        if checkpoints.chunk_done(len(done.chunk), done.digests, state):
            writer.remove_obsolete()
        if options.progress is not None:
            options.progress(len(done.chunk))

    try:
        if options.cluster is not None:
            from gpu_prep.cluster import run_on_cluster

            for done in run_on_cluster(options.cluster, config, files, datasets, tok, ctx, backend, dedup, decided,
                                       sources, checkpoints.rows_done, options, clock, cluster_info):
                finish(done)
        else:
            columnar = columnar_reader(config, backend)
            mixed = None
            if datasets is not None:
                process = config.dataprocessor
                mixed = mixed_rows(datasets, config.sampling_ratios(), process.seed,
                                   process.sampling_stopping_strategy, columnar, config.input.max_row_bytes)
            chunks = read_chunks(files, options.chunk_rows, config.preprocessing.max_items, columnar=columnar,
                                 skip=checkpoints.rows_done, max_row_bytes=config.input.max_row_bytes, rows=mixed)
            # Three stages overlap, each in its own thread and in order: reading, formatting, filtering and
            # rendering run a chunk ahead; this thread tokenizes (the engines release the GIL); masking,
            # accounting and writing run a chunk behind. Output does not depend on the overlap.
            with quick_handoffs(), Sink(lambda item: finish(mask_chunk(backend, tok, config, clock, item))) as sink:
                for item in prepare_and_tokenize(chunks, config, ctx, backend, tok, dedup, clock, decided, sources,
                                                 options.workers):
                    sink.put(item)
    except BaseException as exc:
        acct.abort(keep=isinstance(exc, (KeyboardInterrupt, Interrupted)))
        raise
    acct.close()
    domains = clock.time("write", writer.finish)
    return acct, domains


def run(config: PipelineConfig, inputs: list[str], out_dir: str | Path, *, tokenizer: str | None = None,
        device: str | None = None, chunk_rows: int = 2048, overwrite: bool = False, resume: bool = False,
        workers: int | None = None, rejects: str | Path | None = None, strict: bool = False,
        progress: Callable[[int], None] | None = None, checkpoint_seconds: float = 30.0,
        cluster: str | None = None, announce: Callable[[str], None] | None = None, plugins: tuple[str, ...] = (),
        part_bytes: int | None = None) -> dict[str, Any]:
    """Run the whole pipeline and return the manifest (also written to OUT_DIR/manifest.json).

    resume: finish the interrupted run in OUT_DIR from its last checkpoint (a finished run is returned as
    it is); the result is byte for byte the one an uninterrupted run writes. cluster: run on Dask ("local:N"
    or a scheduler's address; see gpu_prep.cluster), with the same result; announce is told its dashboard
    address, plugins are loaded by its workers, part_bytes is how JSON Lines files are cut for it."""
    started = time.perf_counter()
    clock = Stopwatch()
    files, datasets = run_inputs(config, inputs)
    out_dir = Path(out_dir)
    if resume and (out_dir / MANIFEST).exists():  # finished already: nothing to do
        return json.loads((out_dir / MANIFEST).read_text(encoding="utf-8"))
    check_output(out_dir, overwrite, resume)
    tokenizer = tokenizer or config.tokenizer.name or DEFAULT_TOKENIZER
    tok = clock.time("load tokenizer", load_tokenizer, tokenizer)
    clock.time("load tokenizer", tok.prepare_engines, config.tokenizer.engine)
    device = device or config.device
    # On a cluster the driver only decides, accounts and writes: the workers take the GPUs.
    backend = select_backend(device, config.gpu.rmm_pool_size, config.gpu.spill) if cluster is None else CPU
    prepare_output(out_dir, overwrite, resume)
    config_sha256, tokenizer_identity = config.sha256(), tok.identity()  # hashes files: once a run
    identity = run_identity(config_sha256, files, tokenizer_identity)
    resumed = load_for_resume(out_dir, identity, keep={RUN_MARKER}) if resume else None
    checkpoints = Checkpointer(out_dir, identity, checkpoint_seconds, resumed)
    options = Options(chunk_rows, workers, Path(rejects) if rejects else None, strict, progress, cluster, announce,
                      tuple(plugins), part_bytes, device, tokenizer)
    cluster_info: dict[str, Any] = {}
    # The inputs' checksums are taken beside the run (hashing releases the GIL), not after it.
    checksums = in_background(lambda: [sha256_file(Path(f.path)) for f in files])
    try:
        acct, domains = _process(config, files, tok, backend, out_dir, clock, options, checkpoints, resumed, datasets,
                                 cluster_info)
    except BaseException as exc:
        checkpoints.close()
        if not isinstance(exc, (KeyboardInterrupt, Interrupted)):  # an interrupted run keeps what --resume needs
            remove_partial_files(out_dir)
        raise
    checksums = clock.time("checksums", checksums)
    elapsed = time.perf_counter() - started
    manifest = {
        "gpu_prep_version": __version__,
        "config": config.model_dump(mode="json"),
        "config_sha256": config_sha256,
        # The engine is chosen during the run, on its first rows.
        "tokenizer": {**tokenizer_identity, "engine": tok.active.name, "engine_choice": tok.engine_choice},
        "device": cluster_info.get("device", backend.name),
        **({"cluster": cluster_info} if cluster is not None else {}),
        "inputs": acct.per_file(checksums),
        "totals": acct.totals(),
        **({"datasets": dataset_totals(config, datasets, acct)} if datasets is not None else {}),
        "dropped_examples": acct.examples,
        **({"packing": pack.summary([{"num_samples": m["num_samples"], **m["packing"]} for m in domains.values()],
                                    config.preprocessing.max_seq_len)} if config.preprocessing.packing != "none" else {}),
        "domains": domains,
        "seconds": {"total": round(elapsed, 3), **{k: round(v, 3) for k, v in clock.seconds.items()}},
    }
    failpoint("manifest")
    write_json_atomic(out_dir / MANIFEST, manifest)
    checkpoints.finish()
    return manifest
