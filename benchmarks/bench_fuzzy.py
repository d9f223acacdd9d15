"""Near-duplicate removal: gpu-prep's MinHash + LSH (preprocessing.fuzzy_dedup) beside datasketch's
MinHashLSH on the same documents, each timed as a whole process (reading the JSON Lines to writing which
rows are kept): documents per second and peak RSS.

    pip install ".[bench]"
    python benchmarks/bench_fuzzy.py --docs 20000

The corpus: ShareGPT answers of 20 words or more, with a planted near-copy (about one word in 120 changed,
Jaccard about 0.9 over 5-word shingles) after every tenth. Every route shingles words 5 at a time with 128
permutations and threshold 0.8 (9 bands of 13 rows in both), keeps the first row of a group and drops the
rows that collide with a kept one:
  gpu-prep, fuzzy module   gpu_prep.filter.fuzzy on the CPU backend: band keys a batch at a time, then the index
  gpu-prep run, +fuzzy     `gpu-prep run` of the documents (tokenized and written) with fuzzy_dedup, beside
  gpu-prep run             the same run without it: the difference is what fuzzy_dedup adds to a run
  datasketch               MinHash.update_batch per document and MinHashLSH query-then-insert, one process
  datasketch, N cores      the signatures made by a multiprocessing pool of all cores (MinHash.bulk over
                           slices of the documents), queried and inserted in order in the parent: the
                           strongest form a user writes
Each route's recall of the planted copies is printed beside it (the routes hash differently, so they drop
different rows where documents are near the threshold).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.clock import scratch  # noqa: E402
from benchmarks.bench_e2e import timed  # noqa: E402

NGRAM, NUM_PERM, THRESHOLD = 5, 128, 0.8

GPU_PREP_SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    import orjson
    from gpu_prep.backend import CPU
    from gpu_prep.filter.fuzzy import NO_ROW, MinHasher, NearIndex, lsh_bands, text_band_keys
    corpus, out = sys.argv[1:3]
    with open(corpus, "rb") as handle:
        texts = [orjson.loads(line)["text"] for line in handle]
    hasher = MinHasher(5, 128, *lsh_bands(0.8, 128), 42)
    index, kept = NearIndex(), []
    for lo in range(0, len(texts), 4096):
        keys, signed = text_band_keys(CPU, hasher, texts[lo:lo + 4096])
        places = np.arange(lo, lo + len(keys), dtype=np.uint64)
        kept += places[index.decide(keys, signed, places) == NO_ROW].tolist()
    with open(out, "w") as handle:
        handle.write(orjson.dumps(kept).decode())
''')

DATASKETCH_SCRIPT = textwrap.dedent('''
    import sys
    from multiprocessing import Pool
    import orjson
    from datasketch import LeanMinHash, MinHash, MinHashLSH

    def shingles(text):
        words = text.split()
        return [" ".join(words[i:i + 5]).encode() for i in range(max(len(words) - 4, 1))] if words else []

    def signatures(texts):
        return [LeanMinHash(m) for m in MinHash.bulk([shingles(t) for t in texts], num_perm=128)]

    if __name__ == "__main__":
        corpus, out, processes = sys.argv[1], sys.argv[2], int(sys.argv[3])
        with open(corpus, "rb") as handle:
            texts = [orjson.loads(line)["text"] for line in handle]
        lsh = MinHashLSH(threshold=0.8, num_perm=128)
        kept = []
        if processes > 1:
            step = 512
            with Pool(processes) as pool:
                hashes = [m for part in pool.imap(signatures, [texts[i:i + step] for i in range(0, len(texts), step)])
                          for m in part]
        else:
            hashes = []
            for t in texts:
                m = MinHash(num_perm=128)
                m.update_batch(shingles(t))
                hashes.append(m)
        for k, (t, m) in enumerate(zip(texts, hashes)):
            if not t.split():
                kept.append(k)
                continue
            if not lsh.query(m):
                lsh.insert(k, m)
                kept.append(k)
        with open(out, "w") as handle:
            handle.write(orjson.dumps(kept).decode())
''')


def make_corpus(path: Path, docs: int) -> list[int]:
    """Documents with a near-copy after every tenth; the copies' row numbers (0-based)."""
    from benchmarks.bench_peers import sharegpt_documents

    rng = random.Random(7)
    texts = [d["text"] for d in sharegpt_documents(docs * 2) if len(d["text"].split()) >= 20]
    rows, copies = [], []
    for k, text in enumerate(texts):
        if len(rows) >= docs:
            break
        rows.append(text)
        if k % 10 == 9 and len(rows) < docs:
            words = text.split()
            for _ in range(max(1, len(words) // 120)):
                i = rng.randrange(len(words))
                words[i] = words[i][::-1] + "~"
            copies.append(len(rows))
            rows.append(" ".join(words))
    with open(path, "w", encoding="utf-8") as handle:
        for text in rows:
            handle.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return copies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each route; the fastest is kept")
    args = parser.parse_args()
    root = scratch("gpu-prep-fuzzy-")
    corpus = root / "docs.jsonl"
    copies = make_corpus(corpus, args.docs)
    docs = sum(1 for _ in open(corpus, encoding="utf-8"))
    cores = os.cpu_count() or 1
    (root / "gpu_prep_route.py").write_text(GPU_PREP_SCRIPT)
    (root / "datasketch_route.py").write_text(DATASKETCH_SCRIPT)
    gpu_prep = str(Path(sys.executable).parent / "gpu-prep")

    def config(fuzzy: bool) -> str:
        path = root / f"config-{fuzzy}.json"
        path.write_text(json.dumps({"input": {"type": "text"}, "preprocessing": {
            "deduplicate": False, "min_chars": 0, "max_chars": 1 << 40, "max_seq_len": 1 << 30,
            **({"fuzzy_dedup": {"threshold": THRESHOLD, "ngram": NGRAM, "num_perm": NUM_PERM}} if fuzzy else {})}}))
        return str(path)

    routes = {
        "gpu-prep, fuzzy module": ([sys.executable, str(root / "gpu_prep_route.py"), str(corpus), str(root / "a.json")],
                                   root / "a.json"),
        "gpu-prep run, +fuzzy": ([gpu_prep, "run", "-c", config(True), str(corpus), "-o", str(root / "run"), "-q",
                                  "--overwrite", "--rejects", str(root / "rejects.jsonl")], None),
        "gpu-prep run": ([gpu_prep, "run", "-c", config(False), str(corpus), "-o", str(root / "plain"), "-q",
                          "--overwrite"], None),
        "datasketch": ([sys.executable, str(root / "datasketch_route.py"), str(corpus), str(root / "b.json"), "1"],
                       root / "b.json"),
        f"datasketch, {cores} cores": ([sys.executable, str(root / "datasketch_route.py"), str(corpus),
                                        str(root / "c.json"), str(cores)], root / "c.json"),
    }
    subprocess.run(routes["gpu-prep run"][0], check=True)  # the tokenizer's engine cache, as every later run has it
    results = {}
    for name, (command, _) in routes.items():
        results[name] = min((timed(command) for _ in range(args.repeat)), key=lambda t: t.seconds)
    dropped = {}
    for name, (_, kept_file) in routes.items():
        if kept_file is not None:
            dropped[name] = set(range(docs)) - set(json.loads(kept_file.read_text()))
    dropped["gpu-prep run, +fuzzy"] = {json.loads(line)["line"] - 1 for line in open(root / "rejects.jsonl")}
    if dropped["gpu-prep run, +fuzzy"] != dropped["gpu-prep, fuzzy module"]:
        raise SystemExit("gpu-prep's run and its fuzzy module dropped different rows")
    base = results["gpu-prep, fuzzy module"].seconds
    print(f"{docs} documents ({len(copies)} planted near-copies), {corpus.stat().st_size / 1e6:.1f} MB; "
          f"{cores} cores; word {NGRAM}-grams, {NUM_PERM} permutations, threshold {THRESHOLD}; whole processes, "
          f"best of {args.repeat}\n")
    print("| route | seconds | docs/s | peak RSS MB | planted copies dropped | rows dropped | gpu-prep's module is |")
    print("|---|---|---|---|---|---|---|")
    for name, t in results.items():
        caught = f"{len(dropped[name] & set(copies)) / len(copies):.3f}" if name in dropped else ""
        count = str(len(dropped[name])) if name in dropped else ""
        ratio = f"{t.seconds / base:.1f}x faster" if name.startswith("datasketch") else ""
        print(f"| {name} | {t.seconds:.2f} | {docs / t.seconds:,.0f} | {t.peak_mb:.0f} | {caught} | {count} | {ratio} |")
    added = results["gpu-prep run, +fuzzy"].seconds - results["gpu-prep run"].seconds
    print(f"\nfuzzy_dedup adds {added:.2f} s to a gpu-prep run of these documents "
          f"({docs / max(added, 1e-9):,.0f} docs/s of added time)")


if __name__ == "__main__":
    main()
