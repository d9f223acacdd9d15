"""Read a run's output back: sample i of a domain as (ids, loss_mask), memory-mapped (bin) or from HDF5.

    ds = gpu_prep.open_dataset("out/")
    ids, loss_mask = ds["__default__"][0]
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


class _Shard:
    def __init__(self, directory: Path, record: dict[str, Any], storage_format: str, dtype: str, mask_dtype: str):
        files = record["files"]
        if storage_format == "megatron":
            from gpu_prep.write import read_megatron_index

            token_dtype, self.offsets = read_megatron_index(directory / files["idx"])
            self.sequence = _memmap(directory / files["bin"], token_dtype)
            self.loss_mask = _memmap(directory / files["loss_mask"], np.dtype("u1"))
        elif storage_format == "bin":
            self.sequence = np.memmap(directory / files["sequence"], dtype=dtype, mode="r")
            self.loss_mask = np.memmap(directory / files["loss_mask"], dtype=mask_dtype, mode="r")
            self.offsets = np.fromfile(directory / files["sample_offsets"], dtype="<i8")
        else:
            import h5py

            handle = h5py.File(directory / files["h5"], "r")
            self.sequence, self.loss_mask = handle["sequence"], handle["loss_mask"]
            self.offsets = handle["sample_offsets"][:]
        self.num_samples = len(self.offsets) - 1

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.sequence[lo:hi]), np.asarray(self.loss_mask[lo:hi])


class Domain:
    """The samples of one domain directory, across its shards."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.meta = json.loads((self.directory / "meta.json").read_text(encoding="utf-8"))
        fmt = self.meta["storage_format"]
        dtype, mask_dtype = self.meta["sequence"]["dtype"], self.meta["loss_mask"]["dtype"]
        self.shards = [_Shard(self.directory, rec, fmt, dtype, mask_dtype) for rec in self.meta["shards"]]
        self._starts = np.cumsum([0] + [s.num_samples for s in self.shards])

    @property
    def name(self) -> str:
        return self.meta["domain"]

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        i %= len(self)
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self.shards[shard].sample(i - int(self._starts[shard]))

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(len(self)):
            yield self[i]


class Dataset:
    """All domains of a run's output directory, by directory name."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self.domains = {p.parent.name: Domain(p.parent) for p in sorted(self.out_dir.glob("*/meta.json"))}

    def __getitem__(self, name: str) -> Domain:
        return self.domains[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.domains)

    def __len__(self) -> int:
        return len(self.domains)


def open_dataset(out_dir: str | Path) -> Dataset:
    return Dataset(out_dir)
