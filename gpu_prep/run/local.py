"""One process: the stages run over the run's chunks here, either one after another in this thread or
overlapping, each in a thread of its own; the committed output is the same either way."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.read.mix import config_rows
from gpu_prep.read.inputs import CHUNK_BYTES, RawChunk
from gpu_prep.read.rows import first_rows, read_chunks
from gpu_prep.run.context import Decisions, RunContext
from gpu_prep.run.overlap import Sink, Stopwatch, quick_handoffs
from gpu_prep.run.masking import mask_chunk
from gpu_prep.run.stages import Done
from gpu_prep.run.tokenize import Tokenizing, prepare_and_tokenize


def run_chunks(run: RunContext, chunk_rows: int, rows_done: int, per_file: list[int] | None = None) -> Iterator[RawChunk]:
    """The run's rows in chunks, in input order (or the datasets' mixed order), past the rows_done a
    resumed run has done already; per_file: only the first rows of each input (validate's sample)."""
    config, bound = run.config, run.config.input.max_row_bytes
    rows = config_rows(config, run.datasets, run.columnar)
    if rows is None and per_file is not None:
        rows = first_rows(run.files, per_file, run.columnar, bound)
    return read_chunks(run.files, chunk_rows, config.preprocessing.max_items, CHUNK_BYTES * run.backend.chunk_scale,
                       columnar=run.columnar, skip=rows_done, max_row_bytes=bound, rows=rows)


def run_here(run: RunContext, chunks: Iterator[RawChunk], dedup: Deduplicator | None, decisions: Decisions,
             clock: Stopwatch, commit: Callable[[Done, Stopwatch], None], overlap: bool = True) -> None:
    """Every chunk through every stage and committed, in order. With overlap, three stages run at once, each
    in its own thread: reading, formatting, filtering and rendering a chunk ahead; tokenizing in this thread
    (the engines release the GIL); masking and committing a chunk behind."""
    stages = prepare_and_tokenize(chunks, run, dedup, clock, decisions, overlap)
    if not overlap:
        for item in stages:
            commit(mask_chunk(run, clock, item), clock)
        return
    with quick_handoffs(), Sink(lambda item: commit(mask_chunk(run, clock, item), clock)) as sink:
        for item in stages:
            sink.put(item)


def decide(run: RunContext, chunks: Iterator[RawChunk], dedup: Deduplicator | None, decisions: Decisions) -> None:
    """Take the decisions a run makes on its first rows (is Jinja-free rendering trusted, which tokenizer
    engine) on those rows, writing nothing: what a cluster's driver hands its workers."""
    if not decisions.pending(run.render):  # taken before the run was stopped: the tokenizer takes the engine again
        Tokenizing(run, decisions)
        return
    for _ in prepare_and_tokenize(chunks, run, dedup, Stopwatch(), decisions):
        if not decisions.pending(run.render):
            return
