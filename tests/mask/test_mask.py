"""The array algorithms (written once against xp) checked against plain per-row Python references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_prep.mask.project import (mask_from_ranges, offset_places, offsets_from_lengths, project, row_of, segment_sums,
                           span_tokens, truncate_and_filter)
from gpu_prep.output.shards import shard_cuts

xp = np


@st.composite
def rows_with_spans(draw):
    """Rows of tokens (byte lengths >= 0) and sorted, disjoint trained byte spans inside each row."""
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        lengths = draw(st.lists(st.integers(0, 5), min_size=0, max_size=12))
        total = sum(lengths)
        cuts = sorted(draw(st.lists(st.integers(0, total), max_size=8)))
        spans = [(a, b) for a, b in zip(cuts[0::2], cuts[1::2]) if b > a]
        rows.append((lengths, spans))
    return rows


def reference_mask(rows) -> list[int]:
    mask = []
    for lengths, spans in rows:
        pos = 0
        for n in lengths:
            mask.append(int(n > 0 and any(s < pos + n and e > pos for s, e in spans)))
            pos += n
    return mask


def arrays(rows):
    positions = offsets_from_lengths(xp, np.array([n for lengths, _ in rows for n in lengths], dtype=np.int64))
    token_offsets = offsets_from_lengths(xp, np.array([len(l) for l, _ in rows], dtype=np.int64))
    spans = np.array([s for _, spans in rows for s in spans], dtype=np.int64).reshape(-1, 2)
    span_offsets = offsets_from_lengths(xp, np.array([len(s) for _, s in rows], dtype=np.int64))
    return positions, token_offsets, spans[:, 0].copy(), spans[:, 1].copy(), span_offsets


@settings(max_examples=300, deadline=None)
@given(rows_with_spans())
def test_projection_matches_any_byte_rule(rows) -> None:
    got = project(xp, *arrays(rows))
    assert got.dtype == np.int8
    assert got.tolist() == reference_mask(rows)


def test_token_touching_span_edge_is_not_trained() -> None:
    # Tokens [0,3) [3,5) [5,9); span [3,5) trains exactly the middle token, not its neighbours.
    rows = [([3, 2, 4], [(3, 5)])]
    assert project(xp, *arrays(rows)).tolist() == [0, 1, 0]


def test_token_straddling_span_start_is_trained() -> None:
    # A token that merges a header's "\n" with content that starts with "\n" is trained.
    rows = [([4, 3], [(3, 7)])]
    assert project(xp, *arrays(rows)).tolist() == [1, 1]


@st.composite
def rows_with_offsets(draw):
    """Rows of characters whose tokens report offsets as tokenizers do: in order, but with gaps (WordPiece
    drops spaces), several tokens on one character (byte fallback) and empty ones; spans as above."""
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        length = draw(st.integers(0, 20))
        edges = sorted(draw(st.lists(st.integers(0, length), max_size=24)))
        tokens = [(a, b) for a, b in zip(edges, edges[1:])]
        tokens = [t for t in tokens for _ in range(draw(st.integers(0, 2)))]  # dropped, once, or repeated
        cuts = sorted(draw(st.lists(st.integers(0, length), max_size=8)))
        spans = [(a, b) for a, b in zip(cuts[0::2], cuts[1::2]) if b > a]
        rows.append((length, tokens, spans))
    return rows


def offset_arrays(rows):
    flat = np.array([t for _, tokens, _ in rows for t in tokens], dtype=np.int64).reshape(-1, 2)
    per_row = np.array([len(tokens) for _, tokens, _ in rows], dtype=np.int64)
    lengths = np.array([length for length, _, _ in rows], dtype=np.int64)
    spans = np.array([s for _, _, spans in rows for s in spans], dtype=np.int64).reshape(-1, 2)
    span_offsets = offsets_from_lengths(xp, np.array([len(s) for _, _, s in rows], dtype=np.int64))
    # One piece per row.
    places, ordered = offset_places(xp, flat[:, 0].copy(), flat[:, 1].copy(), per_row, lengths,
                                    offsets_from_lengths(xp, np.ones(len(rows), dtype=np.int64)))
    return places, ordered, spans[:, 0].copy(), spans[:, 1].copy(), span_offsets


@settings(max_examples=300, deadline=None)
@given(rows_with_offsets())
def test_offsets_projection_matches_any_character_rule(rows) -> None:
    places, ordered, starts, ends, span_offsets = offset_arrays(rows)
    assert ordered.all()
    got = mask_from_ranges(xp, places, *span_tokens(xp, places, starts, ends, span_offsets))
    want = [int(b > a and any(s < b and e > a for s, e in spans)) for _, tokens, spans in rows for a, b in tokens]
    assert got.tolist() == want


def test_offsets_that_go_backwards_or_leave_their_row_are_flagged() -> None:
    rows = [(6, [(0, 2), (2, 4)], []), (6, [(3, 5), (0, 2)], []), (4, [(0, 2), (2, 5)], []), (3, [(1, 1), (0, 3)], [])]
    _, ordered, _, _, _ = offset_arrays(rows)
    assert ordered.tolist() == [True, False, False, False]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), min_size=2, max_size=10), max_size=8), st.integers(2, 6),
       st.integers(0, 1))
def test_truncation_keeps_closing_tokens(rows, max_len, tail) -> None:
    # Like HF's BERT truncation: the first max_len - tail tokens, then the row's last `tail` tokens.
    mask = np.ones(sum(len(r) for r in rows), dtype=np.int8)
    ids = np.arange(len(mask), dtype=np.int64)
    offsets = offsets_from_lengths(xp, np.array([len(r) for r in rows], dtype=np.int64))
    out = truncate_and_filter(xp, ids, mask, offsets, max_len, np.ones(len(rows), dtype=bool),
                              keep_tail=np.full(len(rows), tail, dtype=np.int64))
    expected = []
    for i, r in enumerate(rows):
        row_ids = list(range(int(offsets[i]), int(offsets[i + 1])))
        expected += row_ids if len(r) <= max_len else row_ids[:max_len - tail] + row_ids[len(r) - tail:]
    assert out.ids.tolist() == expected
    assert np.diff(out.offsets).tolist() == [min(len(r), max_len) for r in rows]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1), max_size=10), max_size=8), st.integers(1, 6))
def test_truncate_and_filter(rows, max_len) -> None:
    mask = np.array([b for r in rows for b in r], dtype=np.int8)
    ids = np.arange(len(mask), dtype=np.int64)
    offsets = offsets_from_lengths(xp, np.array([len(r) for r in rows], dtype=np.int64))
    valid = np.ones(len(rows), dtype=bool)
    if rows:
        valid[0] = False  # an invalid row is neither kept nor counted as untrained
    out = truncate_and_filter(xp, ids, mask, offsets, max_len, valid)

    kept, expected_ids, untrained = [], [], []
    for i, r in enumerate(rows):
        cut = r[:max_len]
        if not valid[i]:
            continue
        if sum(cut):
            kept.append(i)
            expected_ids.extend(int(offsets[i]) + k for k in range(len(cut)))
        else:
            untrained.append(i)
    assert out.kept_rows.tolist() == kept
    assert out.no_trained_rows.tolist() == untrained
    assert out.ids.tolist() == expected_ids
    assert np.diff(out.offsets).tolist() == [min(len(rows[i]), max_len) for i in kept]
    assert out.truncated_rows.tolist() == [i for i in kept if len(rows[i]) > max_len]


def test_row_of_and_segment_sums_with_empty_rows() -> None:
    offsets = np.array([0, 2, 2, 5], dtype=np.int64)
    assert row_of(xp, offsets, 5).tolist() == [0, 0, 2, 2, 2]
    assert segment_sums(xp, np.array([1, 2, 3, 4, 5]), offsets).tolist() == [3, 0, 12]


def greedy_shards(lengths: list[int], fill: int, cap: int) -> list[int]:
    cuts, count = [], 0
    for n in lengths:
        if fill + n > cap and (fill > 0 or count > 0):
            cuts.append(count)
            count, fill = 0, 0
        count += 1
        fill += n
    cuts.append(count)
    return cuts


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=40), st.integers(0, 40), st.integers(1, 40))
def test_shard_cuts_match_greedy(lengths, fill, cap) -> None:
    fill = min(fill, cap)
    got = shard_cuts(xp, np.array(lengths, dtype=np.int64), fill, cap)
    expected = greedy_shards(lengths, fill, cap)
    # A leading 0 means "the open shard takes nothing, start a new one": same as the greedy split.
    assert [c for c in got if c] == [c for c in expected if c]
    assert sum(got) == len(lengths)
    start = 0
    for k, count in enumerate(got):
        chunk = lengths[start:start + count]
        limit = cap - (fill if k == 0 else 0)
        assert count <= 1 or sum(chunk) <= limit  # never over the cap unless one sample is alone
        start += count
