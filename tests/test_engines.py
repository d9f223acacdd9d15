"""Tokenizer engines: tiktoken is used only where it equals HF on the run's own input, and output is the
same bytes whichever engine ran."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import run_rows

from corpora import sharegpt_chats
from gpu_prep.bundled import bundled_tokenizer_dir
from gpu_prep.engines import tiktoken_problem
from gpu_prep.errors import ConfigError
from gpu_prep.tokenizer import load_tokenizer


def _shard_hashes(manifest_dir: Path) -> dict:
    manifest = json.loads((manifest_dir / "manifest.json").read_text())
    return {name: [s["sha256"] for s in meta["shards"]] for name, meta in manifest["domains"].items()}


def _engine(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["tokenizer"]


@pytest.mark.parametrize("input_type", ["chat", "text"])
def test_tiktoken_and_hf_write_identical_shards(tmp_path: Path, input_type: str) -> None:
    chats = sharegpt_chats(150)
    rows = chats if input_type == "chat" else [{"text": m["content"]} for c in chats for m in c["messages"]]
    outs = {}
    for engine in ("hf", "tiktoken", "auto"):
        config = {"tokenizer": {"name": "qwen2.5", "engine": engine}, "input": {"type": input_type},
                  "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False, "min_chars": 1}}
        outs[engine] = run_rows(tmp_path, config, rows, name=engine, chunk_rows=64)
    assert _engine(outs["hf"])["engine"] == "hf"
    assert _engine(outs["tiktoken"])["engine"] == "tiktoken"
    assert _engine(outs["auto"])["engine"] == "tiktoken"
    assert "identical to HF" in _engine(outs["auto"])["engine_choice"]
    assert _shard_hashes(outs["hf"]) == _shard_hashes(outs["tiktoken"]) == _shard_hashes(outs["auto"])


def test_a_vocabulary_whose_ids_are_not_in_merge_order_falls_back_to_hf(tmp_path: Path) -> None:
    # Same vocabulary, merges applied in reverse priority: valid BPE for HF, but tiktoken ranks merges by id,
    # so the two disagree on ordinary words and the run must notice and use HF.
    source = bundled_tokenizer_dir("qwen2.5")
    target = tmp_path / "reordered"
    target.mkdir()
    shutil.copy(source / "tokenizer_config.json", target)
    spec = json.loads((source / "tokenizer.json").read_text())
    spec["model"]["merges"].reverse()
    spec["model"]["ignore_merges"] = False  # otherwise words found whole in the vocabulary skip the merges
    (target / "tokenizer.json").write_text(json.dumps(spec))
    rows = [{"text": "Antidisestablishmentarianism, floccinaucinihilipilification and xqzvbnmlkjh."}]
    config = {"tokenizer": {"name": str(target), "engine": "tiktoken"}, "input": {"type": "text"},
              "preprocessing": {"min_chars": 1}}
    out = run_rows(tmp_path, config, rows, name="fallback")
    identity = _engine(out)
    assert identity["engine"] == "hf"
    assert "differs from HF" in identity["engine_choice"]
    hf_config = {**config, "tokenizer": {"name": str(target), "engine": "hf"}}
    assert _shard_hashes(out) == _shard_hashes(run_rows(tmp_path, hf_config, rows, name="hf"))


def test_wordpiece_is_not_a_tiktoken_vocabulary() -> None:
    try:
        tok = load_tokenizer("bert-uncased")
    except ConfigError as exc:
        pytest.skip(str(exc))
    assert "WordPiece" in tiktoken_problem(tok.spec)
    ids, counts = tok.use_engine("auto", ["hello"], sample_size=1)
    assert tok.engine_choice.startswith("hf: tiktoken cannot run")
    assert ids.tolist() == tok.engine.encode("hello", add_special_tokens=False).ids and counts.tolist() == [len(ids)]


def test_output_does_not_depend_on_workers_or_chunk_size(tmp_path: Path) -> None:
    rows = sharegpt_chats(120)
    config = {"tokenizer": {"name": "qwen2.5", "engine": "tiktoken"}, "mask": {"assistant": "train"},
              "preprocessing": {"max_seq_len": 512}, "output": {"max_tokens_per_shard": 20_000}}
    hashes = [
        _shard_hashes(run_rows(tmp_path, config, rows, name=f"w{workers}-c{chunk}", workers=workers, chunk_rows=chunk))
        for workers, chunk in [(1, 2048), (2, 7), (1, 1), (2, 64)]
    ]
    assert all(h == hashes[0] for h in hashes[1:])
    assert sum(len(v) for v in hashes[0].values()) > 1  # several shards, so shard cuts are compared too
