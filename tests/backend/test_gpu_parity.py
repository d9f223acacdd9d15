"""The GPU backend writes byte-identical shards to the CPU backend's (run with `pytest -m gpu` on a GPU).

Every case runs the same config over the same input on both backends and compares every shard's sha256
and the run's accounting. Without a GPU these tests skip (tests/conftest.py says why). Where CuPy is installed
without cuDF, `--device gpu` runs the array stages on the GPU and the string steps on the host: these cases
then check the array code on the device, and the cases that exist for a cuDF call skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corpora import sharegpt_chats
from gpu_prep.config import load_config, parse_config
from gpu_prep.pipeline import Options, run
from helpers import REPO, write_jsonl

pytestmark = pytest.mark.gpu

CASES = {
    "sft": ("configs/sft.json", "examples/chat.jsonl"),
    "instruction": ("configs/instruction.json", "examples/instruction.jsonl"),
    "pretrain": ("configs/pretrain.json", "examples/pretrain.jsonl"),
    "sft_packed": ("configs/sft_packed.yaml", "examples/chat.jsonl"),
    "pretrain_wrapped": ("configs/pretrain_wrapped.yaml", "examples/pretrain.jsonl"),
}


def _both(config: Any, inputs: list[str], tmp_path: Path, **options: Any) -> tuple[dict, dict]:
    cpu = run(config, inputs, tmp_path / "cpu", Options(device="cpu", **options))
    gpu = run(config, inputs, tmp_path / "gpu", Options(device="gpu", **options))
    assert gpu["device"] == "gpu"
    return cpu, gpu


def _assert_same(cpu: dict, gpu: dict) -> None:
    assert gpu["totals"] == cpu["totals"]
    assert [f["rows_dropped"] for f in gpu["inputs"]] == [f["rows_dropped"] for f in cpu["inputs"]]
    shards = {name: [s["sha256"] for s in meta["shards"]] for name, meta in cpu["domains"].items()}
    assert {name: [s["sha256"] for s in meta["shards"]] for name, meta in gpu["domains"].items()} == shards


@pytest.mark.parametrize("case", sorted(CASES))
def test_example_configs_match(case: str, tmp_path: Path) -> None:
    config_path, data = CASES[case]
    config = load_config(REPO / config_path)  # JSON or YAML, as the CLI reads it
    _assert_same(*_both(config, [str(REPO / data)], tmp_path))


@pytest.mark.parametrize("storage_format", ["bin", "h5"])
def test_sharegpt_sft_matches_across_chunks_and_shards(storage_format: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", sharegpt_chats(500))
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"},
                           "preprocessing": {"max_seq_len": 1024},
                           "output": {"storage_format": storage_format, "max_tokens_per_shard": 50_000}})
    _assert_same(*_both(config, [str(data)], tmp_path, chunk_rows=97))


def test_wordpiece_text_matches(tmp_path: Path) -> None:
    # GPU WordPiece (nvtext) against HF's BERT tokenizer on the CPU, with truncation that keeps [SEP].
    pytest.importorskip("cudf")
    rows = [{"text": m["content"]} for chat in sharegpt_chats(300) for m in chat["messages"]]
    data = write_jsonl(tmp_path / "text.jsonl", rows)
    config = parse_config({"tokenizer": "bert-uncased", "input": {"type": "text"},
                           "preprocessing": {"max_seq_len": 128, "min_chars": 1}})
    _assert_same(*_both(config, [str(data)], tmp_path, chunk_rows=61))


def test_chat_masks_by_offsets_match(tmp_path: Path) -> None:
    # A tokenizer that is not byte-level BPE: spans are placed on tokens by the offsets HF reports, on the device.
    data = write_jsonl(tmp_path / "chat.jsonl", sharegpt_chats(300))
    config = parse_config({"tokenizer": "bert-uncased", "chat_template": "chatml", "input": {"type": "chat"},
                           "mask": {"assistant": "train"}, "preprocessing": {"max_seq_len": 256}})
    _assert_same(*_both(config, [str(data)], tmp_path, chunk_rows=61))


def test_cudf_reader_matches_the_exact_reader(tmp_path: Path) -> None:
    # cudf.read_json on byte ranges, with the traps of test_columnar_read.py among clean rows.
    pytest.importorskip("cudf")
    from test_columnar_read import _corpus

    config = parse_config({"input": {"type": "text"}, "gpu": {"reader": "cudf"}, "preprocessing": {"min_chars": 10},
                           "output": {"domain_key": "source"}})
    inputs = [str(_corpus(tmp_path)), str(REPO / "examples/pretrain.jsonl")]
    cpu, gpu = _both(config, inputs, tmp_path, rejects=None)
    _assert_same(cpu, gpu)


def test_cudf_reader_reads_chat_rows_as_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default reader (gpu.reader cudf) on chat rows: messages as list<struct<role, content>>, scanned by
    # CuPy, clean rows among traps the checks must send to the strict parser. Ranges cuDF read are counted,
    # so a reader that always failed (and fell back) cannot pass for one that works.
    pytest.importorskip("cudf")
    import gpu_prep.backend as backend
    from test_columnar_read import _chat_corpus

    read_by_cudf: list[int] = []

    def counting(*args: Any) -> Any:
        rows = reading(*args)
        read_by_cudf.append(0 if rows is None else len(rows))
        return rows

    reading = backend.read_json_range
    monkeypatch.setattr(backend, "read_json_range", counting)
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 1}})
    chats = write_jsonl(tmp_path / "chats.jsonl", sharegpt_chats(300))
    cpu, gpu = _both(config, [str(_chat_corpus(tmp_path)), str(chats)], tmp_path, rejects=None)
    _assert_same(cpu, gpu)
    assert sum(read_by_cudf) >= 300, read_by_cudf


def test_cudf_reads_parquet_text_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # cudf.read_parquet decodes the text columns (strings, lists of structs with nulls in them) of each row
    # group, pyarrow the others (numbers, bytes, a dictionary); the same shards and rejects as pyarrow alone.
    # Row groups cuDF read are counted, so a reader that always fell back cannot pass for one that works.
    pytest.importorskip("cudf")
    import gpu_prep.backend as backend
    from test_columnar_read import _mixed_parquet

    read_by_cudf: list[int] = []

    def counting(*args: Any) -> Any:
        table = reading(*args)
        read_by_cudf.append(0 if table is None else table.num_rows)
        return table

    reading = backend.read_parquet_groups
    monkeypatch.setattr(backend, "read_parquet_groups", counting)
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 1}})
    data = _mixed_parquet(tmp_path / "chat.parquet", rows=3000, group_rows=700)
    cpu = run(config, [str(data)], tmp_path / "cpu", Options(device="cpu", rejects=tmp_path / "cpu.jsonl"))
    gpu = run(config, [str(data)], tmp_path / "gpu", Options(device="gpu", rejects=tmp_path / "gpu.jsonl"))
    assert gpu["device"] == "gpu"
    _assert_same(cpu, gpu)
    assert (tmp_path / "cpu.jsonl").read_bytes() == (tmp_path / "gpu.jsonl").read_bytes()
    assert read_by_cudf == [700] * 4 + [200], read_by_cudf


def test_dask_cuda_cluster_matches_the_cpu(tmp_path: Path) -> None:
    # --cluster local with the GPU backend: dask-cuda workers, one per GPU, each reading byte ranges with
    # cuDF and hashing on its GPU; the output is the single CPU process's.
    pytest.importorskip("dask_cuda")
    data = write_jsonl(tmp_path / "chat.jsonl", sharegpt_chats(400) * 2)  # every row twice: dedup across parts
    config = parse_config({"input": {"type": "chat"}, "mask": {"assistant": "train"}, "gpu": {"reader": "cudf"},
                           "preprocessing": {"max_seq_len": 1024}})
    cpu = run(config, [str(data)], tmp_path / "cpu", Options(device="cpu"))
    gpu = run(config, [str(data)], tmp_path / "gpu", Options(device="gpu", cluster="local", part_bytes=1 << 20))
    assert gpu["device"] == "gpu" and gpu["cluster"]["parts"] > 1
    _assert_same(cpu, gpu)


@pytest.mark.parametrize("kind", ["preference", "kto"])
def test_preference_rows_split_and_shuffled_match(kind: str, tmp_path: Path) -> None:
    # Pairs and unpaired rows (the merge probe on the device), split and shuffled: the same bytes on both.
    rows = []
    for k, chat in enumerate(sharegpt_chats(300)):
        messages = chat["messages"]
        if len(messages) > 1 and messages[-1]["role"] == "assistant":
            answer = messages[-1]["content"]
            rows.append({"prompt": messages[:-1], "chosen": messages[-1:], "label": bool(k % 2),
                         "completion": messages[-1:], "rejected": [{"role": "assistant", "content": answer[::-1]}]})
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    config = parse_config({"input": {"type": kind}, "preprocessing": {"max_seq_len": 1024, "max_prompt_length": 512},
                           "output": {"splits": {"train": 0.9, "validation": 0.1}, "shuffle": True,
                                      "max_tokens_per_shard": 100_000}})
    _assert_same(*_both(config, [str(data)], tmp_path, chunk_rows=53))


def test_near_duplicates_match(tmp_path: Path) -> None:
    # The MinHash signatures and band keys computed with CuPy (fuzzy.py over xp) drop and name the same rows.
    answers = [m["content"] for chat in sharegpt_chats(800) for m in chat["messages"] if m["role"] == "assistant"]
    rows = [{"text": t} for t in answers] + [{"text": t.replace(" the ", " a ", 2)} for t in answers[:200]]
    data = write_jsonl(tmp_path / "docs.jsonl", rows)
    config = parse_config({"input": {"type": "text"},
                           "preprocessing": {"deduplicate": False, "min_chars": 0, "fuzzy_dedup": {}}})
    cpu = run(config, [str(data)], tmp_path / "cpu", Options(device="cpu", rejects=tmp_path / "cpu.jsonl"))
    gpu = run(config, [str(data)], tmp_path / "gpu", Options(device="gpu", rejects=tmp_path / "gpu.jsonl"))
    assert gpu["device"] == "gpu" and cpu["totals"]["rows_dropped"]["near_duplicate"] >= 150
    _assert_same(cpu, gpu)
    assert (tmp_path / "cpu.jsonl").read_bytes() == (tmp_path / "gpu.jsonl").read_bytes()
