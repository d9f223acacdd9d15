"""mask/project: token places + trained spans -> loss_mask; truncation; rows left with nothing to train.

Written once against the array module `xp` (numpy or cupy). Ragged data is flat values + int64 offsets.
loss_mask: 1 = the token counts in the loss, 0 = it does not. A token is trained when any of its bytes lies
in a trained span (the rule transformers applies for return_assistant_tokens_mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_prep.ragged import offsets_from_lengths, row_of, segment_sums  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Places:
    """Where every token lies in the running coordinates of all rows (bytes for byte-level BPE, characters
    where the tokenizer reports offsets): token t covers [starts[t], ends[t]); row r spans [base[r],
    limit[r]). Both starts and ends grow (never shrink) from token to token."""

    starts: Any
    ends: Any
    base: Any
    limit: Any


def contiguous_places(xp: Any, positions: Any, token_offsets: Any) -> Places:
    """Places of tokens that cover their rows byte for byte: positions are where each token starts in the
    running bytes of all rows, and where the last one ends (offsets_from_lengths of the tokens' byte
    lengths); token_offsets: tokens of each row."""
    return Places(positions[:-1], positions[1:], positions[token_offsets[:-1]], positions[token_offsets[1:]])


def offset_places(xp: Any, starts: Any, ends: Any, tokens_per_piece: Any, piece_lengths: Any, piece_offsets: Any
                  ) -> tuple[Places, Any]:
    """Places from the offsets a tokenizer reports, each relative to its piece (tokens_per_piece tokens of
    piece_lengths characters each; piece_offsets: the pieces of each row), and per row whether its offsets
    grow from token to token and stay inside their piece, as span_tokens needs (a row whose do not cannot
    be masked exactly)."""
    token_offsets = offsets_from_lengths(xp, tokens_per_piece)
    base = offsets_from_lengths(xp, piece_lengths)
    piece = row_of(xp, token_offsets, len(starts))
    starts, ends = starts + base[piece], ends + base[piece]
    bad = (ends > base[1:][piece]).astype(xp.int64)
    if len(starts) > 1:
        bad[1:] += (starts[1:] < starts[:-1]) | (ends[1:] < ends[:-1])
    ordered = segment_sums(xp, segment_sums(xp, bad, token_offsets), piece_offsets) == 0
    return Places(starts, ends, base[piece_offsets[:-1]], base[piece_offsets[1:]]), ordered


def span_tokens(xp: Any, places: Places, span_start: Any, span_end: Any, span_offsets: Any) -> tuple[Any, Any]:
    """The tokens [a, b) each span trains (any of a token's bytes or characters in the span), made
    disjoint: a token on the edge of two spans counts for the first. b - a may be 0 or less (the span
    trains no token).

    span_start/span_end: trained ranges relative to their row, sorted and disjoint within a row;
    span_offsets: spans of each row.
    """
    if len(span_start) == 0:
        none = xp.zeros(0, dtype=xp.int64)
        return none, none
    span_row = row_of(xp, span_offsets, len(span_start))
    # Clipped to the row, so spans stay sorted even where a row's tokens miss bytes.
    limit = places.limit[span_row]
    start = xp.minimum(span_start + places.base[span_row], limit)
    end = xp.minimum(span_end + places.base[span_row], limit)
    # Span s trains tokens [a_s, b_s): those ending after it starts and starting before it ends. Token
    # places only grow, so two searches per span (not one per token) find them, and both a and b grow with s.
    a = xp.searchsorted(places.ends, start, side="right")
    b = xp.searchsorted(places.starts, end, side="left")
    a = xp.maximum(a, xp.concatenate([xp.zeros(1, dtype=b.dtype), b[:-1]]))
    return a, b


def project(xp: Any, positions: Any, token_offsets: Any, span_start: Any, span_end: Any, span_offsets: Any) -> Any:
    """loss_mask (int8) for every token of rows covered byte for byte (contiguous_places' arguments): 1
    where a token holds a byte of a trained span."""
    places = contiguous_places(xp, positions, token_offsets)
    return mask_from_ranges(xp, places, *span_tokens(xp, places, span_start, span_end, span_offsets))


def mask_from_ranges(xp: Any, places: Places, a: Any, b: Any) -> Any:
    """loss_mask (int8) from span_tokens' ranges."""
    n = len(places.starts)
    if len(a) == 0:
        return xp.zeros(n, dtype=xp.int8)
    # Empty ranges and the edges where one ends as the next begins are left out: what remains are distinct
    # positions where the mask turns on (+1) and off (-1), so one int8 running sum over the tokens is the mask.
    keep = b > a
    a, b = a[keep], b[keep]
    turns_on = a != xp.concatenate([xp.full(1, -1, dtype=b.dtype), b[:-1]])
    turns_off = b != xp.concatenate([a[1:], xp.full(1, -1, dtype=a.dtype)])
    change = xp.zeros(n + 1, dtype=xp.int8)
    change[a[turns_on]] = 1
    change[b[turns_off]] = -1
    mask = xp.cumsum(change[:n], dtype=xp.int8)
    mask *= places.ends > places.starts  # a token of no bytes holds none of a span's
    return mask


def kept_span_tokens(xp: Any, a: Any, b: Any, span_offsets: Any, offsets: Any, max_seq_len: int, side: str,
                     kept: Any) -> Any:
    """How many of each span's tokens [a, b) a sample keeps after truncation to max_seq_len (its first
    tokens, or with side "left" its last; rows not kept keep none). Closing pieces kept past the limit
    (keep_tail) hold no span, so they do not enter here."""
    lengths = offsets[1:] - offsets[:-1]
    cut = xp.maximum(lengths - max_seq_len, 0)
    lo = offsets[:-1] + (cut if side == "left" else 0)
    hi = offsets[1:] - (0 if side == "left" else cut)
    row = row_of(xp, span_offsets, len(a))
    inside = xp.minimum(b, hi[row]) - xp.maximum(a, lo[row])
    return xp.maximum(inside, 0) * kept[row]


@dataclass
class Masked:
    ids: Any
    loss_mask: Any
    offsets: Any  # int64, rows kept + 1
    kept_rows: Any  # indices into the input rows
    no_trained_rows: Any  # rows dropped because nothing is left to train
    truncated_rows: Any  # rows cut to max_seq_len (among those kept)


def split_offsets(xp: Any, offsets: Any, window: int) -> Any:
    """Offsets of the windows of at most `window` tokens that each sample is cut into, in order.

    A window of one token teaches nothing (there is no next token to predict inside it), so where the last
    window of a sample would hold a single token (typically the closing EOS) its cut moves one token
    earlier: the tail keeps the token before it and the window before is one token shorter.
    """
    lengths = offsets[1:] - offsets[:-1]
    count = (lengths + window - 1) // window
    windows = offsets_from_lengths(xp, count)
    total = int(windows[-1])
    owner = row_of(xp, windows, total)
    index = xp.arange(total, dtype=xp.int64) - windows[:-1][owner]
    starts = offsets[:-1][owner] + index * window
    if window >= 2:
        lone = (count > 1) & (lengths % window == 1)
        starts -= (lone[owner] & (index == count[owner] - 1)).astype(xp.int64)
    return xp.concatenate([starts, offsets[-1:]])


def truncate_and_filter(xp: Any, ids: Any, loss_mask: Any, offsets: Any, max_seq_len: int, valid: Any,
                        keep_tail: Any = None, side: str = "right") -> Masked:
    """Keep the first max_seq_len tokens of each row (side "left": the last), then drop rows with no
    trained token.

    valid: bool per row; rows that are not valid (tokenizer mismatch) are neither kept nor counted here.
    keep_tail: per row, how many closing tokens survive truncation (a tokenizer's [SEP]); the row keeps its
    first max_seq_len - keep_tail tokens and then those, as HF tokenizers truncate.
    """
    lengths = offsets[1:] - offsets[:-1]
    if len(lengths) and int(lengths.max()) <= max_seq_len:
        trained = segment_sums(xp, loss_mask, offsets)
        if bool((valid & (trained > 0)).all()):  # nothing to cut and nothing to drop: keep every array as is
            none = xp.zeros(0, dtype=xp.int64)
            return Masked(ids, loss_mask, offsets, xp.arange(len(lengths), dtype=xp.int64), none, none)
    rows = row_of(xp, offsets, len(ids))
    position = xp.arange(len(ids), dtype=xp.int64) - offsets[rows]
    tail = xp.zeros(len(lengths), dtype=xp.int64) if keep_tail is None else xp.minimum(keep_tail, max_seq_len)
    if side == "left":
        keep_token = position >= (lengths - max_seq_len)[rows]
    else:
        keep_token = (position < (max_seq_len - tail)[rows]) | (position >= (lengths - tail)[rows])
    trained = segment_sums(xp, loss_mask * keep_token, offsets)
    keep_row = valid & (trained > 0)
    keep_token &= keep_row[rows]
    new_lengths = xp.minimum(lengths, max_seq_len)[keep_row]
    return Masked(
        ids=ids[keep_token],
        loss_mask=loss_mask[keep_token],
        offsets=offsets_from_lengths(xp, new_lengths),
        kept_rows=xp.nonzero(keep_row)[0],
        no_trained_rows=xp.nonzero(valid & (trained == 0))[0],
        truncated_rows=xp.nonzero(keep_row & (lengths > max_seq_len))[0],
    )
