"""Commit: each chunk, in input order, accounted for and written; the only place either happens.

Whatever ran the stages (one thread, overlapping threads, a cluster's workers), the chunks come here in
input order, so the shards, the counts, the rejects file and the checkpoints are the same however they ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpu_prep.tokenization.checks import add_checks
from gpu_prep.errors import Drop, Dropped, InputError
from gpu_prep.filter.fuzzy import NO_ROW, NearIndex
from gpu_prep.output.writer import DatasetWriter
from gpu_prep.ragged import offsets_from_lengths, reorder, row_of
from gpu_prep.run.accounting import PIECES, Accounting
from gpu_prep.run.checkpoint import Checkpointer
from gpu_prep.run.context import Decisions, RunContext
from gpu_prep.run.overlap import Stopwatch
from gpu_prep.read.row import DroppedRow
from gpu_prep.run.stages import Done, MaskResult, Prepared, row_keys


class Committer:
    """Accounts for and writes chunks in the order given, checkpointing as it goes."""

    def __init__(self, run: RunContext, acct: Accounting, writer: DatasetWriter, checkpoints: Checkpointer,
                 decisions: Decisions, progress: Callable[[int, int, int | None, int], None] | None = None,
                 near: NearIndex | None = None) -> None:
        """near: preprocessing.fuzzy_dedup's index of the rows written so far (None: off)."""
        self.run, self.acct, self.writer, self.checkpoints = run, acct, writer, checkpoints
        self.decisions, self.progress, self.near = decisions, progress, near
        self.rows, self.read_bytes, self.shown_bytes = checkpoints.rows_done, 0, 0  # a resumed run counts on
        self.bytes_before = np.cumsum([0] + [f.weight for f in run.files]).tolist()  # by file index

    @property
    def total_bytes(self) -> int:
        """What the run reads in all: its files, or what a mix's weights make it read (datasets drawn again
        count again; their passes are known once the mix has counted their rows)."""
        if self.run.datasets is None:
            return self.bytes_before[-1]
        return round(sum(f.weight * d.passes for d in self.run.datasets for f in d.files))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps besides the rows done and the dedup log."""
        return {"accounting": self.acct.state(), "writer": self.writer.state(), **self.decisions.state()}

    def __call__(self, done: Done, clock: Stopwatch) -> None:
        prepared = done.prepared
        self.account_and_write(prepared, done.mask, clock)
        if done.engine_check is not None:
            self.decisions.engine_check = add_checks(self.decisions.engine_check, done.engine_check)
        near = self.near.take_added() if self.near is not None else []
        if self.checkpoints.chunk_done(len(prepared.chunk), prepared.digests, self.state, near):
            self.writer.remove_obsolete()
        if self.progress is not None:
            self.rows += len(prepared.chunk)
            total = self.total_bytes
            self.progress(self.rows, self.acct.tokens, self._bytes_read(prepared.chunk, total), total)

    def _bytes_read(self, chunk: Any, total: int) -> int | None:
        """How far through the input the run is, in bytes: those of the rows read (their text), or of the
        files before the current one, whichever says more (None: the inputs' sizes are not known)."""
        self.read_bytes += chunk.size + chunk.skipped
        if not total or not len(chunk):
            return None
        # A mix's chunks draw on all its files at once: the files before the current one say nothing there.
        before = self.bytes_before[chunk.file_index[-1]] if self.run.datasets is None else 0
        self.shown_bytes = min(total, max(self.shown_bytes, self.read_bytes, before))  # never backwards
        return self.shown_bytes

    def account_and_write(self, prepared: Prepared, mask: MaskResult | None, clock: Stopwatch) -> None:
        acct, chunk = self.acct, prepared.chunk
        acct.read(chunk.file_index)
        acct.schemas.update(prepared.schemas)
        acct.notes.update(prepared.notes)
        for row in prepared.rows.payload:
            acct.left_out.update(row.left_out)
            acct.notes.update(row.notes)
            acct.notes.update(f"unmarked_role:{role}" for role in row.unmarked)
        drops = list(prepared.drops)
        if mask is not None:
            clock.time("write", self.write, prepared, mask, drops)
        # In row order, whichever stage dropped them: the rejects file and the examples do not depend on chunks.
        for drop in sorted(drops, key=lambda d: d.row):
            acct.dropped(chunk.file_index[drop.row], chunk.line[drop.row], drop.why, drop.record)

    def write(self, prepared: Prepared, mask: MaskResult, drops: list[DroppedRow]) -> None:
        """Append the chunk's samples to their domains and count them; the rows dropped here go to drops."""
        backend, acct, rows, chunk = self.run.backend, self.acct, prepared.rows, prepared.chunk
        masked = mask.masked
        ids, loss_mask = backend.to_host(masked.ids), backend.to_host(masked.loss_mask)
        offsets, kept = backend.to_host(masked.offsets), backend.to_host(masked.kept_rows)
        truncated = set(backend.to_host(masked.truncated_rows).tolist())
        truncated.update(r for r, row in enumerate(rows.payload)  # turns dropped to fit (structured)
                         if any(note.startswith("structured_") for note in row.notes))

        def drop(r: int, why: Dropped) -> None:
            drops.append(DroppedRow(rows.index[r], why, chunk.records[rows.index[r]]))

        self.mask_drops(prepared, mask, drop)
        if mask.pair_counts is not None:
            acct.pairs.update(mask.pair_counts)
        per_row, labels, trained_by_span = mask.samples_per_row, mask.labels, mask.trained_by_span
        if self.near is not None and prepared.bands is not None and len(kept):
            near = self.near_duplicates(prepared, kept, drop)
            if near.any():
                gather, offsets = reorder(np, offsets, np.flatnonzero(np.repeat(~near, per_row)))
                ids, loss_mask = ids[gather], loss_mask[gather]
                labels = None if labels is None else labels[~near]
                spans = offsets_from_lengths(np, np.fromiter((len(row.span_roles) for row in rows.payload), np.int64,
                                                             len(rows.payload)))
                dropped = np.zeros(len(rows.payload), dtype=bool)
                dropped[kept[near]] = True
                trained_by_span = np.where(dropped[row_of(np, spans, len(trained_by_span))], 0, trained_by_span)
                kept = kept[~near]
        lengths = np.diff(offsets)
        lengths = lengths.reshape(-1, per_row).sum(axis=1) if per_row > 1 else lengths
        for k, r in enumerate(kept):
            file_index = chunk.file_index[rows.index[r]]
            acct.written(file_index, int(r) in truncated)
            acct.tokens_by_file[file_index] += int(lengths[k])
        names = list(self.run.config.output.splits or ())
        splits = [names[rows.split[r]] for r in kept] if rows.split is not None else [None] * len(kept)
        acct.rows_by_split.update(s for s in splits if s is not None)
        keys = [key for key in zip(splits, (rows.domain[r] for r in kept)) for _ in range(per_row)]
        append_by_domain(self.writer, keys, ids, loss_mask, offsets, labels)
        acct.tokens += len(ids)
        trained = int(loss_mask.sum())
        acct.trained_tokens += trained
        count_trained_by_role(acct, [role for row in rows.payload for role in row.span_roles], trained_by_span,
                              trained)

    def mask_drops(self, prepared: Prepared, mask: MaskResult, drop: Callable[[int, Dropped], None]) -> None:
        """Drop the rows the mask stage leaves unwritten (by their index in prepared.rows): tokens that do not
        place exactly, over max_seq_len (with truncation raise, such a row stops the run), nothing trained,
        and the preference pairs the cut to TRL's limits drops."""
        rules, rows, chunk = self.run.config.preprocessing, prepared.rows, prepared.chunk

        def too_long(r: int, why: Dropped) -> None:
            if rules.truncation == "raise":
                i = rows.index[r]
                raise InputError(f"{self.acct.files[chunk.file_index[i]].path}:{chunk.line[i]}: {why.detail} "
                                 "(preprocessing.truncation is 'raise')")
            drop(r, why)

        for r in np.nonzero(~mask.valid)[0]:
            drop(r, Dropped(Drop.TOKENIZER_MISMATCH, "the tokens do not cover the rendered text byte for byte, or their "
                            "offsets go backwards"))
        for r in np.nonzero(mask.valid & mask.over)[0]:
            too_long(r, Dropped(Drop.TOO_MANY_TOKENS, f"over max_seq_len {rules.max_seq_len} tokens"))
        for r in self.run.backend.to_host(mask.masked.no_trained_rows):
            drop(r, Dropped(Drop.NO_TRAINED_TOKENS, _no_trained(rows.payload[r], rules.max_seq_len)))
        for r, why in mask.drops:
            (too_long if why.reason == Drop.TOO_MANY_TOKENS else drop)(r, why)

    def near_duplicates(self, prepared: Prepared, kept: np.ndarray, drop: Callable[[int, Dropped], None]
                        ) -> np.ndarray:
        """Which of the rows about to be written (kept: indices into the chunk's rows, in order) share an LSH
        band with a row written before them (fuzzy.NearIndex); those are dropped, naming that row."""
        keys, signed = prepared.bands
        where = np.asarray(prepared.rows.index, np.int64)[kept]
        own = row_keys(prepared)[kept]
        named = self.near.decide(keys[where], signed[where], own)
        near = named != NO_ROW
        for r, place, itself in zip(kept[near], named[near].tolist(), own[near].tolist()):
            path = self.acct.files[place >> 32].path
            which = "an earlier occurrence of this row (the mix takes it more than once)" if place == itself \
                else f"{path}:{place & 0xFFFFFFFF}"
            drop(int(r), Dropped(Drop.NEAR_DUPLICATE, f"shares a MinHash band with {which}, which is kept"))
        return near


def count_trained_by_role(acct: Accounting, span_roles: list[str], trained_by_span: np.ndarray, trained: int) -> None:
    """Trained tokens by the role of the message they are in; whole trained pieces (instruction responses,
    text, segments, pre-tokenized labels) are counted under PIECES."""
    codes: dict[str, int] = {}
    span_codes = np.fromiter((codes.setdefault(role, len(codes)) for role in span_roles), np.int64, len(trained_by_span))
    per_role = np.bincount(span_codes, weights=trained_by_span, minlength=len(codes)).astype(np.int64)
    acct.trained_by_role.update({role: int(per_role[c]) for role, c in codes.items() if per_role[c]})
    if trained > int(per_role.sum()):
        acct.trained_by_role[PIECES] += trained - int(per_role.sum())


def append_by_domain(writer: DatasetWriter, domains: list[tuple[str | None, str]], ids: np.ndarray,
                     loss_mask: np.ndarray, offsets: np.ndarray, labels: np.ndarray | None = None) -> None:
    """Hand each domain its samples, in input order: one stable sort of the samples by domain and one
    gather of their tokens, whatever the number of domains. domains: each sample's (split or None, domain);
    labels: each sample's (input.type kto), else None."""
    names = list(dict.fromkeys(domains))  # in order of first appearance
    if len(names) == 1:
        writer.append(names[0][1], ids, loss_mask, offsets, split=names[0][0], labels=labels)
        return
    code = {name: k for k, name in enumerate(names)}
    codes = np.fromiter((code[d] for d in domains), np.int64, len(domains))
    order = np.argsort(codes, kind="stable")
    gather, sorted_offsets = reorder(np, offsets, order)
    ids, loss_mask = ids[gather], loss_mask[gather]
    labels = None if labels is None else labels[order]
    bounds = offsets_from_lengths(np, np.bincount(codes, minlength=len(names)))
    for k, name in enumerate(names):
        first, last = sorted_offsets[bounds[k]], sorted_offsets[bounds[k + 1]]
        writer.append(name[1], ids[first:last], loss_mask[first:last],
                      sorted_offsets[bounds[k]:bounds[k + 1] + 1] - first, split=name[0],
                      labels=None if labels is None else labels[bounds[k]:bounds[k + 1]])


def _no_trained(row: Any, max_seq_len: int) -> str:
    """Why a row has no trained token: nothing in it is trained (no message or field whose rule is train,
    or only empty ones), or what is trained lies past the cut."""
    if row.trains_anything:
        return f"no trained token within the max_seq_len {max_seq_len} tokens kept (the trained part was cut off)"
    if row.labelled:
        return "its labels are -100 at every token"
    return ("nothing in the row is trained: no message (or field) of a role whose mask rule is train; check mask "
            "and input.roles against the row's roles (gpu-prep validate names them)")
