"""The driver's side of a cluster run: connect to Dask, plan, scan, shuffle, decide, and hand the workers'
chunks back in input order (the pipeline commits them)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

from gpu_prep.backend import gpu_missing_reason
from gpu_prep.cluster.plan import PART_BYTES, Job, Plan, cut, first_lines, mixed, positions_and_ranges
from gpu_prep.cluster.shuffle import bucket_of, first_occurrences, scan, scan_counts, seen_in
from gpu_prep.cluster.worker import process_range, range_rows
from gpu_prep.config import PipelineConfig
from gpu_prep.cores import usable_cores
from gpu_prep.errors import ConfigError, Interrupted
from gpu_prep.filter.dedup import Deduplicator
from gpu_prep.read.mix import set_passes
from gpu_prep.read.rows import read_chunks
from gpu_prep.run.context import Decisions, Options, RunContext
from gpu_prep.run.local import decide
from gpu_prep.run.overlap import Stopwatch, deaf_to_ctrl_c
from gpu_prep.run.stages import Done

DASK_EXTRA = 'pip install "gpu-prep[dask]"'


def check_cluster(spec: str, device: str) -> bool:
    """Refuse a --cluster that cannot run (no Dask, a spec of no known form, a local GPU cluster without
    dask-cuda or without a GPU) before anything is written; whether a local cluster's workers take GPUs
    (auto: where this machine has one)."""
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        raise ConfigError(f"--cluster needs Dask: {DASK_EXTRA}") from None
    gpu = device != "cpu" and gpu_missing_reason() is None
    if "://" in spec:
        _check_address(spec)
        return gpu
    _local_workers(spec)
    if device == "gpu" and not gpu:
        raise ConfigError(f"--device gpu: {gpu_missing_reason()}")
    if gpu:
        try:
            import dask_cuda  # noqa: F401
        except ImportError:
            raise ConfigError('--cluster with the GPU backend needs dask-cuda: pip install "gpu-prep[gpu,dask]"') from None
    return gpu


def _local_workers(spec: str) -> int | None:
    """The workers of a local cluster, "local" (None: one a core, or a GPU) or "local:N"; any other spec is
    refused."""
    name, _, count = spec.partition(":")
    if name != "local" or (count and not (count.isdigit() and int(count) > 0)):
        raise ConfigError(f"--cluster {spec!r}: give local, local:N (N workers) or a scheduler's address "
                          "such as tcp://host:8786")
    return int(count) if count else None


def _check_address(spec: str) -> None:
    """Refuse an address of no scheme Dask knows, or without the port its scheme needs (found only once
    connecting, inside the run)."""
    from distributed.comm.addressing import parse_address
    from distributed.comm.registry import get_backend

    try:
        scheme, location = parse_address(spec)
        try:
            get_backend(scheme).get_address_host_port(location)
        except NotImplementedError:  # ucx, inproc: no host and port to check
            pass
    except ValueError as exc:
        raise ConfigError(f"--cluster {spec!r} is not a scheduler's address ({exc}); give one such as "
                          "tcp://host:8786") from None


def _root_cause(exc: BaseException) -> str:
    """What distributed says of a start that failed, at its root: "Nanny failed to start." wraps why, and a
    timeout wraps an empty TimeoutError."""
    while exc.__cause__ is not None and str(exc.__cause__).strip():
        exc = exc.__cause__
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


@contextmanager
def connect(spec: str, gpu: bool, config: PipelineConfig) -> Iterator[Any]:
    """A Dask client: on a local cluster of N worker processes ("local:N"; with the GPU backend, dask-cuda
    workers, one per GPU), or on the scheduler at an address ("tcp://host:port")."""
    from dask.distributed import Client, LocalCluster

    if "://" in spec:
        try:
            client = Client(spec)
        except Exception as exc:
            raise Interrupted(f"no Dask scheduler answered at {spec} ({_root_cause(exc)}); start one there (dask "
                              "scheduler) or fix --cluster, then start the run again with --resume") from None
        with client:
            yield client
        return
    n = _local_workers(spec)
    if gpu:
        from dask_cuda import LocalCUDACluster

        start = functools.partial(LocalCUDACluster, n_workers=n, threads_per_worker=1,
                                  rmm_pool_size=config.gpu.rmm_pool_size, enable_cudf_spill=config.gpu.spill)
    else:
        # Their logs silenced below critical: a task that stops on bad input is reported here, once, by name;
        # the worker would print it first as a traceback.
        start = functools.partial(LocalCluster, n_workers=n or usable_cores(), threads_per_worker=1,
                                  processes=True, silence_logs=logging.CRITICAL)
    # SIGINT ignored while the local workers' processes start, which keep ignoring it (a Python started with
    # SIGINT ignored leaves it so, and so does asyncio): on Ctrl-C this process stops the run and shuts the
    # cluster down, printing the command that resumes it, instead of every worker printing its own traceback.
    with deaf_to_ctrl_c():
        try:
            cluster = start()
        except Exception as exc:  # its own traceback, 90 lines, would only repeat this
            raise Interrupted(f"the local Dask cluster did not start ({_root_cause(exc)}); fix that (where a worker "
                              "died as it started, memory is the usual cause: --cluster local:N starts fewer), "
                              "then start the run again with --resume") from None
    with cluster, Client(cluster) as client:
        try:
            yield client
        except BaseException:
            _quiet_teardown(client)
            raise


def _quiet_distributed() -> None:
    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def _quiet_teardown(client: Any) -> None:
    """A run that stops (Ctrl-C, an error) closes its local cluster with tasks in flight: workers cut off
    mid-transfer log tracebacks of reset connections that say nothing of the run. This process reports
    the stop; the workers and the scheduler here are silenced first."""
    _quiet_distributed()
    try:
        client.run(_quiet_distributed, on_error="ignore")
    except Exception:  # a cluster already going down: nothing left to silence
        pass


# A row of JSON Lines is taken to be at least this many bytes, and a bucket's shuffle to need this many times
# its digests' bytes (positions and the sort besides), to keep each bucket within dedup_memory_mb.
ROW_BYTES_AT_LEAST, SHUFFLE_OVERHEAD = 64, 4


def dedup_buckets(input_bytes: int, workers: int, memory_mb: float | None) -> int:
    """How many buckets the dedup shuffle hashes digests into: one per worker (64 at most), or more where the
    input's digests would pass preprocessing.dedup_memory_mb in one bucket (4096 at most)."""
    buckets = max(1, min(workers, 64))
    if memory_mb is not None:
        need = input_bytes / ROW_BYTES_AT_LEAST * 16 * SHUFFLE_OVERHEAD / (memory_mb * (1 << 20))
        buckets = max(buckets, min(4096, math.ceil(need)))
    return buckets


