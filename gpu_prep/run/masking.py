"""The mask stage: a chunk's tokens -> loss masks, truncation and the rows left with nothing to train, as array
code on the backend's xp (mask/); and mask_chunk, which makes the Done that run/commit.py takes (the stages and
their results: run/stages.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gpu_prep.backend import Backend
from gpu_prep.config import PAIR_TYPES, PipelineConfig
from gpu_prep.mask.pairs import cut_pairs, sequence_tokens
from gpu_prep.mask.project import (Masked, contiguous_places, kept_span_tokens, mask_from_ranges, offset_places,
                                   span_tokens, truncate_and_filter)
from gpu_prep.ragged import offsets_from_lengths, row_of
from gpu_prep.render.context import RenderedRow
from gpu_prep.run.context import RunContext
from gpu_prep.run.overlap import Stopwatch
from gpu_prep.run.stages import Done, Encoded, MaskResult, Prepared


@dataclass(frozen=True)
class Layout:
    """Where a chunk's pieces, tokens and trained byte spans lie, as host arrays of offsets."""

    per_piece: np.ndarray  # tokens of each piece
    piece_offsets: np.ndarray  # each row's first piece
    piece_tokens: np.ndarray  # each piece's first token
    token_offsets: np.ndarray  # each row's first token
    spans: np.ndarray  # (start, end) in bytes of every row's trained spans, in order
    span_offsets: np.ndarray  # each row's first span

    @classmethod
    def of(cls, rendered: list[RenderedRow], per_piece: np.ndarray) -> Layout:
        num_rows = len(rendered)
        piece_offsets = offsets_from_lengths(np, np.fromiter((len(r.pieces) for r in rendered), np.int64, num_rows))
        piece_tokens = offsets_from_lengths(np, per_piece)  # where each piece's tokens begin
        spans = np.array([s for r in rendered for s in r.spans], dtype=np.int64).reshape(-1, 2)
        span_offsets = offsets_from_lengths(np, np.fromiter((len(r.spans) for r in rendered), np.int64, num_rows))
        return cls(per_piece, piece_offsets, piece_tokens, piece_tokens[piece_offsets], spans, span_offsets)


class Cut(NamedTuple):
    """How a chunk's rows are cut to preprocessing.max_seq_len."""

    over: np.ndarray  # rows over it where truncation is drop or raise (not kept)
    limit: int  # tokens a row keeps
    side: str  # which end loses tokens: left or right
    keep_tail: np.ndarray  # each row's closing tokens, which outlive truncation


def mask_rows(run: RunContext, rendered: list[RenderedRow], tokens: Encoded) -> MaskResult:
    """Loss masks, truncation and the rows left with nothing to train."""
    backend, xp = run.backend, run.backend.xp
    layout = Layout.of(rendered, tokens.per_piece)
    ids_d, offsets_d = backend.asarray(tokens.ids), backend.asarray(layout.token_offsets)
    places, valid = token_places(run, rendered, tokens, layout, ids_d, offsets_d)
    span_offsets_d = backend.asarray(layout.span_offsets)
    first, stop = span_tokens(xp, places, backend.asarray(layout.spans[:, 0].copy()),
                              backend.asarray(layout.spans[:, 1].copy()), span_offsets_d)
    loss_mask = _loss_mask(backend, rendered, layout, mask_from_ranges(xp, places, first, stop), len(tokens.ids))
    cut = _cut(run.config, rendered, layout)
    masked = truncate_and_filter(xp, ids_d, loss_mask, offsets_d, cut.limit, valid & ~backend.asarray(cut.over),
                                 backend.asarray(cut.keep_tail), side=cut.side)
    if run.config.input.type in PAIR_TYPES:
        return _pair_samples(run, rendered, layout, masked, valid, cut.over)
    kept = xp.zeros(len(rendered), dtype=xp.int64)
    kept[masked.kept_rows] = 1
    by_role = kept_span_tokens(xp, first, stop, span_offsets_d, offsets_d, cut.limit, cut.side, kept)
    return MaskResult(masked, backend.to_host(valid), cut.over, backend.to_host(by_role))


def token_places(run: RunContext, rendered: list[RenderedRow], tokens: Encoded, layout: Layout, ids_d: Any,
                 offsets_d: Any) -> tuple[Any, Any]:
    """Where each token lies in its row's text (mask.project's places), and per row whether the tokens are
    placed exactly: by the tokenizer's own offsets in characters, in order; else by the tokens' byte lengths,
    covering the row byte for byte. Rows masked by pieces, not by byte spans, need neither."""
    backend, xp = run.backend, run.backend.xp
    has_spans_d = backend.asarray(np.diff(layout.span_offsets) > 0)
    if tokens.starts is not None:  # the tokenizer's own offsets, in characters
        piece_chars = np.fromiter((len(p) for r in rendered for p in r.pieces), np.int64, len(tokens.per_piece))
        places, ordered = offset_places(xp, backend.asarray(tokens.starts), backend.asarray(tokens.ends),
                                        backend.asarray(tokens.per_piece), backend.asarray(piece_chars),
                                        backend.asarray(layout.piece_offsets))
        return places, ordered | ~has_spans_d
    if run.tok.token_bytes is None:
        positions = xp.zeros(len(tokens.ids) + 1, dtype=xp.int64)
    else:
        positions = offsets_from_lengths(xp, backend.asarray(run.tok.token_bytes)[ids_d])
    places = contiguous_places(xp, positions, offsets_d)
    covered = positions[offsets_d[1:]] - positions[offsets_d[:-1]]
    row_bytes = np.fromiter((r.num_bytes for r in rendered), np.int64, len(rendered))
    return places, (covered == backend.asarray(row_bytes)) | ~has_spans_d


