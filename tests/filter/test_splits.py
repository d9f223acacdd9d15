"""output.splits: every row goes to one split by a hash of its own text and split_seed.

The shares come out within sampling tolerance; the splits together hold exactly the unsplit output, each in
input order; a row keeps its split when rows are appended or the input is reordered, and equal rows share
one; a cluster writes the same bytes; a bad config is refused naming the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import output_tree, run_rows, sample_bytes

import gpu_prep
from corpora import sharegpt_chats
from gpu_prep.config import parse_config
from gpu_prep.errors import ConfigError
from gpu_prep.filter.splits import split_codes

BASE = {"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
        "preprocessing": {"deduplicate": False}, "output": {"domain_key": "source"}}
SPLITS = {"train": 0.8, "validation": 0.2}


def _config(**output: Any) -> dict[str, Any]:
    return {**BASE, "output": {**BASE["output"], "splits": SPLITS, "split_seed": 11, **output}}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return [{**chat, "source": ("code", "chat")[k % 2]} for k, chat in enumerate(sharegpt_chats(600))]



def _by_split(out: Path) -> dict[str, set[bytes]]:
    found: dict[str, set[bytes]] = {}
    for name, items in sample_bytes(out).items():
        found.setdefault(name.split("/")[0], set()).update(items)
    return found


def test_shares_land_within_tolerance_and_are_counted(tmp_path: Path) -> None:
    texts = [f"row {k}: some text" for k in range(20_000)]
    codes = split_codes(texts, SPLITS, 11)
    assert abs((codes == 1).mean() - 0.2) < 0.015  # binomial sd 0.003
    assert not np.array_equal(codes, split_codes(texts, SPLITS, 12))  # the seed matters
    assert np.array_equal(codes, split_codes(list(reversed(texts)), SPLITS, 11)[::-1])  # order does not


def test_the_splits_together_are_the_unsplit_output_in_input_order(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    whole = sample_bytes(run_rows(tmp_path, BASE, rows, name="whole", chunk_rows=64))
    out = run_rows(tmp_path, _config(), rows, name="split", chunk_rows=64)
    parts = sample_bytes(out)
    assert set(parts) == {f"{s}/{d}" for s in SPLITS for d in ("code", "chat")}
    manifest = json.loads((out / "manifest.json").read_text())
    totals = manifest["totals"]
    assert sum(t["rows_written"] for t in totals["splits"].values()) == totals["rows_written"] > 0.9 * len(rows)
    assert 0.1 < totals["splits"]["validation"]["rows_written"] / totals["rows_written"] < 0.3
    for domain, samples in whole.items():
        train, validation = parts[f"train/{domain}"], parts[f"validation/{domain}"]
        assert sorted(train + validation) == sorted(samples)
        for part in (train, validation):  # each split keeps input order: a subsequence of the whole
            it = iter(samples)
            assert all(any(s == t for t in it) for s in part)
    meta = gpu_prep.open_dataset(out)["validation/chat"].meta
    assert meta["split"] == "validation" and meta["domain"] == "chat"
    assert totals["splits"]["validation"]["num_samples"] == sum(len(v) for k, v in parts.items() if k.startswith("validation/"))


def test_a_row_keeps_its_split_when_rows_are_appended_or_reordered(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    first = _by_split(run_rows(tmp_path, _config(), rows[:400], name="first"))
    grown = _by_split(run_rows(tmp_path, _config(), rows, name="grown"))
    shuffled = list(reversed(rows))
    reordered = _by_split(run_rows(tmp_path, _config(), shuffled, name="reordered"))
    for split in SPLITS:
        assert first[split] <= grown[split]
        assert reordered[split] == grown[split]
    other_seed = _by_split(run_rows(tmp_path, _config(split_seed=12), rows[:400], name="seed12"))
    assert other_seed["validation"] != first["validation"]


def test_equal_rows_share_a_split(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    copies = rows[:50] * 3
    out = run_rows(tmp_path, _config(), copies, name="copies")
    found = _by_split(out)
    assert not found["train"] & found["validation"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(len(v) for v in sample_bytes(out).values()) == manifest["totals"]["rows_written"] > 100


def test_a_cluster_writes_the_same_split_output(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    pytest.importorskip("distributed")
    one = run_rows(tmp_path, _config(), rows[:300], name="one", chunk_rows=50)
    two = run_rows(tmp_path, _config(), rows[:300], name="two", chunk_rows=50, cluster="local:2", part_bytes=200_000)
    trees = [output_tree(out) for out in (one, two)]
    manifests = [json.loads(tree.pop("manifest.json")) for tree in trees]
    assert trees[0] == trees[1] and any(name.startswith("validation/") for name in trees[0])
    for key in ("totals", "domains"):  # the manifest says where it ran besides
        assert manifests[0][key] == manifests[1][key]


@pytest.mark.parametrize("splits, says", [
    ({"train": 0.9, "validation": 0.2}, "sum to 1"),
    ({"train": 1.0, "validation": 0.0}, "above 0"),
    ({"train/x": 0.5, "validation": 0.5}, "cannot name a split folder"),
    ({"tokenizer": 0.5, "validation": 0.5}, "cannot name a split folder"),
    ({}, "at least one split"),
])
def test_bad_splits_are_refused_naming_the_key(splits: dict[str, float], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        parse_config({**BASE, "output": {"splits": splits}})
    assert "splits" in str(err.value)
