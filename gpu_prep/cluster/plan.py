"""What a cluster run is cut into: the inputs' parts, the row streams, and the ranges of the stream the
workers process (with where each part's rows stand in the stream, for the dedup shuffle)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np

from gpu_prep.config import PipelineConfig
from gpu_prep.read.mix import Dataset, dataset_order
from gpu_prep.read.inputs import InputFile, Part
from gpu_prep.read.rows import split_file

PART_BYTES = 64 << 20  # a JSON Lines file is cut into parts of about this size


@dataclass(frozen=True)
class Job:
    """What every task of a run shares (sent to each worker once)."""

    key: str  # the run, for the workers' caches
    config: PipelineConfig
    tokenizer: str
    device: str
    plugins: tuple[str, ...]
    files: list[InputFile]
    dataset_files: list[list[int]] | None  # file indices of each dataset of the config
    parts: list[Part]
    streams: list[list[int]]  # the parts of each row stream, in order: one, or one per dataset when mixed
    chunk_rows: int
    threads: int | None  # tokenizer threads per worker


@dataclass(frozen=True)
class Plan:
    """What the scan found, and the decisions made on the run's first rows."""

    rows: list[int]  # rows of each part
    first_line: list[int]  # line number of each part's first line
    decided: dict[str, Any]


@dataclass(frozen=True)
class Range:
    """Stream positions [start, stop): which stream each position takes its next row from (None: stream
    0 only), and the row each stream is at when the range starts (counted without wrapping)."""

    start: int
    stop: int
    rows_at: list[int]
    order: np.ndarray | None = None


@dataclass(frozen=True)
class Positions:
    """Where each part's rows stand in the row stream."""

    stream_of: list[int]  # each part's stream
    offset: list[int]  # each part's first row within its stream
    lengths: list[int]  # rows of each stream
    occurrences: list[np.ndarray] | None  # mixed: the positions that take a row from each stream, in order
    limit: int  # positions at and past this are not read (max_items, or the end of the mixed order)
    starts: np.ndarray  # each range's first position


def positions_and_ranges(job: Job, rows: list[int], config: PipelineConfig, rows_done: int, target: int
                          ) -> tuple[Positions, list[Range], Range]:
    """Where each part's rows fall in the stream, the ranges the stream is cut into (from rows_done), and
    all of them as one range."""
    lengths = [sum(rows[p] for p in parts) for parts in job.streams]
    stream_of, offset = [0] * len(job.parts), [0] * len(job.parts)
    for s, parts in enumerate(job.streams):
        at = 0
        for p in parts:
            stream_of[p], offset[p], at = s, at, at + rows[p]
    cap = config.preprocessing.max_items
    ranges: list[Range] = []
    if not mixed(config):  # the stream is the parts in order: a range each
        limit = lengths[0] if cap is None else min(cap, lengths[0])
        for p in job.streams[0]:
            start, stop = max(offset[p], rows_done), min(offset[p] + rows[p], limit)
            if start < stop:
                ranges.append(Range(start, stop, [start]))
        occurrences = None
        rest = Range(rows_done, limit, [rows_done])
    else:
        process = config.dataprocessor
        draws = dataset_order(lengths, config.sampling_ratios(), process.seed, process.sampling_stopping_strategy)
        order = np.fromiter(islice(draws, cap), dtype=np.int16)
        limit = len(order)
        occurrences = [np.flatnonzero(order == s) for s in range(len(job.streams))]
        counts = np.zeros(len(job.streams), dtype=np.int64)
        step = max(1, target)
        for start in range(0, limit, step):
            stop = min(start + step, limit)
            if stop > rows_done:
                begin = max(start, rows_done)
                at = counts + np.bincount(order[start:begin], minlength=len(job.streams))
                ranges.append(Range(begin, stop, at.tolist(), order[begin:stop]))
            counts += np.bincount(order[start:stop], minlength=len(job.streams))
        rest = Range(rows_done, limit, ranges[0].rows_at if ranges else [0] * len(lengths), order[rows_done:])
    starts = np.array([r.start for r in ranges], dtype=np.int64)
    return Positions(stream_of, offset, lengths, occurrences, limit, starts), ranges, rest


def cut(files: list[InputFile], datasets: list[Dataset] | None, config: PipelineConfig, part_bytes: int
         ) -> tuple[list[Part], list[list[int]]]:
    """The inputs' parts, and the parts of each row stream: one stream of every part in order, or with
    sampling ratios one per dataset."""
    parts = [part for f in files for part in split_file(f, part_bytes)]
    if datasets is None or not mixed(config):
        return parts, [list(range(len(parts)))]
    of_dataset = {f.index: k for k, d in enumerate(datasets) for f in d.files}
    streams: list[list[int]] = [[] for _ in datasets]
    for k, part in enumerate(parts):
        streams[of_dataset[part.file.index]].append(k)
    return parts, streams


def mixed(config: PipelineConfig) -> bool:
    """Whether the rows are drawn from the datasets by their sampling ratios (else taken in order)."""
    return bool(config.datasets) and config.sampling_ratios() is not None


def first_lines(parts: list[Part], lines: list[int]) -> list[int]:
    """The number of each part's first line: 1, or one past the lines of its file's parts before it."""
    first, line, file = [], 1, None
    for part, n in zip(parts, lines):
        line = 1 if part.file.index != file else line
        first.append(line)
        line, file = line + n, part.file.index
    return first