def _loss_mask(backend: Backend, rendered: list[RenderedRow], layout: Layout, by_span: Any, num_tokens: int) -> Any:
    """The chunk's loss mask: its trained byte spans (by_span), whole trained pieces, and the masks
    pre-tokenized rows bring."""
    xp = backend.xp
    piece_trained = np.fromiter((t for r in rendered for t in r.piece_trained), np.int8, len(layout.per_piece))
    if piece_trained.all():  # pretraining text: every token counts
        loss_mask = xp.ones(num_tokens, dtype=xp.int8)
    elif piece_trained.any():
        piece_of_token = row_of(xp, backend.asarray(layout.piece_tokens), num_tokens)
        loss_mask = xp.maximum(by_span, backend.asarray(piece_trained)[piece_of_token])
    else:  # chat: byte spans say it all
        loss_mask = by_span
    if any(r.given is not None for r in rendered):  # pre-tokenized rows bring their masks
        host = backend.to_host(loss_mask).astype(np.int8)
        for k, row in enumerate(rendered):
            if row.given is not None:
                host[layout.token_offsets[k]:layout.token_offsets[k + 1]] = row.given[1]
        loss_mask = backend.asarray(host)
    return loss_mask


def _cut(config: PipelineConfig, rendered: list[RenderedRow], layout: Layout) -> Cut:
    rules, num_rows = config.preprocessing, len(rendered)
    # The tokens of each row's closing pieces (its last ones) outlive truncation.
    closing = np.fromiter((r.closing_pieces for r in rendered), np.int64, num_rows)
    ends = layout.piece_offsets[1:]
    keep_tail = layout.piece_tokens[ends] - layout.piece_tokens[np.maximum(ends - closing, layout.piece_offsets[:-1])]
    lengths = np.diff(layout.token_offsets)
    pairs = config.input.type in PAIR_TYPES  # cut by pairs.cut_pairs, not here
    over = lengths > rules.max_seq_len if rules.truncation in ("drop", "raise") and not pairs \
        else np.zeros(num_rows, dtype=bool)
    # split: the writer cuts rows into windows, so none is truncated here
    limit = max(int(lengths.max(initial=1)), 1) if rules.truncation == "split" or pairs else rules.max_seq_len
    # structured: chat rows come cut to fit by render/truncation.py; other rows (text in an auto mix) lose their first tokens
    side = "left" if rules.truncation in ("left", "structured") else "right"
    return Cut(over, limit, side, keep_tail)


def _pair_samples(run: RunContext, rendered: list[RenderedRow], layout: Layout, masked: Masked, valid: Any,
                  over: np.ndarray) -> MaskResult:
    """Preference rows cut into their samples (prompt + each completion) by pairs.cut_pairs, which masks and
    cuts the sequences itself: the device's mask and truncation are not copied over."""
    backend, num_rows = run.backend, len(rendered)
    host = dataclasses.replace(masked, loss_mask=None, truncated_rows=None, **{
        name: backend.to_host(getattr(masked, name)) for name in ("ids", "offsets", "kept_rows", "no_trained_rows")})
    differs = np.fromiter((r.generation_prompt_differs for r in rendered), bool, num_rows)
    sides = 2 if run.config.input.type == "preference" else 1
    # each side, the prompt alone
    sequences = sequence_tokens(layout.per_piece, np.diff(layout.piece_offsets), sides + 1)
    samples, drops, counts, by_span = cut_pairs(host, sequences, run.config.preprocessing, num_rows, differs, sides)
    labels = None if sides == 2 else np.array([rendered[r].label for r in samples.kept_rows.tolist()], np.int8)
    return MaskResult(samples, backend.to_host(valid), over, by_span, sides, drops, counts, labels)


def mask_chunk(run: RunContext, clock: Stopwatch, item: tuple[Prepared, Encoded | None]) -> Done:
    """A prepared chunk and its tokens (None: nothing left to tokenize) through the mask stage, once the
    engine check of its tokens, where one is pending, gave the tokens to use."""
    prepared, tokens = item
    if tokens is None:
        return Done(prepared, None)
    if tokens.pending is not None:
        tokens = clock.time("engine check", tokens.pending.result)
    return Done(prepared, clock.time("mask", mask_rows, run, prepared.rows.payload, tokens), tokens.engine_check)
