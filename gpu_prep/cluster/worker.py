"""A worker's side of a cluster run: its run context (built once per process and run), the rows of a
part or a range of the stream, and a range through the stages of run/ (run/stages.py lists them)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np

from gpu_prep.backend import Backend, select_backend
from gpu_prep.cluster.plan import Job, Plan, Range
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.mask.project import Masked
from gpu_prep.plugins import load_plugins
from gpu_prep.read.row import FileRow
from gpu_prep.read.rows import part_rows, read_chunks
from gpu_prep.run.context import Decisions, RunContext, build_context, datasets_of
from gpu_prep.run.overlap import Stopwatch
from gpu_prep.run.masking import mask_chunk
from gpu_prep.run.stages import Done, Rows
from gpu_prep.run.tokenize import prepare_and_tokenize
from gpu_prep.tokenization.tokenizer import load_tokenizer

_CONTEXTS: dict[str, RunContext] = {}


def worker_context(job: Job) -> RunContext:
    """This worker's run context for the job's run: its own tokenizer, backend and datasets, built once."""
    run = _CONTEXTS.get(job.key)
    if run is not None:
        return run
    _CONTEXTS.clear()
    if job.threads is not None:  # read by HF tokenizers' thread pool when it starts
        os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))
    load_plugins(list(job.plugins))
    tok = load_tokenizer(job.tokenizer, job.config.tokenizer.revision)
    tok.prepare_engines(job.config.tokenizer.engine)
    backend = select_backend(job.device)  # a dask-cuda worker's GPU memory is set up by dask-cuda
    run = build_context(job.config, tok, backend, job.files, datasets_of(job.config, job.files, job.dataset_files),
                        job.threads)
    _CONTEXTS[job.key] = run
    return run


def part_rows_handled(run: RunContext, job: Job, p: int, first_line: int, data: bytes | None = None
                      ) -> Iterator[FileRow]:
    """Part p's rows, its dataset's handlers applied."""
    part = job.parts[p]
    dataset = run.dataset_of.get(part.file.index)
    cap = run.config.input.max_row_bytes
    for row in part_rows(part, run.columnar, cap, first_line, data):
        yield FileRow(part.file.index, row if dataset is None else dataset.handled(row))


def _stream_rows(run: RunContext, job: Job, plan: Plan, s: int, row: int) -> Iterator[FileRow]:
    """Stream s's rows from its row `row` on; a mixed stream starts again from its first row when it runs
    out, as the single-process mixing does."""
    parts = job.streams[s]
    total = sum(plan.rows[p] for p in parts)
    row %= max(1, total)
    while total:
        for p in parts:
            if row >= plan.rows[p]:
                row -= plan.rows[p]
                continue
            yield from islice(part_rows_handled(run, job, p, plan.first_line[p]), row, None)
            row = 0


def range_rows(run: RunContext, job: Job, plan: Plan, rng: Range) -> Iterator[FileRow]:
    if rng.order is None:
        yield from islice(_stream_rows(run, job, plan, 0, rng.rows_at[0]), rng.stop - rng.start)
        return
    streams: dict[int, Iterator] = {}
    for s in rng.order.tolist():
        if s not in streams:
            streams[s] = _stream_rows(run, job, plan, s, rng.rows_at[s])
        yield next(streams[s])


def process_range(job: Job, plan: Plan, rng: Range, *seen: np.ndarray) -> tuple[list[Done], dict[str, float]]:
    """A range through every stage but accounting and writing: its chunks as Done (light enough to send
    back), and the seconds each stage took. seen: the digests of the range's rows that occurred before it."""
    run = worker_context(job)
    clock = Stopwatch()
    dedup = None
    if run.config.preprocessing.deduplicate:
        dedup = Deduplicator(np.concatenate(seen) if seen else ())
    chunks = read_chunks([], job.chunk_rows, rows=range_rows(run, job, plan, rng))
    stages = prepare_and_tokenize(chunks, run, dedup, clock, Decisions.from_state(plan.decided))
    # With fuzzy_dedup the driver may still drop a row it is sent (near_duplicate): its record goes with it.
    keep_records = run.config.preprocessing.fuzzy_dedup is not None
    return [lighten(mask_chunk(run, clock, item), run.backend, keep_records) for item in stages], dict(clock.seconds)


@dataclass(frozen=True)
class _Kept:
    """What accounting and writing read of a rendered row."""

    left_out: tuple[str, ...]
    notes: tuple[str, ...]
    span_roles: list[str]
    unmarked: tuple[str, ...]
    trains_anything: bool
    labelled: bool


def lighten(done: Done, backend: Backend, keep_records: bool = False) -> Done:
    """A chunk as the driver needs it: host arrays, rendered rows without their text, and no input record
    of a row that is written (a dropped row's record goes to the examples and the rejects file), unless
    keep_records."""
    prepared, mask = done.prepared, done.mask
    records = list(prepared.chunk.records)
    if mask is not None:
        masked = Masked(**{k: backend.to_host(v) for k, v in vars(mask.masked).items()})
        mask = dataclasses.replace(mask, masked=masked)
        for r in [] if keep_records else masked.kept_rows.tolist():
            records[prepared.rows.index[r]] = None
    rows = Rows(prepared.rows.index, prepared.rows.domain,
                [_Kept(row.left_out, row.notes, row.span_roles, row.unmarked, row.trains_anything, row.labelled)
                 for row in prepared.rows.payload],
                prepared.rows.split)
    chunk = dataclasses.replace(prepared.chunk, records=records)
    return Done(dataclasses.replace(prepared, chunk=chunk, rows=rows), mask, done.engine_check)
