"""A run on a Dask cluster writes what the single-process run writes, byte for byte.

The cluster is a real LocalCluster of two worker processes. Input files are cut into small parts, so that
duplicates have their first occurrence in another part (and another worker) and the mixed order of two
datasets takes rows from many parts. A worker killed mid-run, and runs stopped on one side and resumed on
the other, change nothing either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("dask.distributed")

from dask.distributed import LocalCluster  # noqa: E402

from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.errors import ConfigError, Interrupted  # noqa: E402
from gpu_prep.pipeline import MANIFEST, Options, run  # noqa: E402
from gpu_prep.read.inputs import InputFile
from gpu_prep.read.rows import split_file
from helpers import gpu_prep_cli, output_tree  # noqa: E402

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

PART_BYTES = 5000
CHUNK_ROWS = 32
BASE = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"},
        "preprocessing": {"min_chars": 0, "max_seq_len": 160},
        "output": {"domain_key": "source", "max_tokens_per_shard": 4000}}


def _write_corpus(path: Path, n: int, seed: int) -> Path:
    """Chat rows of two domains; row i repeats row i - n // 3 now and then (a duplicate parts away), and
    a few lines are broken."""
    lines = []
    for i in range(n):
        j = i - n // 3 if i % 7 == 3 and i >= n // 3 else i
        words = " ".join(f"w{(j * 11 + seed + k) % 89}" for k in range(3 + (j * 7) % 45))
        lines.append(json.dumps({"source": "a" if j % 3 else "b", "tag": "x" * (j % 5),
                                 "messages": [{"role": "user", "content": f"q{seed}.{j} {words}"},
                                              {"role": "assistant", "content": f"a{j} {words}"}]}))
    for k in range(11, n, 97):
        lines.insert(k, "{broken json" if k % 2 else '{"messages": "not a list"}')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cluster-data")
    return {"one": _write_corpus(root / "one.jsonl", 420, 1), "two": _write_corpus(root / "two.jsonl", 260, 2)}


@pytest.fixture(scope="module")
def scheduler() -> Any:
    """A two-worker cluster of processes, shared by the tests that pass its address."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def _tree(root: Path) -> dict[str, bytes]:
    return output_tree(root, "cluster")


