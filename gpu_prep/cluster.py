"""cluster: one run spread over a Dask cluster (`--cluster local:N`, or a scheduler's address).

The process that runs `gpu-prep run` (the driver) cuts the inputs into parts and is the only one that
writes. Workers read, format, filter, render, tokenize and mask; the driver accounts for their chunks and
writes them in input order, through the same code a single-process run uses. So the output is the
single-process output byte for byte, checkpoints and --resume work as they do there (a run stopped on a
cluster can be finished by either), and a worker that dies costs only its tasks being run again
elsewhere: tasks have no side effects.

1. scan: each part (whole lines of an uncompressed JSON Lines file, or a whole file) is read once,
   counting its rows and lines (later parts' line numbers and the mixing order need them) and, with
   deduplicate, giving the MD5 digest of every row that passes the length rules.
2. dedup shuffle: the digests are hash-partitioned into buckets. Each bucket finds every digest's first
   position in the row stream (input order, or the datasets' mixed order) and, for each range of the
   stream, the digests of its rows that occurred before the range starts.
3. ranges: the stream is cut into ranges (a part each, or slices of the mixed order). A worker runs its
   range through the single-process stages with a Deduplicator that starts out knowing those digests, so
   it drops exactly the rows a single process drops.

The decisions a run makes on its first rows (whether Jinja-free rendering is trusted, which tokenizer
engine) are made once, by the driver, on the rows a single process makes them on, and handed to every
worker.
"""

from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

from gpu_prep.backend import Backend, gpu_missing_reason, select_backend
from gpu_prep.config import PipelineConfig
from gpu_prep.errors import ConfigError, Interrupted
from gpu_prep.filter import Deduplicator
from gpu_prep.mix import Dataset, dataset_order, with_tokenizer
from gpu_prep.overlap import Stopwatch
from gpu_prep.read import InputFile, Part, count_lines, part_rows, read_chunks, read_part, split_file

DASK_EXTRA = 'pip install "gpu-prep[dask]"'
PART_BYTES = 64 << 20  # a JSON Lines file is cut into parts of about this size
DIGEST = 16  # bytes of an MD5 digest


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
class Scan:
    rows: int
    lines: int
    device: str  # the worker's backend
    buckets: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (rows in part, digests) each


# ---------------------------------------------------------------- the workers' side


@dataclass
class _Env:
    """A worker's tokenizer, backend and rendering context for one run (built once per process)."""

    config: PipelineConfig
    tok: Any
    backend: Backend
    ctx: Any
    sources: dict[int, Any]
    dataset_of: dict[int, Dataset]  # by file index
    columnar: Any


_ENV: dict[str, _Env] = {}


def _env(job: Job) -> _Env:
    from gpu_prep.pipeline import columnar_reader, dataset_handlers, dataset_sources, render_context
    from gpu_prep.plugins import load_plugins
    from gpu_prep.tokenize import load_tokenizer

    env = _ENV.get(job.key)
    if env is not None:
        return env
    _ENV.clear()
    if job.threads is not None:  # read by HF tokenizers' thread pool when it starts
        os.environ.setdefault("RAYON_NUM_THREADS", str(job.threads))
    load_plugins(list(job.plugins))
    config = job.config
    tok = load_tokenizer(job.tokenizer)
    tok.prepare_engines(config.tokenizer.engine)
    backend = select_backend(job.device)  # a dask-cuda worker's GPU memory is set up by dask-cuda
    datasets, sources = [], {}
    if job.dataset_files is not None:
        datasets = [Dataset(spec.name, [job.files[i] for i in own], dataset_handlers(spec))
                    for spec, own in zip(config.datasets or [], job.dataset_files)]
        with_tokenizer(datasets, tok)
        sources = dataset_sources(config, datasets)
    env = _Env(config, tok, backend, render_context(config, tok), sources,
               {f.index: d for d in datasets for f in d.files}, columnar_reader(config, backend))
    _ENV[job.key] = env
    return env


