"""gpu-prep against the datasets.map routes, each timed as a whole process: what a user waits for.

    pip install ".[bench]" transformers
    python benchmarks/bench_e2e.py --rows 4000                 # chat SFT, ShareGPT conversations
    python benchmarks/bench_e2e.py --rows 8000 --corpus text   # pretraining text, ShareGPT answers

Each route is one command a user would run, from process start to exit (imports, loading the tokenizer,
reading the JSON Lines, tokenizing, writing the result to disk), with nothing cached from an earlier run but
gpu-prep's own tokenizer cache where the route says so (each package's bytecode is compiled first, as pip
compiles it when it installs, gpu-prep's included):
  gpu-prep               `gpu-prep run -c config.json corpus.jsonl -o out -q` (shards with exact masks), as
                         every run after a tokenizer's first: GPU_PREP_CACHE holds the engine's rank file and
                         the tokenizer's outline (made by an untimed run before the rounds)
  gpu-prep, first run    the same with an empty GPU_PREP_CACHE: the first run with a tokenizer
  datasets.map batched   load_dataset("json") into a fresh cache, .map(batched=True, num_proc=cores) calling
                         apply_chat_template(..., return_assistant_tokens_mask=True) (text: tok(texts)),
                         save_to_disk: the strongest form of the route TRL-style scripts take
  datasets.map           the same, one example per call (batched=False), as many scripts write it
  raw engine             the engine gpu-prep adopted (fastokens encode_batch_flat) on the very texts gpu-prep
                         tokenizes (the rendered conversations, the documents), from a fresh process too

The chat routes share one tokenizer folder: the bundled Qwen2.5 tokenizer.json with a ChatML template that
carries {% generation %} markers, so transformers can make assistant masks. After every route ran, the
script reads gpu-prep's shards and the saved dataset back and compares ids and masks row by row; a
difference fails the script. Peak RSS is each process's own (wait4), workers included for datasets.map.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.clock import scratch  # noqa: E402
from benchmarks.bench_peers import CORPORA, Workspace, prepare  # noqa: E402

DATASETS_SCRIPT = textwrap.dedent('''
    import os, sys
    import datasets
    from transformers import AutoTokenizer
    corpus, tokenizer, out, cache, kind, batched = sys.argv[1:7]
    datasets.disable_progress_bars()
    tok = AutoTokenizer.from_pretrained(tokenizer)
    ds = datasets.load_dataset("json", data_files=corpus, split="train", cache_dir=cache)
    if kind == "chat":
        def fn(example):
            enc = tok.apply_chat_template(example["messages"], tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            return {"input_ids": enc["input_ids"], "assistant_masks": enc["assistant_masks"]}
    else:
        def fn(example):
            return {"input_ids": tok(example["text"])["input_ids"]}
    ds = ds.map(fn, batched=batched == "1", num_proc=len(os.sched_getaffinity(0)), remove_columns=ds.column_names)
    ds.save_to_disk(out)
''')

RAW_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import fastokens
    tokenizer, texts, out = sys.argv[1:4]
    tok = fastokens.Tokenizer.from_file(tokenizer + "/tokenizer.json")
    with open(texts, encoding="utf-8") as handle:
        pieces = json.load(handle)
    ids, offsets = tok.encode_batch_flat(pieces, add_special_tokens=False)
    np.save(out, np.frombuffer(ids, np.uint32))
''')


@dataclass
class Timed:
    seconds: float
    peak_mb: float  # the largest process of the route (workers counted apart)
    cpu: float = 0.0  # CPU seconds, user and system, of the route's process and its workers


def timed(command: list[str], env: dict[str, str] | None = None) -> Timed:
    started = time.perf_counter()
    process = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{stderr}")
    return Timed(seconds, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime)


def gpu_prep_route(ws: Workspace, out: Path) -> list[str]:
    # Documents without the end-of-document token gpu-prep adds by default: tok(text) adds none either.
    config = {"tokenizer": str(ws.tokenizer), "input": {"type": ws.kind, **({"append_eod": False} if ws.kind == "text" else {})},
              "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 1 << 30, "deduplicate": False, "min_chars": 0, "max_chars": 1 << 40}}
    path = ws.root / "config.json"
    path.write_text(json.dumps(config))
    return [str(Path(sys.executable).parent / "gpu-prep"), "run", "-c", str(path), str(ws.corpus), "-o", str(out),
            "-q", "--overwrite"]


def compare(ws: Workspace, gpu_out: Path, reference: Path) -> str:
    import datasets

    import gpu_prep

    want = datasets.load_from_disk(str(reference))
    got = list(gpu_prep.open_dataset(gpu_out)["__default__"])
    if len(got) != len(want):
        raise SystemExit(f"gpu-prep wrote {len(got)} rows, datasets.map {len(want)}")
    masks = want["assistant_masks"] if ws.kind == "chat" else None
    for k, ((ids, mask), want_ids) in enumerate(zip(got, want["input_ids"])):
        want_mask = masks[k] if masks is not None else [1] * len(want_ids)
        if ids.tolist() != want_ids or mask.astype(bool).tolist() != [bool(m) for m in want_mask]:
            raise SystemExit(f"row {k}: gpu-prep's ids or mask differ from transformers'")
    return f"identical: {len(got)}/{len(want)} rows, ids and masks"


def same_shards(a: Path, b: Path) -> bool:
    """Whether two gpu-prep outputs hold the same files with the same bytes (the manifests aside, which
    hold timings)."""
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file() and p.name != "manifest.json")
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and p.name != "manifest.json") \
        and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="chat")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each route; the fastest is kept")
    parser.add_argument("--skip-per-example", action="store_true", help="leave out the slow per-example map")
    args = parser.parse_args()
    root = scratch("gpu-prep-e2e-")
    corpus = CORPORA[args.corpus]
    subprocess.run([sys.executable, "-c", "import sys; from benchmarks.bench_e2e import _prepare; _prepare(*sys.argv[1:])",
                    str(root), args.corpus, str(args.rows)], check=True, cwd=Path(__file__).resolve().parent.parent)
    ws = Workspace(root, corpus.kind)
    megabytes = ws.corpus.stat().st_size / 1e6
    datasets_py, raw_py = root / "datasets_route.py", root / "raw_route.py"
    datasets_py.write_text(DATASETS_SCRIPT)
    raw_py.write_text(RAW_SCRIPT)
    rendered = root / "rendered.json"
    rendered.write_text(json.dumps(ws.rendered() if ws.kind == "chat" else [r["text"] for r in ws.rows()],
                                   ensure_ascii=False))

    def datasets_route(batched: bool, out: Path) -> list[str]:
        cache = root / f"hf-cache-{time.monotonic_ns()}"  # fresh: nothing reused from an earlier round
        return [sys.executable, str(datasets_py), str(ws.corpus), str(ws.tokenizer), str(out), str(cache), ws.kind,
                "1" if batched else "0"]

    warm = {"GPU_PREP_CACHE": str(root / "gpu-prep-cache")}
    routes = {
        "gpu-prep": lambda: (gpu_prep_route(ws, root / "gpu-prep-out"), warm),
        "gpu-prep, first run": lambda: (gpu_prep_route(ws, root / "first-run-out"),
                                        {"GPU_PREP_CACHE": str(root / f"empty-cache-{time.monotonic_ns()}")}),
        "datasets.map batched": lambda: (datasets_route(True, root / "batched-out"), None),
        "datasets.map": lambda: (datasets_route(False, root / "per-example-out"), None),
        "raw engine (fastokens)": lambda: ([sys.executable, str(raw_py), str(ws.tokenizer), str(rendered),
                                            str(root / "raw.npy")], None),
    }
    if args.skip_per_example:
        del routes["datasets.map"]
    # gpu-prep as `pip install .` leaves it, bytecode compiled, as pip leaves the peers' packages: an editable
    # install under PYTHONDONTWRITEBYTECODE would otherwise compile its modules from source on every start.
    import gpu_prep

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(gpu_prep.__file__).parent)], check=True)
    timed(*routes["gpu-prep"]())  # fills the warm cache; not counted
    best: dict[str, Timed] = {}
    for _ in range(args.repeat):
        for name, route in routes.items():
            for leftover in [*root.glob("hf-cache-*"), *root.glob("empty-cache-*")]:
                shutil.rmtree(leftover)
            if name.startswith("gpu-prep"):  # --overwrite would time deleting the last round's output
                shutil.rmtree(root / ("gpu-prep-out" if name == "gpu-prep" else "first-run-out"), ignore_errors=True)
            result = timed(*route())
            if name not in best or result.seconds < best[name].seconds:
                best[name] = result
    verdict = compare(ws, root / "gpu-prep-out", root / "batched-out")
    if not same_shards(root / "gpu-prep-out", root / "first-run-out"):
        raise SystemExit("gpu-prep's first run wrote other shards than its warm run")
    manifest = json.loads((root / "gpu-prep-out" / "manifest.json").read_text())
    tokens = manifest["totals"]["tokens"]
    raw_tokens = len(np.load(root / "raw.npy"))
    print(f"{corpus.about}: {args.rows} rows, {megabytes:.1f} MB of JSON Lines, {tokens / 1e6:.2f} M tokens; "
          f"{os.cpu_count()} cores; whole processes, best of {args.repeat}")
    print(f"gpu-prep {verdict} (against datasets.map batched); engine {manifest['tokenizer']['engine']}, "
          f"{manifest['tokenizer']['engine_check']['pieces_checked'] if manifest['tokenizer']['engine_check'] else 0} "
          "pieces checked against HF")
    gpu, first = best["gpu-prep"].seconds, best["gpu-prep, first run"].seconds
    print("\n| route | seconds | M tokens/s | peak RSS MB | gpu-prep is | gpu-prep's first run is |")
    print("|---|---|---|---|---|---|")
    for name, result in best.items():
        count = raw_tokens if name.startswith("raw") else tokens
        how = "its speed" if name.startswith("raw") else "faster"
        ratios = ["", ""] if name.startswith("gpu-prep") else [f"{result.seconds / t:.2f}x {how}" for t in (gpu, first)]
        print(f"| {name} | {result.seconds:.2f} | {count / result.seconds / 1e6:.2f} | {result.peak_mb:.0f} | "
              f"{' | '.join(ratios)} |")
    stages = {k: round(v, 2) for k, v in manifest["seconds"].items()}
    print(f"\ngpu-prep stage seconds (manifest; stages overlap): {stages}")


def _prepare(root: str, corpus: str, rows: str) -> None:
    prepare(Path(root), CORPORA[corpus], int(rows))


if __name__ == "__main__":
    main()
