"""Every storage format and packing holds the same samples, read back through gpu_prep.open.

One corpus (chat rows over two domains, long enough for several shards) is run once per output setting;
each output must give the unpacked run's ids and masks, pass `verify`, and report the same totals. Packed
output must hold every sample whole (bfd) or in order (wrapped), never exceed max_seq_len, and restart
position ids at every sample.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu_prep
from gpu_prep.config import load_config, parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.output.pack import best_fit_decreasing
from gpu_prep.pipeline import Options, run
from gpu_prep.commands.stats import summarize
from gpu_prep.output.verify import verify
from helpers import REPO, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

SEQ_LEN = 160
BASE = {"chat_template": "chatml", "input": {"type": "chat"}, "mask": {"assistant": "train"},
        "preprocessing": {"min_chars": 0, "max_seq_len": SEQ_LEN},
        "output": {"domain_key": "source", "max_tokens_per_shard": 1500}}
SETTINGS = {
    "bin": {},
    "bin-narrow": {"output": {"token_dtype": "uint32", "loss_mask_dtype": "uint8"}},
    "h5": {"output": {"storage_format": "h5", "token_dtype": "auto"}},
    "megatron": {"output": {"storage_format": "megatron"}},
    "parquet": {"output": {"storage_format": "parquet", "token_dtype": "int32"}},
    "bin-bfd": {"preprocessing": {"packing": "bfd"}},
    "h5-bfd": {"output": {"storage_format": "h5"}, "preprocessing": {"packing": "bfd"}},
    "parquet-bfd": {"output": {"storage_format": "parquet"}, "preprocessing": {"packing": "bfd"}},
    "bin-wrapped": {"preprocessing": {"packing": "wrapped"}},
    "parquet-wrapped": {"output": {"storage_format": "parquet"}, "preprocessing": {"packing": "wrapped"}},
}


def _config(name: str) -> dict[str, Any]:
    over = SETTINGS[name]
    return {**BASE, **{k: {**BASE[k], **v} for k, v in over.items()}}


def _rows() -> list[dict[str, Any]]:
    rows = []
    for i in range(120):
        words = " ".join(f"w{(i * 11 + k) % 89}" for k in range(3 + (i * 7) % 45))
        rows.append({"source": "a" if i % 3 else "b",
                     "messages": [{"role": "user", "content": f"q{i} {words}"},
                                  {"role": "assistant", "content": f"r{i} {words}"}]})
    return rows


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("formats")
    data = write_jsonl(root / "chat.jsonl", _rows())
    done = {}
    for name in SETTINGS:
        run(parse_config(_config(name)), [str(data)], root / name, Options(chunk_rows=32))
        done[name] = root / name
    return done


def _domains(out: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    dataset = gpu_prep.open(out)
    return {name: [(ids.tolist(), mask.tolist()) for ids, mask in dataset[name].samples()] for name in dataset}


@pytest.mark.parametrize("name", [n for n in SETTINGS if "-bfd" not in n and "-wrapped" not in n])
def test_every_format_holds_the_same_samples(outputs: dict[str, Path], name: str) -> None:
    want = _domains(outputs["bin"])
    assert sum(len(v) for v in want.values()) == 120
    assert _domains(outputs[name]) == want
    assert verify(outputs[name]) == []
    manifest = json.loads((outputs[name] / "manifest.json").read_text())
    totals = gpu_prep.open(outputs[name]).totals()
    assert totals["num_tokens"] == manifest["totals"]["tokens"]
    assert totals["num_trained_tokens"] == manifest["totals"]["trained_tokens"]
    assert totals["num_samples"] == manifest["totals"]["rows_written"] == 120
    shards = [s for m in manifest["domains"].values() for s in m["shards"]]
    assert len(shards) > 2


def test_the_token_and_mask_types_are_the_ones_asked_for(outputs: dict[str, Path]) -> None:
    meta = json.loads((outputs["bin-narrow"] / "a" / "meta.json").read_text())
    assert (meta["sequence"]["dtype"], meta["loss_mask"]["dtype"]) == ("uint32", "uint8")
    shard = meta["shards"][0]
    assert (outputs["bin-narrow"] / "a" / shard["files"]["sequence"]).stat().st_size == 4 * shard["num_tokens"]
    assert (outputs["bin-narrow"] / "a" / shard["files"]["loss_mask"]).stat().st_size == shard["num_tokens"]
    wide = json.loads((outputs["bin"] / "a" / "meta.json").read_text())
    assert (wide["sequence"]["dtype"], wide["loss_mask"]["dtype"]) == ("int64", "int64")  # the seed's default
    auto = json.loads((outputs["h5"] / "a" / "meta.json").read_text())
    assert auto["sequence"]["dtype"] == "int32"  # Qwen's 151k ids do not fit uint16


@pytest.mark.parametrize(("setting", "rule"), [
    ({"output": {"token_dtype": "uint16"}}, "output.token_dtype uint16 cannot hold"),
    ({"output": {"storage_format": "megatron", "token_dtype": "uint32"}}, "no uint32"),
    ({"output": {"storage_format": "parquet", "loss_mask_dtype": "uint8"}}, "loss_mask_dtype applies to bin and h5"),
    ({"output": {"storage_format": "megatron"}, "preprocessing": {"packing": "bfd"}}, "preprocessing.packing"),
])
def test_settings_that_cannot_work_are_refused(tmp_path: Path, setting: dict[str, Any], rule: str) -> None:
    data = write_jsonl(tmp_path / "x.jsonl", _rows()[:3])
    with pytest.raises(ConfigError, match=rule):
        run(parse_config({**BASE, **{k: {**BASE[k], **v} for k, v in setting.items()}}), [str(data)], tmp_path / "o")


@pytest.mark.parametrize("name", ["bin-bfd", "h5-bfd", "parquet-bfd"])
def test_bfd_keeps_every_sample_whole_within_max_seq_len(outputs: dict[str, Path], name: str) -> None:
    dataset = gpu_prep.open(outputs[name])
    unpacked = _domains(outputs["bin"])
    for domain in dataset:
        packed = dataset[domain]
        lengths = [len(packed[i][0]) for i in range(len(packed))]
        assert max(lengths) <= SEQ_LEN and len(packed) < len(unpacked[domain])
        # the same samples, each one whole (a sample is a segment, never two)
        got = Counter((tuple(i), tuple(m)) for i, m in map(lambda s: (s[0], s[1]), _domains(outputs[name])[domain]))
        assert got == Counter((tuple(i), tuple(m)) for i, m in unpacked[domain])
        for i in range(len(packed)):
            bounds = packed.segments(i)
            positions = packed.position_ids(i)
            assert positions.tolist() == [p for a, b in zip(bounds[:-1], bounds[1:]) for p in range(b - a)]
        meta = packed.meta["packing"]
        assert meta["padding_tokens"] == len(packed) * SEQ_LEN - packed.meta["num_tokens"]
        assert summarize(outputs[name])["domains"][domain]["padding"] == pytest.approx(meta["padding_share"], abs=1e-6)
    assert verify(outputs[name]) == []


def test_packed_formats_agree_sequence_by_sequence(outputs: dict[str, Path]) -> None:
    def sequences(name: str) -> dict[str, list[Any]]:
        dataset = gpu_prep.open(outputs[name])
        return {d: [(ids.tolist(), mask.tolist(), dataset[d].segments(i).tolist()) for i, (ids, mask) in
                    enumerate(dataset[d])] for d in dataset}
    assert sequences("bin-bfd") == sequences("h5-bfd") == sequences("parquet-bfd")
    assert sequences("bin-wrapped") == sequences("parquet-wrapped")


def test_wrapped_fills_every_sequence_and_keeps_the_order(outputs: dict[str, Path]) -> None:
    dataset, plain = gpu_prep.open(outputs["bin-wrapped"]), gpu_prep.open(outputs["bin"])
    for domain in dataset:
        packed = dataset[domain]
        for shard_start, shard_end in _shard_ranges(packed):
            lengths = [len(packed[i][0]) for i in range(shard_start, shard_end)]
            assert all(n == SEQ_LEN for n in lengths[:-1]) and 0 < lengths[-1] <= SEQ_LEN
        joined = np.concatenate([ids for ids, _ in packed])
        assert joined.tolist() == np.concatenate([ids for ids, _ in plain[domain]]).tolist()
        masks = np.concatenate([mask for _, mask in packed])
        assert masks.tolist() == np.concatenate([mask for _, mask in plain[domain]]).tolist()
    cut = [s for d in dataset for s in range(len(dataset[d])) if len(dataset[d].segments(s)) > 2]
    assert cut  # samples were split across sequences, as wrapped asks


def _shard_ranges(domain: Any) -> list[tuple[int, int]]:
    counts = np.cumsum([0] + [len(domain.shard(k).offsets) - 1 for k in range(domain.num_shards)])
    return list(zip(counts[:-1].tolist(), counts[1:].tolist()))


def test_parquet_loads_with_datasets_as_a_pretokenized_dataset(outputs: dict[str, Path]) -> None:
    datasets = pytest.importorskip("datasets")
    for name in ("parquet", "parquet-bfd"):
        ours = gpu_prep.open(outputs[name])
        files = [str(ours[d].directory / s["files"]["parquet"]) for d in sorted(ours) for s in ours[d].meta["shards"]]
        loaded = datasets.load_dataset("parquet", data_files=files, split="train")
        want = [seq for d in sorted(ours) for seq in ours[d]]
        assert loaded.num_rows == len(want)
        for row, (ids, mask) in zip(loaded, want):
            assert row["input_ids"] == ids.tolist()
            assert row["attention_mask"] == [1] * len(ids) if name == "parquet" else "attention_mask" not in row
            assert row["labels"] == np.where(mask == 1, ids, -100).tolist()
        assert ("position_ids" in loaded.column_names) == name.endswith("bfd")


def test_a_trainers_default_collator_hands_packed_rows_on_with_their_boundaries(outputs: dict[str, Path]) -> None:
    # transformers' Trainer passes every column its default collator makes: with an all-ones attention_mask
    # the samples packed in a row attended to each other; without one, the model finds them in position_ids.
    datasets = pytest.importorskip("datasets")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    ours = gpu_prep.open(outputs["parquet-bfd"])
    files = [str(ours[d].directory / s["files"]["parquet"]) for d in sorted(ours) for s in ours[d].meta["shards"]]
    row = datasets.load_dataset("parquet", data_files=files, split="train")[0]
    batch = transformers.default_data_collator([{k: v for k, v in row.items() if k != "seq_lengths"}])
    assert "attention_mask" not in batch and int((batch["position_ids"] == 0).sum()) == len(row["seq_lengths"])


def test_packing_does_not_depend_on_chunking(outputs: dict[str, Path], tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", _rows())
    run(parse_config(_config("parquet-bfd")), [str(data)], tmp_path / "out", Options(chunk_rows=7))
    for path in sorted(outputs["parquet-bfd"].glob("*/data*.parquet")):
        other = tmp_path / "out" / path.relative_to(outputs["parquet-bfd"])
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(other.read_bytes()).digest()


def _naive_bfd(lengths: list[int], capacity: int) -> list[int]:
    """Best-fit-decreasing the slow way: the room left in each bin, searched in full for every item."""
    rooms: list[int] = []
    for size in sorted(lengths, reverse=True):
        fits = [k for k, room in enumerate(rooms) if room >= size]
        if fits:
            best = min(fits, key=lambda k: rooms[k])
            rooms[best] -= size
        else:
            rooms.append(capacity - size)
    return sorted(rooms)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 64).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.integers(1, cap), max_size=80))))
def test_best_fit_decreasing_matches_the_plain_algorithm(case: tuple[int, list[int]]) -> None:
    capacity, lengths = case
    order, bins = best_fit_decreasing(np.array(lengths, dtype=np.int64), capacity)
    assert sorted(order.tolist()) == list(range(len(lengths)))  # every item exactly once
    fills = [int(np.array(lengths, dtype=np.int64)[order[a:b]].sum()) for a, b in zip(bins[:-1], bins[1:])]
    assert all(0 < f <= capacity for f in fills)
    assert sorted(capacity - f for f in fills) == _naive_bfd(lengths, capacity)  # the same bins, as full


def test_a_sample_longer_than_a_bin_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        best_fit_decreasing(np.array([3, 9]), 8)


@pytest.mark.parametrize(("config", "example"), [("sft_packed.yaml", "chat.jsonl"), ("pretrain_megatron.yaml", "pretrain.jsonl"),
                                                 ("pretrain_wrapped.yaml", "pretrain.jsonl")])
def test_the_shipped_output_configs_run_on_their_examples(tmp_path: Path, config: str, example: str) -> None:
    manifest = run(load_config(REPO / "configs" / config), [str(REPO / "examples" / example)], tmp_path / "out")
    assert manifest["totals"]["rows_written"] > 0 and verify(tmp_path / "out") == []
    assert ("packing" in manifest) == (config != "pretrain_megatron.yaml")


def test_a_packed_parquet_row_is_what_transformers_flattening_collator_makes(outputs: dict[str, Path]) -> None:
    """transformers' DataCollatorWithFlattening, given the unpacked parquet rows of the samples in one
    packed row, builds that row: the same input_ids and position_ids, and the same labels but for the
    first of each sample, which the collator sets to -100 so that no sample is predicted from another."""
    datasets = pytest.importorskip("datasets")
    from transformers import DataCollatorWithFlattening

    def rows(name: str, domain: str) -> list[dict[str, list[int]]]:
        directory = outputs[name] / domain
        meta = json.loads((directory / "meta.json").read_text())
        files = [str(directory / s["files"]["parquet"]) for s in meta["shards"]]
        return list(datasets.load_dataset("parquet", data_files=files, split="train"))

    unpacked = {tuple(r["input_ids"]): r for r in rows("parquet", "a")}
    collate = DataCollatorWithFlattening(return_tensors="np", return_position_ids=True)
    packed_rows = rows("parquet-bfd", "a")
    checked = 0
    for packed in packed_rows:
        starts = [k for k, p in enumerate(packed["position_ids"]) if p == 0] + [len(packed["input_ids"])]
        members = [unpacked[tuple(packed["input_ids"][a:b])] for a, b in zip(starts[:-1], starts[1:])]
        made = collate([{"input_ids": m["input_ids"], "labels": m["labels"]} for m in members])
        assert made["input_ids"][0].tolist() == packed["input_ids"]
        assert made["position_ids"][0].tolist() == packed["position_ids"]
        want = [-100 if k in starts else label for k, label in enumerate(packed["labels"])]
        assert made["labels"][0].tolist() == want
        checked += len(members) > 1
    assert checked  # rows that really hold several samples were compared