def _part_rows(env: _Env, job: Job, p: int, first_line: int, data: bytes | None = None
               ) -> Iterator[tuple[int, int, Any, Any, int]]:
    """(file index, line, record, error, bytes) of part p's rows, its dataset's handlers applied."""
    part = job.parts[p]
    dataset = env.dataset_of.get(part.file.index)
    cap = env.config.input.max_row_bytes
    for line, record, error, nbytes in part_rows(part, env.columnar, cap, first_line, data):
        if dataset is not None and error is None and record is not None:
            record, error = dataset.handle(record)
        yield part.file.index, line, record, error, nbytes


def scan(job: Job, p: int, buckets: int) -> Scan:
    """Part p's rows and lines, and (with deduplicate) the digest of each row that passes the length rules,
    hash-partitioned into `buckets`."""
    from gpu_prep.pipeline import _filter, _format

    env = _env(job)
    part = job.parts[p]
    data = read_part(part) if part.end is not None else None  # read once: its lines counted, its rows parsed
    lines = count_lines(data) if data is not None else 0
    first_line = 1 if part.start == 0 else 2  # numbers do not matter here, but only line 1 may carry a BOM
    if not env.config.preprocessing.deduplicate:  # rows counted (a handler's drop is a row too)
        rows = part_rows(part, env.columnar, env.config.input.max_row_bytes, first_line, data)
        return Scan(sum(1 for _ in rows), lines, env.backend.name)
    rows = _part_rows(env, job, p, first_line, data)
    recorder = _Recorder()
    where, at = [], 0
    for chunk in read_chunks([], job.chunk_rows, rows=rows):
        formatted = _format(chunk, env.config, [], env.sources)
        reasons = _filter(env.backend, formatted, env.config, recorder)
        where += [at + i for i, r in zip(formatted.index, reasons) if r is None]
        at += len(chunk)
    digests = np.frombuffer(b"".join(recorder.take_added()), np.uint8).reshape(-1, DIGEST)
    where = np.asarray(where, dtype=np.int64)
    bucket = digests[:, 0] % buckets
    return Scan(at, lines, env.backend.name, [(where[bucket == b], digests[bucket == b]) for b in range(buckets)])


class _Recorder(Deduplicator):
    """Keeps every row, remembering each digest it is asked about (the scan's dedup)."""

    def first_seen(self, digests: list[bytes]) -> np.ndarray:
        self.added.extend(digests)
        return np.ones(len(digests), dtype=bool)


def scan_counts(scanned: Scan) -> tuple[int, int, str]:
    return scanned.rows, scanned.lines, scanned.device


def bucket_of(scanned: Scan, b: int) -> tuple[np.ndarray, np.ndarray]:
    return scanned.buckets[b]


@dataclass(frozen=True)
class Positions:
    """Where each part's rows stand in the row stream."""

    stream_of: list[int]  # each part's stream
    offset: list[int]  # each part's first row within its stream
    lengths: list[int]  # rows of each stream
    occurrences: list[np.ndarray] | None  # mixed: the positions that take a row from each stream, in order
    limit: int  # positions at and past this are not read (max_items, or the end of the mixed order)
    starts: np.ndarray  # each range's first position


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


def _stream_rows(env: _Env, job: Job, plan: Plan, s: int, row: int) -> Iterator[tuple[int, int, Any, Any, int]]:
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
            yield from islice(_part_rows(env, job, p, plan.first_line[p]), row, None)
            row = 0


def range_rows(env: _Env, job: Job, plan: Plan, rng: Range) -> Iterator[tuple[int, int, Any, Any, int]]:
    if rng.order is None:
        yield from islice(_stream_rows(env, job, plan, 0, rng.rows_at[0]), rng.stop - rng.start)
        return
    streams: dict[int, Iterator] = {}
    for s in rng.order.tolist():
        if s not in streams:
            streams[s] = _stream_rows(env, job, plan, s, rng.rows_at[s])
        yield next(streams[s])


def process_range(job: Job, plan: Plan, rng: Range, *seen: np.ndarray) -> tuple[list[Any], dict[str, float]]:
    """A range through every stage but accounting and writing: its chunks as Done (light enough to send
    back), and the seconds each stage took."""
    from gpu_prep.pipeline import mask_chunk, prepare_and_tokenize

    env = _env(job)
    clock = Stopwatch()
    dedup = None
    if env.config.preprocessing.deduplicate:
        dedup = Deduplicator({bytes(d) for block in seen for d in block})
    decided = dict(plan.decided)
    chunks = read_chunks([], job.chunk_rows, rows=range_rows(env, job, plan, rng))
    done = [_lighten(mask_chunk(env.backend, env.tok, env.config, clock, item), env.backend)
            for item in prepare_and_tokenize(chunks, env.config, env.ctx, env.backend, env.tok, dedup, clock,
                                             decided, env.sources, job.threads)]
    return done, dict(clock.seconds)