def _both(tmp_path: Path, config: dict[str, Any], inputs: list[str], cluster: str, part_bytes: int = PART_BYTES,
          **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The single-process run and the cluster run of one config: their manifests, after checking that
    they wrote the same files and rejects."""
    manifests = []
    for name, where in (("single", None), ("cluster", cluster)):
        manifests.append(run(parse_config(config), inputs, tmp_path / name, Options(chunk_rows=CHUNK_ROWS, cluster=where,
                             part_bytes=part_bytes, rejects=tmp_path / f"{name}.rejects.jsonl", **kwargs)))
    single, clustered = _tree(tmp_path / "single"), _tree(tmp_path / "cluster")
    assert sorted(single) == sorted(clustered)
    for name in single:
        assert single[name] == clustered[name], f"{name} differs"
    assert (tmp_path / "single.rejects.jsonl").read_bytes() == (tmp_path / "cluster.rejects.jsonl").read_bytes()
    return manifests[0], manifests[1]


def _duplicates_across_parts(path: Path) -> int:
    """Duplicate rows of a corpus file whose first occurrence lies in another part."""
    parts = split_file(InputFile(0, str(path), path.stat().st_size), PART_BYTES)
    first: dict[str, int] = {}
    across = 0
    with open(path, "rb") as handle:
        for k, part in enumerate(parts):
            handle.seek(part.start)
            for line in handle.read(part.end - part.start).splitlines():
                try:
                    key = json.loads(line)["messages"][0]["content"]
                except (ValueError, TypeError):
                    continue
                across += first.setdefault(key, k) != k
    return across


def test_plain_run_with_dedup_across_parts(tmp_path: Path, corpus: dict[str, Path], scheduler: str) -> None:
    assert _duplicates_across_parts(corpus["one"]) >= 10
    config = {**BASE, "output": {**BASE["output"], "storage_format": "bin"}}
    single, clustered = _both(tmp_path, config, [str(corpus["one"]), str(corpus["two"])], scheduler)
    assert clustered["cluster"]["parts"] >= 20 and clustered["cluster"]["workers"] == 2
    totals = clustered["totals"]
    assert totals["rows_dropped"]["duplicate"] >= 10 and totals["rows_dropped"]["malformed_json"] >= 2
    # The accounting sums hold: every row read is written or dropped for one reason, per file and in all.
    assert totals["rows_read"] == totals["rows_written"] + sum(totals["rows_dropped"].values())
    for entry in clustered["inputs"]:
        assert entry["rows_read"] == entry["rows_written"] + sum(entry["rows_dropped"].values())
    lines = sum(1 for name in ("one", "two") for _ in open(corpus[name], encoding="utf-8"))
    assert totals["rows_read"] == lines and single["totals"] == totals


def test_near_duplicates_are_decided_as_in_one_process(tmp_path: Path, corpus: dict[str, Path], scheduler: str) -> None:
    # The workers hash, the driver decides in input order as it commits: the same rows dropped, the same rows
    # named, whatever part or range a row and the row it is like fall in.
    config = {**BASE, "preprocessing": {**BASE["preprocessing"], "fuzzy_dedup": {"threshold": 0.5, "ngram": 3}}}
    single, clustered = _both(tmp_path, config, [str(corpus["one"]), str(corpus["two"])], scheduler)
    assert clustered["totals"]["rows_dropped"]["near_duplicate"] >= 20
    assert single["totals"] == clustered["totals"]


def test_files_read_whole_gzip_parquet_and_json_arrays(tmp_path: Path, corpus: dict[str, Path], scheduler: str) -> None:
    # Compressed files, Parquet and JSON arrays cannot be cut at byte offsets: each is one part, beside a
    # JSON Lines file that is cut. Rows repeat across the files, so dedup spans them.
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = corpus["two"].read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.startswith('{"source"')]
    packed = tmp_path / "two.jsonl.gz"
    packed.write_bytes(gzip.compress("\n".join(lines[:120]).encode()))
    pq.write_table(pa.Table.from_pylist(rows[60:200]), tmp_path / "two.parquet")
    (tmp_path / "two.json").write_text(json.dumps(rows[150:]), encoding="utf-8")
    inputs = [str(packed), str(tmp_path / "two.parquet"), str(tmp_path / "two.json"), str(corpus["one"])]
    _, clustered = _both(tmp_path, BASE, inputs, scheduler)
    assert clustered["totals"]["rows_dropped"]["duplicate"] >= 60 + 50
    assert clustered["cluster"]["parts"] == 3 + len(split_file(InputFile(0, str(corpus["one"]),
                                                                         corpus["one"].stat().st_size), PART_BYTES))


MIXES = {
    # all_exhausted starts the smaller dataset over: its repeated rows are duplicates of their first turn.
    "all-exhausted-dedup": ({"sampling_stopping_strategy": "all_exhausted", "seed": 7}, {}),
    "first-exhausted-no-dedup-max-items": ({"sampling_stopping_strategy": "first_exhausted", "seed": 3},
                                           {"deduplicate": False, "max_items": 500}),
    "packed-parquet": ({"sampling_stopping_strategy": "all_exhausted", "seed": 11},
                       {"packing": "bfd"}),
}


@pytest.mark.parametrize("mix", list(MIXES))
def test_mixed_datasets(tmp_path: Path, corpus: dict[str, Path], scheduler: str, mix: str) -> None:
    process, rules = MIXES[mix]
    output = {"max_tokens_per_shard": 4000, **({"storage_format": "parquet"} if mix == "packed-parquet" else {})}
    config = {**BASE, "preprocessing": {**BASE["preprocessing"], **rules}, "output": output,
              "dataprocessor": process,
              "datasets": [{"name": "one", "data_paths": [str(corpus["one"])], "sampling": 0.5, "domain": "one"},
                           {"name": "two", "data_paths": [str(corpus["two"])], "sampling": 0.5,
                            "data_handlers": [{"name": "skip_large_text",
                                               "arguments": {"fn_kwargs": {"column_name": "tag", "max_length": 2}}}]}]}
    single, clustered = _both(tmp_path, config, [], scheduler)
    datasets = {d["name"]: d for d in clustered["datasets"]}
    assert datasets["one"]["rows_written"] > 0 and datasets["two"]["rows_dropped"]["skipped_by_handler"] > 0
    if mix == "first-exhausted-no-dedup-max-items":
        assert clustered["totals"]["rows_read"] == 500
    else:  # the smaller dataset went round more than once
        assert datasets["two"]["rows_read"] > 265


def test_a_mixs_progress_on_a_cluster_counts_what_the_mix_reads(tmp_path: Path, corpus: dict[str, Path],
                                                                 scheduler: str) -> None:
    # The driver plans the mix from the parts' row counts: the datasets' passes come from there, so the share
    # climbs through the run as it does in one process (it sat at 100% from a quarter of the way).
    process, rules = MIXES["all-exhausted-dedup"]
    config = {**BASE, "preprocessing": {**BASE["preprocessing"], **rules, "deduplicate": False},
              "dataprocessor": process,
              "datasets": [{"name": "one", "data_paths": [str(corpus["one"])], "sampling": 0.2},
                           {"name": "two", "data_paths": [str(corpus["two"])], "sampling": 0.8}]}
    shares: list[float] = []
    run(parse_config(config), [], tmp_path / "out", Options(chunk_rows=CHUNK_ROWS, cluster=scheduler,
        part_bytes=PART_BYTES, progress=lambda rows, tokens, done, total: shares.append(done / total)))
    assert shares == sorted(shares) and shares[len(shares) // 2] < 0.8 and shares[-1] > 0.7, shares


def test_a_worker_killed_mid_run_is_survived(tmp_path: Path, corpus: dict[str, Path],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers of this local cluster start with a failpoint: the first of them to tokenize a third
    # chunk is SIGKILLed (only that one: the marker file says it happened). Its nanny starts a new worker,
    # the scheduler hands the lost tasks to the workers alive, and the driver still writes every chunk once.
    marker = tmp_path / "killed"
    monkeypatch.setenv("GPU_PREP_FAILPOINT", "tokenize:3")
    monkeypatch.setenv("GPU_PREP_FAILPOINT_ONCE", str(marker))
    _, clustered = _both(tmp_path, BASE, [str(corpus["one"])], "local:2")
    assert marker.exists(), "no worker was killed"
    assert clustered["totals"]["rows_dropped"]["duplicate"] >= 10


def test_a_cluster_that_keeps_losing_workers_stops_resumably(tmp_path: Path, corpus: dict[str, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Every worker dies at its second chunk, and Dask is told to give up on a task at its first death: the
    # run stops with an error that says so, keeping what --resume needs, and a single process finishes it.
    import dask

    config = parse_config(BASE)
    want = run(config, [str(corpus["two"])], tmp_path / "want", Options(chunk_rows=CHUNK_ROWS))
    monkeypatch.setenv("GPU_PREP_FAILPOINT", "tokenize:2")
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), pytest.raises(Interrupted, match="--resume"):
        run(config, [str(corpus["two"])], tmp_path / "out", Options(chunk_rows=CHUNK_ROWS, cluster="local:2",
            part_bytes=PART_BYTES, checkpoint_seconds=0))
    assert not (tmp_path / "out" / MANIFEST).exists()
    monkeypatch.delenv("GPU_PREP_FAILPOINT")
    got = run(config, [str(corpus["two"])], tmp_path / "out", Options(chunk_rows=CHUNK_ROWS, resume=True))
    assert _tree(tmp_path / "out") == _tree(tmp_path / "want") and got["totals"] == want["totals"]


@pytest.mark.parametrize("killed_on", ["cluster", "single"])
def test_stopped_on_one_side_resumed_on_the_other(tmp_path: Path, corpus: dict[str, Path], killed_on: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(BASE))
    common = ["run", corpus["one"], "-c", config, "--chunk-rows", CHUNK_ROWS, "--part-mb", PART_BYTES / (1 << 20)]
    assert gpu_prep_cli(*common, "-o", tmp_path / "want", "-q").returncode == 0
    on_cluster = ["--cluster", "local:2"]
    # The driver alone checkpoints, so the cluster's workers pass this failpoint by.
    killed = gpu_prep_cli(*common, "-o", tmp_path / "out", "-q", "--checkpoint-every", 0,
                  *(on_cluster if killed_on == "cluster" else []), env={"GPU_PREP_FAILPOINT": "checkpoint:4"})
    assert killed.returncode == -9, killed.stderr
    resumed = gpu_prep_cli(*common, "-o", tmp_path / "out", "--resume", *(on_cluster if killed_on == "single" else []))
    assert resumed.returncode == 0, resumed.stderr
    if killed_on == "single":  # the run's summary and the dashboard's address, as the cluster ran it
        assert "Dask dashboard: http://" in resumed.stderr and "Dask cluster" in resumed.stdout
    assert _tree(tmp_path / "out") == _tree(tmp_path / "want")


@pytest.mark.parametrize("spec", ["local:0", "locale:2", "somewhere", "tcp://127.0.0.1", "foo://host:8786"])
def test_a_cluster_that_is_not_one_is_refused(tmp_path: Path, corpus: dict[str, Path], spec: str) -> None:
    # An address of no known scheme, or without its port, is refused before the output is touched (it was
    # distributed's ValueError, as a traceback, from inside the run).
    with pytest.raises(ConfigError, match="--cluster"):
        run(parse_config(BASE), [str(corpus["two"])], tmp_path / "out", Options(cluster=spec))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("failure", ["worker dies", "scheduler fails", "no scheduler"])
def test_a_cluster_that_does_not_start_stops_the_run_in_one_sentence(tmp_path: Path, corpus: dict[str, Path],
                                                                      failure: str) -> None:
    # A worker SIGKILLed as it starts (its preload kills it, and the nanny gives up on it) and a scheduler that
    # raises as it starts were distributed's tracebacks (90 lines of "Nanny failed to start"); an address where
    # no scheduler answers was reported as a write error. Like a cluster that loses its workers mid-run, each
    # now stops the run resumably with one sentence that says why.
    import dask

    preload = tmp_path / "preload.py"
    preload.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n" if failure == "worker dies"
                       else "raise ImportError('no module named frobnicate')\n")
    dask_settings = {"worker dies": {"distributed.worker.preload": [str(preload)]},
                     "scheduler fails": {"distributed.scheduler.preload": [str(preload)]},
                     "no scheduler": {"distributed.comm.timeouts.connect": "1s"}}[failure]
    spec = "local:1"
    if failure == "no scheduler":  # a port just freed: nothing listens there
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            spec = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    config = parse_config(BASE)
    with dask.config.set(dask_settings), pytest.raises(Interrupted) as stopped:
        run(config, [str(corpus["two"])], tmp_path / "out", Options(cluster=spec))
    message = str(stopped.value)
    assert "\n" not in message and message.endswith("start the run again with --resume"), message
    assert {"worker dies": "the local Dask cluster did not start", "scheduler fails": "frobnicate",
            "no scheduler": f"no Dask scheduler answered at {spec}"}[failure] in message, message
    if failure == "scheduler fails":  # what it says works (the same for all three): --resume starts the run over
        assert run(config, [str(corpus["two"])], tmp_path / "out", Options(resume=True))["totals"]["rows_written"] > 0


def test_a_lone_dataset_with_a_ratio_but_no_rows_is_refused_as_in_one_process(tmp_path: Path, scheduler: str) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    config = parse_config({**BASE, "datasets": [{"name": "one", "data_paths": [str(tmp_path / "empty.jsonl")],
                                                 "sampling": 1.0}]})
    for where in (None, scheduler):
        with pytest.raises(ConfigError, match="no rows"):
            run(config, [], tmp_path / f"out-{where is None}", Options(cluster=where))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_dedup_shuffle_finds_what_one_pass_in_order_finds(data: st.DataObject) -> None:
    # Streams of parts of rows, each row a digest (or None: it failed the length rules), mixed by ratios or
    # taken in order, cut at max_items and resumed at rows_done: for every range, the shuffle must give the
    # digests of the range that occurred before it, as one pass over the stream in order sees them.
    from itertools import islice
    from types import SimpleNamespace

    from gpu_prep.cluster.plan import positions_and_ranges
    from gpu_prep.cluster.shuffle import DIGEST, first_occurrences
    from gpu_prep.read.mix import dataset_order

    mixed = data.draw(st.booleans())
    shapes = data.draw(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=2 if mixed else 1,
                                max_size=3 if mixed else 1))
    if mixed:
        assume(all(sum(sizes) for sizes in shapes))
    parts, streams = [], []
    for sizes in shapes:
        streams.append([len(parts) + k for k in range(len(sizes))])
        parts += [data.draw(st.lists(st.none() | st.integers(0, 6), min_size=n, max_size=n)) for n in sizes]
    ratios = [1.0 / len(shapes)] * len(shapes) if mixed else None
    strategy = data.draw(st.sampled_from(["first_exhausted", "all_exhausted"]))
    cap, seed = data.draw(st.none() | st.integers(1, 30)), data.draw(st.integers(0, 50))
    config = SimpleNamespace(datasets=shapes if mixed else None, sampling_ratios=lambda: ratios,
                             preprocessing=SimpleNamespace(max_items=cap),
                             dataprocessor=SimpleNamespace(seed=seed, sampling_stopping_strategy=strategy))
    flat = [[d for p in stream for d in parts[p]] for stream in streams]
    order = (list(islice(dataset_order([len(f) for f in flat], ratios, seed, strategy), cap)) if mixed
             else [0] * min(len(flat[0]), cap or len(flat[0])))
    taken = [0] * len(flat)
    seq = []  # the digest at each position of the stream
    for s in order:
        seq.append(flat[s][taken[s] % len(flat[s])])
        taken[s] += 1
    rows_done = data.draw(st.integers(0, len(order)))
    positions, ranges, _ = positions_and_ranges(SimpleNamespace(streams=streams, parts=parts), [len(p) for p in parts],
                                                 config, rows_done, data.draw(st.integers(1, 8)))
    assert [k for r in ranges for k in range(r.start, r.stop)] == list(range(rows_done, len(order)))

    def as_digest(d: int) -> np.ndarray:
        return np.full(DIGEST, d, dtype=np.uint8)

    pieces = [(np.array([i for i, d in enumerate(rows) if d is not None], dtype=np.int64),
               np.array([as_digest(d) for d in rows if d is not None], dtype=np.uint8).reshape(-1, DIGEST))
              for rows in parts]
    found = first_occurrences(positions, *pieces)
    for k, r in enumerate(ranges):
        want = {d for d in seq[r.start:r.stop] if d is not None and d in seq[:r.start]}
        assert {int(row[0]) for row in found.get(k, np.zeros((0, DIGEST), np.uint8))} == want, (k, r.start, r.stop)


def test_a_stopped_run_silences_its_local_workers_before_closing_them() -> None:
    # Workers cut off mid-transfer when a stopped run closes its cluster log reset connections as tracebacks:
    # the stop silences the workers' loggers (and this process's) first.
    import logging

    from gpu_prep.cluster import driver

    seen: dict[str, int] = {}

    def levels(client: Any) -> None:
        seen.update(client.run(lambda: logging.getLogger("distributed").getEffectiveLevel()))

    here = logging.getLogger("distributed")
    before = here.level
    original = driver._quiet_teardown
    try:
        driver._quiet_teardown = lambda client: (original(client), levels(client))
        with pytest.raises(KeyboardInterrupt), driver.connect("local:2", False, parse_config(BASE)):
            raise KeyboardInterrupt
        assert len(seen) == 2 and set(seen.values()) == {logging.CRITICAL}
        assert here.level == logging.CRITICAL
    finally:
        driver._quiet_teardown = original
        here.setLevel(before)


@pytest.mark.parametrize("spec", ["local:0", "local:two", "remote", "nowhere:3"])
def test_connect_refuses_what_is_neither_local_nor_an_address(spec: str) -> None:
    from gpu_prep.cluster.driver import connect

    with pytest.raises(ConfigError, match="give local, local:N"), connect(spec, False, parse_config(BASE)):
        pass


def test_the_dedup_shuffle_takes_more_buckets_for_a_smaller_budget(tmp_path: Path, corpus: dict[str, Path],
                                                                  scheduler: str) -> None:
    # Each bucket of the cluster's dedup shuffle holds its share of the digests: a budget the input's digests
    # would pass in one bucket spreads them over more, and the output is the same.
    from gpu_prep.cluster.driver import dedup_buckets

    assert dedup_buckets(10 << 20, 2, 1024) == 2 and dedup_buckets(10 << 20, 2, 0.5) == 20
    assert dedup_buckets(1 << 50, 2, 1) == 4096 and dedup_buckets(1 << 50, 2, None) == 2
    for budget in (0.001, 0.0003):  # the second makes more than 256 buckets
        tight = {**BASE, "preprocessing": {**BASE.get("preprocessing", {}), "dedup_memory_mb": budget}}
        # Parts ten times the others' size: the shuffle's tasks are parts x buckets (and ranges x buckets).
        single, clustered = _both(tmp_path / str(budget), tight, [str(corpus["one"])], scheduler, 10 * PART_BYTES)
        assert clustered["totals"] == single["totals"] and clustered["totals"]["rows_dropped"]["duplicate"] >= 10
    assert dedup_buckets(corpus["one"].stat().st_size, 2, 0.0003) > 256


def test_digests_spread_over_every_bucket() -> None:
    from gpu_prep.cluster.shuffle import bucket_index

    digests = np.frombuffer(np.random.default_rng(0).bytes(16 * 50_000), np.uint8).reshape(-1, 16)
    assert len(np.unique(bucket_index(digests, 4096))) == 4096  # not only the 256 one byte could reach


def test_ctrl_c_on_a_local_cluster_is_answered_once_with_the_command_that_resumes(tmp_path: Path,
                                                                                   corpus: dict[str, Path]) -> None:
    # A terminal's Ctrl-C reaches every process of the command, the local cluster's workers too: they leave
    # it to the run, which stops, shuts the cluster down and prints how to resume, with no worker tracebacks.
    import os
    import signal
    import subprocess
    import sys

    config = tmp_path / "config.json"
    config.write_text(json.dumps(BASE))
    script = Path(sys.executable).parent / "gpu-prep"
    env = {**os.environ, "GPU_PREP_FAILPOINT": "shard_append:3", "GPU_PREP_FAILPOINT_SIGNAL": "INT",
           "GPU_PREP_FAILPOINT_GROUP": "1"}
    stopped = subprocess.run([str(script), "run", "-c", str(config), str(corpus["one"]), "-o", str(tmp_path / "out"),
                              "--cluster", "local:2", "--part-mb", "0.005", "--chunk-rows", str(CHUNK_ROWS),
                              "--checkpoint-every", "0"], capture_output=True, text=True, env=env, timeout=300,
                             start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr + stopped.stdout and "KeyboardInterrupt" not in stopped.stderr, \
        stopped.stderr
    line = next(l for l in stopped.stderr.splitlines() if "resume it with:" in l)
    resumed = subprocess.run([str(script), *line.split("resume it with: ", 1)[1].split()[1:]], capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr


def test_bad_input_on_a_local_cluster_is_said_once_without_a_worker_traceback(tmp_path: Path) -> None:
    # A JSON array element that cannot be read stops the run; the worker that met it used to print the
    # task's traceback before the run's own one-line error.
    rows = [json.dumps({"text": f"document number {i}, long enough to keep"}) for i in range(6)]
    rows[3] = '{"text": "broken", }'
    data = tmp_path / "rows.json"
    data.write_text("[\n" + ",\n".join(rows) + "\n]\n")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"input": {"type": "text"}, "preprocessing": {"min_chars": 1}}))
    stopped = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q", "--cluster", "local:2")
    assert stopped.returncode == 1 and "array index 3" in stopped.stderr, stopped.stderr
    assert "Traceback" not in stopped.stderr and "Compute Failed" not in stopped.stderr, stopped.stderr
