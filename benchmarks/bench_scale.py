"""How gpu-prep grows with the machine: one corpus of a given size, every route a whole process of its own.

    python benchmarks/bench_scale.py --mb 200 --kind chat --repeat 3
    python benchmarks/bench_scale.py --mb 200 --kind text --json scale-text.json

Routes (alternated round by round; medians of --repeat rounds):
  gpu-prep 1 core        `taskset -c <one core> gpu-prep run ...`
  gpu-prep all cores     `gpu-prep run ...` on every core the process may use (os.sched_getaffinity)
  gpu-prep local:N       `gpu-prep run ... --cluster local:N`, N the cores (with --cluster; needs the cluster extra)
  datasets.map batched   load_dataset("json") then Dataset.map(batched=True, num_proc=N) calling
                         apply_chat_template(..., return_assistant_tokens_mask=True) (chat) or the tokenizer
                         (text), result kept in memory: the strongest form of the peer a user writes
  raw engine             the engine gpu-prep chose, encoding the texts of gpu-prep's output (decoded back
                         before the clock): the CPU seconds no pipeline can go under

The corpus is built on the machine from the installed ShareGPT package (unique rows: each pass over the
package's conversations tags its rows with the pass number), so a lent machine needs no data carried. Each
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.clock import scratch  # noqa: E402
from benchmarks.corpora import sharegpt_chats  # noqa: E402
from reference import write_tokenizer_dir  # noqa: E402  (tests/reference.py, put on the path by corpora)

GPU_PREP = [sys.executable, "-m", "gpu_prep.launch"]
PEER = "datasets.map batched"
ENGINE = "raw engine"


def build_corpus(path: Path, kind: str, megabytes: float) -> int:
    """JSON Lines of at least `megabytes`: ShareGPT conversations (chat) or their assistant answers (text),
    pass k's rows tagged with k so that no row repeats another. Returns the rows written."""
    chats = [c for c in sharegpt_chats(100_000) if c["messages"]]
    target, written, rows = megabytes * (1 << 20), 0, 0
    with open(path, "w", encoding="utf-8") as handle:
        for k in range(1_000_000):
            for chat in chats:
                if kind == "chat":
                    messages = [dict(m) for m in chat["messages"]]
                    messages[0]["content"] = f"[{k}] {messages[0]['content']}"
                    row: dict[str, Any] = {"messages": messages}
                else:
                    text = " ".join(m["content"] for m in chat["messages"] if m["role"] == "assistant").strip()
                    if not text:
                        continue
                    row = {"text": f"[{k}] {text}"}
                line = json.dumps(row, ensure_ascii=False) + "\n"
                handle.write(line)
                written += len(line.encode("utf-8"))
                rows += 1
                if written >= target:
                    return rows
    return rows


def config_for(kind: str, tokenizer: Path) -> dict[str, Any]:
    base = {"tokenizer": str(tokenizer), "preprocessing": {"max_seq_len": 4096},
            "output": {"storage_format": "bin"}}
    if kind == "chat":
        return {**base, "input": {"type": "chat"}, "mask": {"assistant": "train"}}
    return {**base, "input": {"type": "text"}}


PEER_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import datasets
from transformers import PreTrainedTokenizerFast
corpus, tokenizer, kind, procs, cache = sys.argv[1:6]
datasets.disable_progress_bars()
config = json.load(open(os.path.join(tokenizer, "tokenizer_config.json")))
tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(tokenizer, "tokenizer.json"),
                              chat_template=config["chat_template"], eos_token=config["eos_token"])
ds = datasets.load_dataset("json", data_files=corpus, split="train", cache_dir=cache)
if kind == "chat":
    def fn(batch):
        out = tok.apply_chat_template(batch["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return {"input_ids": out["input_ids"], "assistant_masks": out["assistant_masks"]}
else:
    def fn(batch):
        return {"input_ids": tok(batch["text"])["input_ids"]}
mapped = ds.map(fn, batched=True, num_proc=int(procs), remove_columns=ds.column_names, keep_in_memory=True)
print(json.dumps({"tokens": sum(map(len, mapped["input_ids"]))}))
"""

ENGINE_SCRIPT = r"""
import json, sys, time
import gpu_prep
from gpu_prep.tokenization.tokenizer import load_tokenizer
out, choice = sys.argv[1], sys.argv[2]
tok = load_tokenizer(json.load(open(f"{out}/manifest.json"))["tokenizer"]["name"])
ds = gpu_prep.open_dataset(out)
texts = [tok.decode(ids) for domain in ds for ids, _ in ds[domain]]
tok.use_engine(choice, texts[:200], 200)
start = time.process_time()
ids, counts = tok.encode(texts)
print(json.dumps({"cpu": time.process_time() - start, "engine": tok.active.name, "tokens": int(counts.sum())}))
"""


def measured(command: list[str], logs: Path) -> dict[str, Any]:
    """Run a command as a process of its own: wall seconds, CPU seconds and peak RSS (MB) of it and its
    children (os.wait4's rusage: the datasets and Dask worker processes count), and its last line printed."""
    with open(logs / "stdout", "w+") as out, open(logs / "stderr", "w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        printed, said = out.read().strip(), err.read()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{said[-3000:]}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
            "stdout": printed.splitlines()[-1] if printed else ""}


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
        routes[PEER] = [sys.executable, "-c", PEER_SCRIPT, str(corpus), str(tokenizer), args.kind, str(len(cores)),
                        str(work / "datasets-cache")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in routes}
    for _ in range(args.repeat):
        for name, command in routes.items():
            shutil.rmtree(work / "datasets-cache", ignore_errors=True)  # no warm cache: every run maps for real
            runs[name].append(measured(command, work))

    outputs = {"gpu-prep 1 core": work / "one", "gpu-prep all cores": work / "all",
               **({f"gpu-prep local:{len(cores)}": work / "cluster"} if args.cluster else {})}
    digests = {name: shards_digest(out) for name, out in outputs.items()}
    if len(set(digests.values())) != 1:
        raise SystemExit(f"the gpu-prep routes wrote different shards: {digests}")
    manifest = json.loads((work / "all" / "manifest.json").read_text(encoding="utf-8"))
    tokens = manifest["totals"]["tokens"]
    engine = json.loads(measured([sys.executable, "-c", ENGINE_SCRIPT, str(work / "all"),
                                  manifest["tokenizer"]["engine"]], work)["stdout"])
    engine_cpu_mb = engine["cpu"] / megabytes

    one = statistics.median(r["wall"] for r in runs["gpu-prep 1 core"])
    figures = {}
    print(f"\n{'route':<24} {'wall s':>8} {'MB/s':>8} {'Mtok/s':>8} {'CPU s/MB':>9} {'x engine':>9} "
          f"{'x 1 core':>9} {'RSS MB':>8}")
    for name, measures in runs.items():
        wall = statistics.median(r["wall"] for r in measures)
        cpu = statistics.median(r["cpu"] for r in measures)
        count = tokens if name.startswith("gpu-prep") else json.loads(measures[-1]["stdout"])["tokens"]
        figures[name] = {"wall": wall, "walls": [r["wall"] for r in measures], "cpu": cpu,
                         "mb_per_s": megabytes / wall, "tokens_per_s": count / wall, "cpu_per_mb": cpu / megabytes,
                         "vs_engine": cpu / megabytes / engine_cpu_mb, "vs_one_core": one / wall,
                         "rss_mb": max(r["rss_mb"] for r in measures)}
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