@dataclass(frozen=True)
class _Kept:
    """What accounting and writing read of a rendered row."""

    left_out: tuple[str, ...]
    notes: tuple[str, ...]
    span_roles: list[str]


def _lighten(done: Any, backend: Backend) -> Any:
    """A chunk as the driver needs it: host arrays, rendered rows without their text, and no input record
    of a row that is written (a dropped row's record goes to the examples and the rejects file)."""
    from gpu_prep.mask import Masked

    if done.masked is not None:
        masked, valid, over, by_role = done.masked
        masked = Masked(**{k: backend.to_host(v) for k, v in vars(masked).items()})
        done.masked = (masked, valid, over, by_role)
        for r in masked.kept_rows.tolist():
            done.chunk.records[done.rows.index[r]] = None
    done.rows.payload = [_Kept(row.left_out, row.notes, row.span_roles) for row in done.rows.payload]
    return done


# ---------------------------------------------------------------- the driver's side


@contextmanager
def connect(spec: str, gpu: bool, config: PipelineConfig) -> Iterator[Any]:
    """A Dask client: on a local cluster of N worker processes ("local:N"; with the GPU backend, dask-cuda
    workers, one per GPU), or on the scheduler at an address ("tcp://host:port")."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise ConfigError(f"--cluster needs Dask: {DASK_EXTRA}") from None
    if "://" in spec:
        with Client(spec) as client:
            yield client
        return
    name, _, count = spec.partition(":")
    if name != "local" or (count and not (count.isdigit() and int(count) > 0)):
        raise ConfigError(f"--cluster {spec!r}: give local, local:N (N workers) or a scheduler's address "
                          "such as tcp://host:8786")
    n = int(count) if count else None
    if gpu:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ConfigError('--cluster with the GPU backend needs dask-cuda: pip install "gpu-prep[gpu,dask]"') from None
        cluster = LocalCUDACluster(n_workers=n, threads_per_worker=1, rmm_pool_size=config.gpu.rmm_pool_size,
                                   enable_cudf_spill=config.gpu.spill)
    else:
        cluster = LocalCluster(n_workers=n or os.cpu_count() or 1, threads_per_worker=1, processes=True)
    with cluster, Client(cluster) as client:
        yield client


def _positions_and_ranges(job: Job, rows: list[int], config: PipelineConfig, rows_done: int, target: int
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
    if not _mixed(config):  # the stream is the parts in order: a range each
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


def _cut(files: list[InputFile], datasets: list[Dataset] | None, config: PipelineConfig, part_bytes: int
         ) -> tuple[list[Part], list[list[int]]]:
    """The inputs' parts, and the parts of each row stream: one stream of every part in order, or with
    sampling ratios one per dataset."""
    parts = [part for f in files for part in split_file(f, part_bytes)]
    if datasets is None or not _mixed(config):
        return parts, [list(range(len(parts)))]
    of_dataset = {f.index: k for k, d in enumerate(datasets) for f in d.files}
    streams: list[list[int]] = [[] for _ in datasets]
    for k, part in enumerate(parts):
        streams[of_dataset[part.file.index]].append(k)
    return parts, streams


def _mixed(config: PipelineConfig) -> bool:
    """Whether the rows are drawn from the datasets by their sampling ratios (else taken in order)."""
    return bool(config.datasets) and config.sampling_ratios() is not None


def _first_lines(parts: list[Part], lines: list[int]) -> list[int]:
    """The number of each part's first line: 1, or one past the lines of its file's parts before it."""
    first, line, file = [], 1, None
    for part, n in zip(parts, lines):
        line = 1 if part.file.index != file else line
        first.append(line)
        line, file = line + n, part.file.index
    return first


def run_on_cluster(*args: Any) -> Iterator[Any]:
    """The run's chunks, processed on the cluster and yielded in input order for the driver to account for
    and write (the arguments are _drive's). A cluster that keeps losing workers stops the run resumably."""
    from concurrent.futures import CancelledError

    from distributed import KilledWorker

    try:
        yield from _drive(*args)
    except (KilledWorker, CancelledError) as exc:
        raise Interrupted(f"Dask gave up on a task whose workers kept dying ({type(exc).__name__}: {exc}); see "
                          "the workers' logs (memory?), then finish the run with --resume") from None


def _drive(spec: str, config: PipelineConfig, files: list[InputFile], datasets: list[Dataset] | None,
           tok: Any, ctx: Any, backend: Backend, dedup: Deduplicator | None, decided: dict[str, Any],
           sources: dict[int, Any], rows_done: int, options: Any, clock: Stopwatch,
           info: dict[str, Any]) -> Iterator[Any]:
    """`decided` gets the first rows' decisions; `info` what the manifest says of the cluster.
    options.device goes to the workers as asked (auto: each takes its GPU when it has one)."""
    from gpu_prep.pipeline import decide

    gpu = options.device != "cpu" and gpu_missing_reason() is None  # a local cluster of dask-cuda workers
    if options.device == "gpu" and not gpu and "://" not in spec:
        raise ConfigError(f"--device gpu: {gpu_missing_reason()}")
    with connect(spec, gpu, config) as client:
        workers = len(client.scheduler_info()["workers"]) or 1
        info.update({"scheduler": client.scheduler.address, "workers": workers, "dashboard": client.dashboard_link})
        if options.announce is not None:
            options.announce(client.dashboard_link)
        parts, streams = _cut(files, datasets, config, options.part_bytes or PART_BYTES)
        threads = options.workers or (max(1, (os.cpu_count() or 1) // workers) if spec.startswith("local") else None)
        job = Job(uuid.uuid4().hex, config, options.tokenizer, options.device, options.plugins, files,
                  [[f.index for f in d.files] for d in datasets] if datasets is not None else None,
                  parts, streams, options.chunk_rows, threads)
        job_f = client.scatter(job, broadcast=True)
        buckets = max(1, min(workers, 64)) if config.preprocessing.deduplicate else 0
        scans = client.map(scan, [job_f] * len(parts), range(len(parts)), [buckets] * len(parts), pure=False)
        counts = clock.time("cluster scan", client.gather, client.map(scan_counts, scans))
        rows = [n for n, _, _ in counts]
        first_line = _first_lines(parts, [lines for _, lines, _ in counts])
        info["device"] = counts[0][2]
        target = max(1, -(-sum(rows) // max(1, len(parts))))
        positions, ranges, rest = _positions_and_ranges(job, rows, config, rows_done, target)
        found = []  # the dedup shuffle, under way while the driver decides below
        if buckets:
            positions_f = client.scatter(positions, broadcast=True)
            for b in range(buckets):
                pieces = [client.submit(bucket_of, s, b, pure=False) for s in scans]
                found.append(client.submit(first_occurrences, positions_f, *pieces, pure=False))
        del scans
        # The first rows' decisions, on the rows and chunks a single process makes them on.
        env = _Env(config, tok, backend, ctx, sources, {f.index: d for d in datasets or [] for f in d.files}, None)
        chunks = read_chunks([], options.chunk_rows, rows=range_rows(env, job, Plan(rows, first_line, {}), rest))
        decide(chunks, config, ctx, backend, tok, Deduplicator(set(dedup.seen)) if dedup is not None else None,
               decided, sources, threads)
        plan_f = client.scatter(Plan(rows, first_line, dict(decided)), broadcast=True)
        info["ranges"], info["parts"] = len(ranges), len(parts)
        window: deque = deque()
        pending = iter(enumerate(ranges))

        def submit_next() -> None:
            for k, rng in islice(pending, 1):
                seen = [client.submit(seen_in, f, k, pure=False) for f in found]
                window.append(client.submit(process_range, job_f, plan_f, rng, *seen, pure=False))

        for _ in range(2 * workers + 1):
            submit_next()
        while window:
            done, seconds = window.popleft().result()
            submit_next()
            for stage, value in seconds.items():
                clock.seconds[f"workers: {stage}"] += value
            yield from done
