"""The scan and the dedup shuffle: each part's rows counted and, with deduplicate, the digest of every row
that passes the length rules; then, bucket by bucket, which digests of each range occurred before it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gpu_prep.cluster.plan import Job, Positions
from gpu_prep.cluster.worker import part_rows_handled, worker_context
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.read.inputs import read_part
from gpu_prep.read.rows import count_lines, part_rows, read_chunks
from gpu_prep.run.prepare import filter_reasons, format_rows

DIGEST = 16  # bytes of an MD5 digest


@dataclass(frozen=True)
class Scan:
    rows: int
    lines: int
    device: str  # the worker's backend
    buckets: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (rows in part, digests) each


def scan(job: Job, p: int, buckets: int) -> Scan:
    """Part p's rows and lines, and (with deduplicate) the digest of each row that passes the length rules,
    hash-partitioned into `buckets`."""
    run = worker_context(job)
    part = job.parts[p]
    bytes_part = part.end is not None and not part.batches
    data = read_part(part) if bytes_part else None  # read once: its lines counted, its rows parsed
    lines = count_lines(data) if data is not None else 0
    first_line = 1 if part.start == 0 else 2  # numbers do not matter here, but only line 1 may carry a BOM
    if not run.config.preprocessing.deduplicate:  # rows counted (a handler's drop is a row too)
        rows = sum(1 for _ in part_rows(part, run.columnar, run.config.input.max_row_bytes, first_line, data))
        return Scan(rows, rows if part.batches else lines, run.backend.name)  # batches: rows are numbered
    recorder = _Recorder()
    where, at = [], 0
    for chunk in read_chunks([], job.chunk_rows, rows=part_rows_handled(run, job, p, first_line, data)):
        formatted = format_rows(chunk, run.config, run.sources, run.builder_tokenizer).rows
        reasons = filter_reasons(run, formatted, recorder)
        where += [at + i for i, r in zip(formatted.index, reasons) if r is None]
        at += len(chunk)
    digests = np.frombuffer(b"".join(recorder.take_added()), np.uint8).reshape(-1, DIGEST)
    where = np.asarray(where, dtype=np.int64)
    bucket = bucket_index(digests, buckets)
    return Scan(at, at if part.batches else lines, run.backend.name,
                [(where[bucket == b], digests[bucket == b]) for b in range(buckets)])


def bucket_index(digests: np.ndarray, buckets: int) -> np.ndarray:
    """The bucket of each digest (rows of DIGEST uint8): its first four bytes as a number, modulo buckets
    (up to dedup_buckets' 4096; one byte would reach 256 of them, and numpy refuses a modulo past its range)."""
    return np.ascontiguousarray(digests[:, :4]).view("<u4").ravel().astype(np.int64) % buckets


class _Recorder(Deduplicator):
    """Keeps every row, remembering each digest it is asked about (the scan's dedup)."""

    def first_seen(self, digests: list[bytes]) -> np.ndarray:
        self.added.extend(digests)
        return np.ones(len(digests), dtype=bool)


def scan_counts(scanned: Scan) -> tuple[int, int, str]:
    return scanned.rows, scanned.lines, scanned.device


def bucket_of(scanned: Scan, b: int) -> tuple[np.ndarray, np.ndarray]:
    return scanned.buckets[b]


def first_occurrences(positions: Positions, *pieces: tuple[np.ndarray, np.ndarray]) -> dict[int, np.ndarray]:
    """One bucket of the dedup shuffle (pieces: each part's, in order): for each range, the digests of its
    rows that first occurred at an earlier position than the range's start (the rows of the range that are
    duplicates of rows before it)."""
    pos_in, digests_in = [], []
    for p, (where, digests) in enumerate(pieces):
        rows = positions.offset[p] + where
        s = positions.stream_of[p]
        if positions.occurrences is None:
            pos, take = rows, np.arange(len(rows))
        else:  # a mixed stream's row r is taken at its occurrences r, r + n, r + 2n, ...
            occ, n = positions.occurrences[s], positions.lengths[s]
            times = np.maximum(0, (len(occ) - rows + n - 1) // n)
            take = np.repeat(np.arange(len(rows)), times)
            starts = np.cumsum(times) - times
            pos = occ[rows[take] + (np.arange(len(take)) - np.repeat(starts, times)) * n]
        keep = pos < positions.limit
        pos_in.append(pos[keep])
        digests_in.append(digests[take][keep])
    if not pos_in:
        return {}
    pos = np.concatenate(pos_in).astype(np.int64)
    keys = np.ascontiguousarray(np.concatenate(digests_in)).view(np.uint64).reshape(-1, 2)
    order = np.lexsort((pos, keys[:, 1], keys[:, 0]))
    pos, keys = pos[order], keys[order]
    new = np.ones(len(pos), dtype=bool)
    new[1:] = (keys[1:] != keys[:-1]).any(axis=1)
    first = pos[np.maximum.accumulate(np.where(new, np.arange(len(pos)), 0))]
    in_range = np.searchsorted(positions.starts, pos, side="right") - 1
    earlier = (~new) & (in_range >= 0)
    earlier[earlier] = first[earlier] < positions.starts[in_range[earlier]]
    r, k = in_range[earlier], keys[earlier]
    order = np.lexsort((k[:, 1], k[:, 0], r))  # by range, then digest: each range's digests once
    r, k = r[order], k[order]
    once = np.ones(len(r), dtype=bool)
    once[1:] = (r[1:] != r[:-1]) | (k[1:] != k[:-1]).any(axis=1)
    r, k = r[once], k[once]
    cuts = np.flatnonzero(r[1:] != r[:-1]) + 1
    return {int(group[0]): np.ascontiguousarray(found).view(np.uint8).reshape(-1, DIGEST)
            for group, found in zip(np.split(r, cuts), np.split(k, cuts)) if len(group)}


def seen_in(found: dict[int, np.ndarray], rng: int) -> np.ndarray:
    return found.get(rng, np.zeros((0, DIGEST), dtype=np.uint8))


