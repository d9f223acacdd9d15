"""One shard of each one-file storage format built straight from its class (output/h5.py, output/parquet.py):
what the file holds, as h5py and pyarrow read it, for packed and unpacked shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_prep.output.h5 import H5Shard
from gpu_prep.output.parquet import IGNORE_INDEX, ParquetShard
from gpu_prep.output.shards import Storage

IDS = np.array([5, 6, 7, 8, 9, 10], dtype=np.int64)
MASK = np.array([0, 1, 1, 0, 0, 1], dtype=np.int8)
ENDS = np.array([3, 5, 6], dtype=np.int64)  # samples [0, 3), [3, 5), [5, 6)


def _close(cls: type, tmp_path: Path, packing: str) -> dict:
    storage = Storage(cls.extension, np.dtype("<i4"), np.dtype("u1"), packing, seq_len=4)
    shard = cls(tmp_path, 0, storage)
    shard.append(IDS, MASK, ENDS)
    return shard.close(tmp_path)


@pytest.mark.parametrize("packing", ["none", "bfd"])
def test_h5_shard_holds_the_arrays(tmp_path: Path, packing: str) -> None:
    import h5py

    record = _close(H5Shard, tmp_path, packing)
    with h5py.File(tmp_path / record["files"]["h5"]) as h5:
        offsets = h5["sample_offsets"][:]
        sequences = [h5["sequence"][a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
        assert h5["sequence"].dtype == np.dtype("<i4") and h5.attrs["loss_mask_meaning"].startswith("1 = ")
        assert sorted(x for s in sequences for x in s) == IDS.tolist()
        if packing == "none":
            assert sequences == [[5, 6, 7], [8, 9], [10]] and "segment_offsets" not in h5
        else:  # best fit decreasing into sequences of 4: [5 6 7 | 10] and [8 9]
            assert sequences == [[5, 6, 7, 10], [8, 9]] and h5["segment_offsets"][:].tolist() == [0, 3, 4, 6]
            assert record["num_segments"] == 3 and record["num_samples"] == 2


@pytest.mark.parametrize("packing", ["none", "bfd"])
def test_parquet_shard_rows_are_what_trainers_read(tmp_path: Path, packing: str) -> None:
    import pyarrow.parquet as pq

    record = _close(ParquetShard, tmp_path, packing)
    rows = pq.read_table(tmp_path / record["files"]["parquet"]).to_pylist()
    for row in rows:
        # Packed rows carry none: a trainer's default collator would hand it on and the samples of a row
        # would attend to each other; without one, transformers finds their boundaries in position_ids.
        assert row["attention_mask"] == [1] * len(row["input_ids"]) if packing == "none" else "attention_mask" not in row
        assert all(label in (token, IGNORE_INDEX) for label, token in zip(row["labels"], row["input_ids"]))
    labels = [label for row in rows for label in row["labels"]]
    assert sorted(x for x in labels if x != IGNORE_INDEX) == [6, 7, 10]
    if packing == "bfd":
        assert [row["position_ids"] for row in rows] == [[0, 1, 2, 0], [0, 1]]
    else:
        assert "position_ids" not in rows[0] and [r["input_ids"] for r in rows] == [[5, 6, 7], [8, 9], [10]]
