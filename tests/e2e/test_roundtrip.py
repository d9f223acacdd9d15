"""Round trips: what is stored decodes back to exactly the text the row was rendered as.

Sample i of the output is row i of the input (one domain, no dedup, nothing dropped), so
decode(ids of sample i) must equal the row's rendered text:

- chat: the real chat template (gpu_prep.render.sandbox.ChatTemplate, no transformers) over the messages;
- instruction: prompt + response + the eos token;
- text: the text itself.

Qwen's tokenizer normalizes to NFC, so the expected text is the NFC form of the rendering: a decomposed
"e" + U+0301 comes back as the single code point U+00E9, and U+212B (Angstrom sign) as U+00C5.
Also: the h5 storage holds the same ids and masks as bin, and small shards never split a sample and read
back as the same samples in the same order as one big shard.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpu_prep
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from helpers import REPO, marked_text, render_chat, run_rows, samples

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

# Text that tokenizers and templates like to change: edge whitespace, newlines, emoji (ZWJ sequences,
# flags, variation selectors), decomposed characters NFC composes, and a ligature NFC (unlike NFKC) keeps.
AWKWARD = [
    "  leading and trailing spaces  ",
    "\n\nnewlines around\n\n\n",
    "tabs\tand\r\nCRLF\r\n",
    "emoji 👩‍👩‍👧 ☂️ 🍣 🇫🇷 done",
    "decomposed: cafe\u0301, A\u030a, angstrom \u212b, hangul \u1100\u1161",
    "ligature ﬁ and fullwidth Ａ stay under NFC",
    " ",
]
NO_DEDUP = {"deduplicate": False, "min_chars": 0}


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _jsonl(path: Path) -> list[Any]:
    """Every line that parses as JSON (the examples end with deliberately broken lines)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _is_chat(row: Any) -> bool:
    messages = row.get("messages") if isinstance(row, dict) else None
    return isinstance(messages, list) and bool(messages) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages)


def _assert_round_trip(tok: Any, out: Path, expected: list[str]) -> None:
    stored = samples(out)
    assert len(stored) == len(expected), "every row must be written, one sample each"
    for i, ((ids, loss_mask), text) in enumerate(zip(stored, expected)):
        assert tok.decode(ids) == text, f"sample {i}"
        # The byte-length table the masks are built on agrees with the text, byte for byte.
        assert int(tok.token_bytes[ids].sum()) == len(text.encode("utf-8")), f"sample {i}"
        # The marked view is the same text plus markers (the helper golden files rely on).
        assert marked_text(tok, ids, loss_mask).replace("⟦", "").replace("⟧", "") == text, f"sample {i}"


def test_tokenizer_normalizes_to_nfc(qwen: Any) -> None:
    # Why the expected texts below are NFC forms: the decomposed rows really do change.
    assert qwen.normalization == "NFC"
    changed = [t for t in AWKWARD if _nfc(t) != t]
    assert changed and all(qwen.decode(qwen.encode([t])[0]) == _nfc(t) for t in changed)


def test_chat_rows_decode_to_their_rendering(qwen: Any, tmp_path: Path) -> None:
    rows = [r for r in _jsonl(REPO / "examples" / "chat.jsonl") if _is_chat(r)]
    rows += [{"messages": [{"role": "system", "content": t}, {"role": "user", "content": t},
                           {"role": "assistant", "content": t}]} for t in AWKWARD]
    rows.append({"messages": [{"role": "user", "content": ""}, {"role": "assistant", "content": "empty user"}]})
    out = run_rows(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                              "preprocessing": NO_DEDUP}, rows)
    _assert_round_trip(qwen, out, [render_chat(qwen, r["messages"]) for r in rows])


def test_instruction_rows_decode_to_prompt_response_eos(qwen: Any, tmp_path: Path) -> None:
    rows = [{"prompt": r["instruction"], "response": r["output"]} for r in _jsonl(REPO / "examples" / "instruction.jsonl")]
    # A blank response is dropped as empty by design, so a blank text is only tried as a prompt.
    rows += [{"prompt": t, "response": t if t.strip() else "ok"} for t in AWKWARD]
    out = run_rows(tmp_path, {"input": {"type": "instruction"}, "mask": {"response": "train"},
                              "preprocessing": NO_DEDUP}, rows)
    _assert_round_trip(qwen, out, [_nfc(r["prompt"] + r["response"]) + qwen.eos_text for r in rows])


def test_instruction_pieces_are_normalized_one_by_one(qwen: Any, tmp_path: Path) -> None:
    # Documented design (render.py): prompt and response are tokenized and normalized separately, so the
    # response boundary is a token boundary. A combining mark opening the response therefore does NOT
    # compose with the prompt's last letter, unlike NFC over the whole text.
    row = {"prompt": "cafe", "response": "\u0301 au lait"}
    out = run_rows(tmp_path, {"input": {"type": "instruction"}, "mask": {"response": "train"}}, [row])
    (ids, loss_mask), = samples(out)
    assert qwen.decode(ids) == "cafe\u0301 au lait" + qwen.eos_text
    assert qwen.decode(ids[loss_mask == 1]) == "\u0301 au lait" + qwen.eos_text


