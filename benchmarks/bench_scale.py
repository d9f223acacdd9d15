"""How gpu-prep grows with the machine: one corpus of a given size, every route a whole process of its own.

    python benchmarks/bench_scale.py --mb 200 --kind chat --repeat 3
    python benchmarks/bench_scale.py --mb 200 --kind text --json scale-text.json

Routes (alternated round by round; medians of --repeat rounds):
  gpu-prep 1 core        `taskset -c <one core> gpu-prep run ...`
  gpu-prep all cores     `gpu-prep run ...` on every core the process may use (os.sched_getaffinity)
  gpu-prep local:N       `gpu-prep run ... --cluster local:N`, N the cores (with --cluster; needs the cluster extra)
  datasets.map batched   bench_e2e.py's route: load_dataset("json") into a fresh cache, Dataset.map(batched=True,
                         num_proc=N) calling apply_chat_template(..., return_assistant_tokens_mask=True) (chat)
                         or the tokenizer (text), save_to_disk: the strongest form of the peer a user writes
  raw engine             the engine gpu-prep chose, encoding the texts of gpu-prep's output (decoded back
                         before the clock): the CPU seconds no pipeline can go under

The corpus is built on the machine from bench_peers.py's corpora of the installed ShareGPT package (unique
rows: each pass over them tags its rows with the pass number), so a lent machine needs no data carried. Each
route prints wall seconds, MB/s, tokens/s, CPU seconds per MB and that against the raw engine's, the speed-up
over one core and peak RSS (the process and its children). The gpu-prep routes must write identical shards;
the script fails otherwise. --json writes every figure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_e2e import DATASETS_SCRIPT, timed  # noqa: E402
from benchmarks.bench_peers import CORPORA  # noqa: E402
from benchmarks.clock import scratch  # noqa: E402
from reference import write_tokenizer_dir  # noqa: E402  (tests/reference.py, put on the path by corpora)

GPU_PREP = [sys.executable, "-m", "gpu_prep.launch"]
PEER = "datasets.map batched"
ENGINE = "raw engine"


def build_corpus(path: Path, kind: str, megabytes: float) -> int:
    """JSON Lines of at least `megabytes`: bench_peers' ShareGPT conversations (chat) or answers (text), the
    rows of pass k over them tagged with k so that no row repeats another. Returns the rows written."""
    rows = CORPORA[kind].build(100_000)
    key = "text" if kind == "text" else "messages"
    target, written, count = megabytes * (1 << 20), 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        for k in range(1_000_000):
            for row in rows:
                if kind == "text":
                    tagged = {"text": f"[{k}] {row['text']}"}
                else:
                    first, *rest = row[key]
                    tagged = {"messages": [{**first, "content": f"[{k}] {first['content']}"}, *rest]}
                line = json.dumps(tagged, ensure_ascii=False) + "\n"
                handle.write(line)
                written += len(line.encode("utf-8"))
                count += 1
                if written >= target:
                    return count
    return count


def config_for(kind: str, tokenizer: Path) -> dict[str, Any]:
    """What the peer does too: no row cut at a length (the map truncates nothing); dedup, on by default,
    finds nothing in unique rows."""
    base = {"tokenizer": str(tokenizer), "preprocessing": {"max_seq_len": 1 << 30}, "output": {"storage_format": "bin"}}
    if kind == "chat":
        return {**base, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    return {**base, "input": {"type": "text"}}


ENGINE_SCRIPT = r"""
import json, sys, time
import gpu_prep
from gpu_prep.tokenization.tokenizer import load_tokenizer
out, choice, report = sys.argv[1:4]
tok = load_tokenizer(json.load(open(f"{out}/manifest.json"))["tokenizer"]["name"])
ds = gpu_prep.open_dataset(out)
texts = [tok.decode(ids) for domain in ds for ids, _ in ds[domain]]
tok.use_engine(choice, texts[:200], 200)
start = time.process_time()
ids, counts = tok.encode(texts)
json.dump({"cpu": time.process_time() - start, "engine": tok.active.name, "tokens": int(counts.sum())}, open(report, "w"))
"""


def peer_tokens(out: Path) -> int:
    import datasets

    return sum(map(len, datasets.load_from_disk(str(out))["input_ids"]))


def shards_digest(out: Path) -> str:
    """The sha256 of every data file of an output (not the manifest, which says how the run went)."""
    digest = hashlib.sha256()
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name not in ("manifest.json",) and not path.name.startswith("."):
            digest.update(path.relative_to(out).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="corpus size in MB")
    parser.add_argument("--kind", choices=["chat", "text"], default="chat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="also run --cluster local:N")
    parser.add_argument("--no-peer", action="store_true", help="leave out datasets.map")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", type=Path, help="work here and keep it (corpus, outputs)")
    args = parser.parse_args()

    cores = sorted(os.sched_getaffinity(0))
    work = args.keep or scratch("bench-scale-")
    work.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = work / f"{args.kind}.jsonl", work / "tokenizer"
    rows = build_corpus(corpus, args.kind, args.mb)
    megabytes = corpus.stat().st_size / (1 << 20)
    write_tokenizer_dir(tokenizer)
    config = work / "config.json"
    config.write_text(json.dumps(config_for(args.kind, tokenizer)), encoding="utf-8")
    print(f"corpus: {rows:,} {args.kind} rows, {megabytes:.1f} MB; {len(cores)} cores; {work}", flush=True)

    def gpu_prep(name: str, *extra: str, pin: bool = False) -> list[str]:
        command = [*GPU_PREP, "run", "-c", str(config), str(corpus), "-o", str(work / name), "-q", "--overwrite", *extra]
        return ["taskset", "-c", str(cores[0]), *command] if pin else command

    routes = {"gpu-prep 1 core": gpu_prep("one", pin=True), "gpu-prep all cores": gpu_prep("all")}
    if args.cluster:
        routes[f"gpu-prep local:{len(cores)}"] = gpu_prep("cluster", "--cluster", f"local:{len(cores)}")
    if not args.no_peer:
        routes[PEER] = [sys.executable, "-c", DATASETS_SCRIPT, str(corpus), str(tokenizer), str(work / "mapped"),
                        str(work / "datasets-cache"), args.kind, "1"]
    runs: dict[str, list[Any]] = {name: [] for name in routes}
    for _ in range(args.repeat):
        for name, command in routes.items():
            shutil.rmtree(work / "datasets-cache", ignore_errors=True)  # no warm cache: every run maps for real
            runs[name].append(timed(command))

    outputs = {"gpu-prep 1 core": work / "one", "gpu-prep all cores": work / "all",
               **({f"gpu-prep local:{len(cores)}": work / "cluster"} if args.cluster else {})}
    digests = {name: shards_digest(out) for name, out in outputs.items()}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"the gpu-prep routes wrote different shards: {digests}")
    manifest = json.loads((work / "all" / "manifest.json").read_text(encoding="utf-8"))
    tokens = manifest["totals"]["tokens"]
    timed([sys.executable, "-c", ENGINE_SCRIPT, str(work / "all"), manifest["tokenizer"]["engine"],
           str(work / "engine.json")])
    engine = json.loads((work / "engine.json").read_text(encoding="utf-8"))
    engine_cpu_mb = engine["cpu"] / megabytes

    one = statistics.median(r.seconds for r in runs["gpu-prep 1 core"])
    figures = {}
    print(f"\n{'route':<24} {'wall s':>8} {'MB/s':>8} {'Mtok/s':>8} {'CPU s/MB':>9} {'x engine':>9} "
          f"{'x 1 core':>9} {'RSS MB':>8}")
    for name, measures in runs.items():
        wall = statistics.median(r.seconds for r in measures)
        cpu = statistics.median(r.cpu for r in measures)
        count = tokens if name.startswith("gpu-prep") else peer_tokens(work / "mapped")
        figures[name] = {"wall": wall, "walls": [r.seconds for r in measures], "cpu": cpu,
                         "mb_per_s": megabytes / wall, "tokens_per_s": count / wall, "cpu_per_mb": cpu / megabytes,
                         "vs_engine": cpu / megabytes / engine_cpu_mb, "vs_one_core": one / wall,
                         "rss_mb": max(r.peak_mb for r in measures)}
        f = figures[name]
        print(f"{name:<24} {wall:>8.2f} {f['mb_per_s']:>8.1f} {f['tokens_per_s'] / 1e6:>8.2f} {f['cpu_per_mb']:>9.3f} "
              f"{f['vs_engine']:>9.2f} {f['vs_one_core']:>9.2f} {f['rss_mb']:>8.0f}")
    print(f"{ENGINE + ' (' + engine['engine'] + ')':<24} {'':>8} {'':>8} {'':>8} {engine_cpu_mb:>9.3f} {1:>9.2f}")
    if PEER in figures:
        print(f"\ngpu-prep all cores against {PEER} (num_proc={len(cores)}): "
              f"{figures[PEER]['wall'] / figures['gpu-prep all cores']['wall']:.2f}x")
    print(f"gpu-prep shards identical across routes: {next(iter(digests.values()))[:16]}")
    if args.json:
        args.json.write_text(json.dumps({"corpus": {"kind": args.kind, "rows": rows, "mb": megabytes},
                                         "cores": len(cores), "tokens": tokens, "engine": engine,
                                         "routes": figures}, indent=1), encoding="utf-8")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
