"""storage_format megatron: Megatron's indexed dataset per shard, data.bin (raw tokens) and data.idx,
with the loss mask beside it in data.loss_mask.bin (one uint8 per token, in the .bin's order).

The layout follows megatron/core/datasets/indexed_dataset.py: one sequence per document (sample).
"""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.output.shards import RawShard, build_files, shard_suffix

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_CODES = {np.dtype(t): code for t, code in (("u1", 1), ("i1", 2), ("<i2", 3), ("<i4", 4), ("<i8", 5),
                                                    ("<f8", 6), ("<f4", 7), ("<u2", 8))}


def megatron_index(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """The .idx of one sequence per document: header (magic, version 1, dtype code, sequence count,
    document count + 1), int32 lengths, int64 byte pointers, int64 document indices 0..S."""
    count = len(lengths)
    pointers = np.zeros(count, dtype="<i8")
    np.cumsum(lengths[:-1] * np.dtype(dtype).itemsize, out=pointers[1:])
    header = MEGATRON_MAGIC + struct.pack("<QBQQ", 1, MEGATRON_CODES[np.dtype(dtype)], count, count + 1)
    return (header + np.asarray(lengths, dtype="<i4").tobytes() + pointers.tobytes()
            + np.arange(count + 1, dtype="<i8").tobytes())


def read_megatron_index(path: Path) -> tuple[np.dtype, np.ndarray]:
    """(token dtype, sample offsets) of a Megatron .idx written with one sequence per document.

    Megatron reads a sequence where its byte pointer says, not where the lengths before it end, and groups
    sequences by the document indices: both are checked against the lengths, so that a file gpu-prep reads
    right is one Megatron reads right too."""
    data = path.read_bytes()
    if not data.startswith(MEGATRON_MAGIC) or len(data) < 34:
        raise ValueError(f"{path} is not a Megatron index")
    version, code, count, documents = struct.unpack_from("<QBQQ", data, len(MEGATRON_MAGIC))
    if version != 1:
        raise ValueError(f"{path}: index version {version}, where Megatron's indexed dataset is version 1")
    dtype = next((t for t, c in MEGATRON_CODES.items() if c == code), None)
    if dtype is None:
        raise ValueError(f"{path}: dtype code {code} is none Megatron writes ({sorted(MEGATRON_CODES.values())})")
    expected = 34 + 12 * count + 8 * documents
    if len(data) != expected:
        raise ValueError(f"{path}: {len(data):,} bytes, where its header ({count:,} sequences, {documents:,} document "
                         f"indices) makes {expected:,}: the file is cut short or damaged")
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=34)
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    pointers = np.frombuffer(data, dtype="<i8", count=count, offset=34 + 4 * count)
    wrong = np.flatnonzero(pointers != offsets[:-1] * dtype.itemsize)
    if len(wrong):
        k = int(wrong[0])
        raise ValueError(f"{path}: sequence {k:,} has byte pointer {int(pointers[k]):,}, where the lengths before "
                         f"it make {int(offsets[k]) * dtype.itemsize:,} (Megatron would read other tokens)")
    document_index = np.frombuffer(data, dtype="<i8", count=documents, offset=34 + 12 * count)
    if documents != count + 1 or not np.array_equal(document_index, np.arange(documents)):
        raise ValueError(f"{path}: its document indices do not run 0, 1, ..., {count:,} (one document per "
                         "sequence, strictly increasing), so Megatron would group its sequences otherwise")
    return dtype, offsets


class MegatronShard(RawShard):
    """The temporaries (tokens already in the .bin's type, the mask as uint8) copied, when the shard is
    complete, into Megatron's .bin and a loss-mask sidecar of one uint8 per token in the .bin's order, and
    the .idx made from the sample offsets."""


    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        stem = f"data{shard_suffix(self.index)}"
        names = {"bin": f"{stem}.bin", "idx": f"{stem}.idx", "loss_mask": f"{stem}.loss_mask.bin"}
        layout = self._layout()
        idx = {"idx": np.frombuffer(megatron_index(layout.lengths, self.storage.token_dtype), np.uint8)}
        parts = ({"bin": ids, "loss_mask": mask} for ids, mask, _, _ in self._blocks(layout))
        return build_files(directory, names, itertools.chain([idx], parts))