def test_text_rows_decode_to_their_text(qwen: Any, tmp_path: Path) -> None:
    rows = [{"text": r["content"]} for r in _jsonl(REPO / "examples" / "pretrain.jsonl")]
    rows += [{"text": t} for t in AWKWARD]
    out = run_rows(tmp_path, {"input": {"type": "text", "append_eod": False}, "preprocessing": NO_DEDUP}, rows)
    _assert_round_trip(qwen, out, [_nfc(r["text"]) for r in rows])
    with_eod = run_rows(tmp_path, {"input": {"type": "text"}, "preprocessing": NO_DEDUP}, rows, name="eod")
    assert [list(ids) for ids, _ in samples(with_eod)] == [list(ids) + [qwen.engine.token_to_id("<|im_end|>")]
                                                           for ids, _ in samples(out)]


def _all_samples(out: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    ds = gpu_prep.open_dataset(out)
    return {name: [(ids.tolist(), mask.tolist()) for ids, mask in ds[name]] for name in ds}


def _run_examples(tmp_path: Path, name: str, output: dict[str, Any], chunk_rows: int = 2048) -> Path:
    config = json.loads((REPO / "configs" / "sft.json").read_text(encoding="utf-8"))
    config["output"].update(output)
    config["preprocessing"]["deduplicate"] = False
    out = tmp_path / name
    run(parse_config(config), [str(REPO / "examples" / "chat.jsonl")], out, Options(chunk_rows=chunk_rows))
    return out


def test_h5_holds_the_same_samples_as_bin(tmp_path: Path) -> None:
    as_bin = _run_examples(tmp_path, "bin", {"storage_format": "bin"})
    as_h5 = _run_examples(tmp_path, "h5", {"storage_format": "h5"})
    assert list((as_h5 / "math").glob("*.h5")) and not list((as_h5 / "math").glob("*.bin"))
    bin_samples = _all_samples(as_bin)
    assert len(bin_samples) > 1 and all(bin_samples.values())
    assert _all_samples(as_h5) == bin_samples


def _bin_shard_arrays(directory: Path, record: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    files = record["files"]
    return tuple(np.fromfile(directory / files[k], dtype="<i8") for k in ("sequence", "loss_mask", "sample_offsets"))


@pytest.mark.parametrize("chunk_rows", [1, 3, 2048])
@pytest.mark.parametrize("storage_format", ["bin", "h5"])
def test_small_shards_keep_samples_whole_and_in_order(tmp_path: Path, storage_format: str, chunk_rows: int) -> None:
    cap = 50
    one = _run_examples(tmp_path, "one", {"domain_key": None, "storage_format": storage_format})
    many = _run_examples(tmp_path, "many", {"domain_key": None, "storage_format": storage_format,
                                             "max_tokens_per_shard": cap}, chunk_rows)
    expected = _all_samples(one)["__default__"]
    assert _all_samples(many)["__default__"] == expected  # same samples, same order, none split
    meta = json.loads((many / "__default__" / "meta.json").read_text(encoding="utf-8"))
    shards = meta["shards"]
    assert len(shards) > 1
    assert sum(s["num_samples"] for s in shards) == meta["num_samples"] == len(expected)
    lengths = [len(ids) for ids, _ in expected]
    first = 0
    for k, shard in enumerate(shards):
        in_shard = lengths[first:first + shard["num_samples"]]
        assert shard["num_samples"] >= 1 and shard["num_tokens"] == sum(in_shard)
        assert shard["num_tokens"] <= cap or shard["num_samples"] == 1  # over cap only for one long sample
        if k + 1 < len(shards):  # a shard is closed only when the next sample would not fit
            assert shard["num_tokens"] + lengths[first + shard["num_samples"]] > cap
        first += shard["num_samples"]


def test_bin_shard_files_hold_exactly_their_samples(tmp_path: Path) -> None:
    many = _run_examples(tmp_path, "many", {"domain_key": None, "max_tokens_per_shard": 50})
    directory = many / "__default__"
    meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
    for shard in meta["shards"]:
        sequence, loss_mask, offsets = _bin_shard_arrays(directory, shard)
        assert offsets[0] == 0 and np.all(np.diff(offsets) > 0)
        assert offsets[-1] == len(sequence) == len(loss_mask) == shard["num_tokens"]
        assert len(offsets) == shard["num_samples"] + 1


def test_each_domain_gets_its_rows_in_input_order(tmp_path: Path) -> None:
    # Interleaved domains across chunks: each domain's samples are exactly the single-domain run's samples
    # of that domain's rows, in the same order.
    domains = ["a", "b", "a", "c", "b", "a", "c", "c", "b", "a", "d"] * 3
    rows = [{"source": d, "messages": [{"role": "user", "content": f"question {i} for {d}"},
                                       {"role": "assistant", "content": f"answer {i}"}]}
            for i, d in enumerate(domains)]
    config = {"mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False}}
    together = samples(run_rows(tmp_path, config, rows, name="together", chunk_rows=4))
    split_out = run_rows(tmp_path, {**config, "output": {"domain_key": "source"}}, rows, name="split", chunk_rows=4)
    for name in sorted(set(domains)):
        expected = [together[i] for i, d in enumerate(domains) if d == name]
        got = samples(split_out, name)
        assert [s[0].tolist() for s in got] == [s[0].tolist() for s in expected]
        assert [s[1].tolist() for s in got] == [s[1].tolist() for s in expected]