def _value(value: Any) -> Any:
    return value


def held_value(client: Any, value: Any) -> Any:
    """A future of value that survives the workers holding it: a task that returns it, which the scheduler
    recomputes on a worker that is alive when one dies (scattered data, even broadcast, is lost with the
    last worker the scheduler counts as holding it, and every task that needs it is cancelled)."""
    return client.submit(_value, value, pure=False)


def run_on_cluster(run: RunContext, dedup: Deduplicator | None, decisions: Decisions, rows_done: int,
                   options: Options, clock: Stopwatch, info: dict[str, Any]) -> Iterator[Done]:
    """The run's chunks, processed on the cluster (options.cluster) and yielded in input order for the
    driver to commit. decisions gets the first rows' decisions; info what the manifest says of the cluster.
    A cluster that keeps losing workers stops the run resumably."""
    from concurrent.futures import CancelledError

    from distributed import KilledWorker

    try:
        yield from _drive(run, dedup, decisions, rows_done, options, clock, info)
    except (KilledWorker, CancelledError) as exc:
        raise Interrupted(f"Dask gave up on a task whose workers kept dying ({type(exc).__name__}: {exc}); see "
                          "the workers' logs (memory?), then finish the run with --resume") from None


def _drive(run: RunContext, dedup: Deduplicator | None, decisions: Decisions, rows_done: int, options: Options,
           clock: Stopwatch, info: dict[str, Any]) -> Iterator[Done]:
    """The device asked for goes to the workers (auto: each takes its GPU when it has one)."""
    spec, device, config = options.cluster, options.device_for(run.config), run.config
    gpu = check_cluster(spec, device)  # a local cluster of dask-cuda workers
    with connect(spec, gpu, config) as client:
        workers = len(client.scheduler_info()["workers"]) or 1
        info.update({"scheduler": client.scheduler.address, "workers": workers, "dashboard": client.dashboard_link})
        if options.announce is not None:
            options.announce(client.dashboard_link)
        parts, streams = cut(run.files, run.datasets, config, options.part_bytes or PART_BYTES)
        threads = options.workers or (max(1, usable_cores() // workers) if spec.startswith("local") else None)
        job = Job(uuid.uuid4().hex, config, options.tokenizer_for(config), device, options.plugins, run.files,
                  [[f.index for f in d.files] for d in run.datasets] if run.datasets is not None else None,
                  parts, streams, options.chunk_rows, threads)
        job_f = held_value(client, job)
        buckets = dedup_buckets(sum(f.size_bytes for f in run.files), workers, config.preprocessing.dedup_memory_mb) \
            if config.preprocessing.deduplicate else 0
        scans = client.map(scan, [job_f] * len(parts), range(len(parts)), [buckets] * len(parts), pure=False)
        counts = clock.time("cluster scan", client.gather, client.map(scan_counts, scans))
        rows = [n for n, _, _ in counts]
        first_line = first_lines(parts, [lines for _, lines, _ in counts])
        info["device"] = counts[0][2]
        target = max(1, -(-sum(rows) // max(1, len(parts))))
        positions, ranges, rest = positions_and_ranges(job, rows, config, rows_done, target)
        if run.datasets is not None and mixed(config):  # what the mix reads, for progress
            set_passes(run.datasets, [sum(rows[p] for p in stream) for stream in job.streams],
                       config.sampling_ratios(), config.dataprocessor.sampling_stopping_strategy)
        found = []  # the dedup shuffle, under way while the driver decides below
        # Held to the end of the run (digests only: small): a worker that dies holding a bucket's result
        # has it recomputed from these, where a released key would be "already forgotten".
        held = [scans]
        if buckets:
            positions_f = held_value(client, positions)
            for b in range(buckets):
                pieces = [client.submit(bucket_of, s, b, pure=False) for s in scans]
                held.append(pieces)
                found.append(client.submit(first_occurrences, positions_f, *pieces, pure=False))
        # The first rows' decisions, on the rows and chunks a single process makes them on.
        here = dataclasses.replace(run, threads=threads)
        chunks = read_chunks([], options.chunk_rows, rows=range_rows(here, job, Plan(rows, first_line, {}), rest))
        decide(here, chunks, Deduplicator(dedup.seen.copy()) if dedup is not None else None, decisions)
        plan_f = held_value(client, Plan(rows, first_line, decisions.state()))
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
