"""output.shuffle: each domain's samples written in a seeded order across the whole run.

The shuffled output is a permutation of the unshuffled one, drawn across chunks (not within each), the same
for the same seed and another for another seed, the same on a cluster; the keys are distinct and the
buckets the second pass holds in memory one at a time stay small. Kill and --resume: tests/e2e/test_crash.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import output_tree, run_rows, sample_bytes

from corpora import sharegpt_chats
from gpu_prep.output.shuffle import BUCKETS, Scatter, sample_keys

BASE = {"tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
        "preprocessing": {"deduplicate": False}, "output": {"domain_key": "source", "max_tokens_per_shard": 150_000}}
CHUNK = 25


def _config(**output: Any) -> dict[str, Any]:
    return {**BASE, "output": {**BASE["output"], "shuffle": True, "shuffle_seed": 4, **output}}


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    return [{**chat, "source": ("code", "chat")[k % 2]} for k, chat in enumerate(sharegpt_chats(400))]



def _shards(out: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every file but the manifest, and the manifest's domains (its inputs name the files, which differ)."""
    tree = output_tree(out)
    return tree, json.loads(tree.pop("manifest.json"))["domains"]


def test_the_output_is_a_seeded_permutation_across_the_whole_run(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    plain = sample_bytes(run_rows(tmp_path, BASE, rows, name="plain", chunk_rows=CHUNK))
    first = run_rows(tmp_path, _config(), rows, name="first", chunk_rows=CHUNK)
    shuffled = sample_bytes(first)
    assert set(shuffled) == set(plain)
    for domain, samples in plain.items():
        order = [samples.index(s) for s in shuffled[domain]]
        assert sorted(order) == list(range(len(samples))) and order != sorted(order)
        # Across chunks: the first chunk's worth of shuffled samples comes from all over the input.
        assert max(order[:CHUNK // 2]) > 3 * CHUNK and min(order[-CHUNK // 2:]) < len(samples) - 3 * CHUNK
    domains = json.loads((first / "manifest.json").read_text())["domains"]
    assert {name: m["num_samples"] for name, m in domains.items()} == {name: len(v) for name, v in shuffled.items()}
    assert not [p for p in first.rglob("*") if "shuffle" in p.name]  # the buckets are gone once it is done
    again = run_rows(tmp_path, _config(), rows, name="again", chunk_rows=2 * CHUNK)  # chunking does not matter
    assert _shards(again) == _shards(first)
    other = sample_bytes(run_rows(tmp_path, _config(shuffle_seed=5), rows, name="other", chunk_rows=CHUNK))
    assert all(other[d] != shuffled[d] and sorted(other[d]) == sorted(shuffled[d]) for d in plain)
    # Each domain has its own order: the same seed does not move equal-sized domains alike.
    chat, code = ([samples.index(s) for s in shuffled[d]] for d, samples in plain.items())
    assert chat[:20] != code[:20]


def test_a_cluster_writes_the_same_shuffled_output(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    pytest.importorskip("distributed")
    one = run_rows(tmp_path, _config(), rows[:300], name="one", chunk_rows=50)
    two = run_rows(tmp_path, _config(), rows[:300], name="two", chunk_rows=50, cluster="local:2", part_bytes=200_000)
    assert _shards(one) == _shards(two)


def test_keys_are_distinct_and_buckets_stay_small(tmp_path: Path) -> None:
    keys = sample_keys(0, 200_000, seed=1, domain="x")
    assert len(np.unique(keys)) == len(keys)
    assert not np.array_equal(keys[:1000], sample_keys(0, 1000, seed=2, domain="x"))
    scatter = Scatter(tmp_path, seed=1, domain="x")
    lengths = np.full(6400, 3)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.arange(offsets[-1], dtype=np.int64)
    for lo in range(0, 6400, 1000):  # appended in several blocks, as chunks come
        part = offsets[lo:min(lo + 1000, 6400) + 1]
        scatter.add(ids[part[0]:part[-1]], (ids[part[0]:part[-1]] % 2).astype(np.int8), part - part[0])
    sizes, seen = [], []
    for got_ids, got_mask, got_offsets, _ in scatter.gather():
        sizes.append(len(got_offsets) - 1)
        assert np.array_equal(got_mask, got_ids % 2)
        seen.extend(int(got_ids[a]) // 3 for a in got_offsets[:-1])
    assert sorted(seen) == list(range(6400)) and len(sizes) == BUCKETS
    assert max(sizes) < 6400 / BUCKETS * 1.5  # one bucket in memory is about 1/64 of the domain
    want = np.argsort(sample_keys(0, 6400, seed=1, domain="x"))
    assert seen == want.tolist()  # ascending key order, bucket after bucket
