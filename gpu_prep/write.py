"""write: samples -> per-domain shards, atomically, with meta.json.

Layout of one domain (storage_format "bin"; the v1 seed layout plus sample offsets and shards):

    <out>/<domain>/meta.json
    <out>/<domain>/sequence.bin         token ids, raw little-endian int64
    <out>/<domain>/loss_mask.bin        raw int64, 1 = the token counts in the loss
    <out>/<domain>/sample_offsets.bin   raw int64, samples + 1 entries: sample i is [off[i], off[i+1])

When a domain passes max_tokens_per_shard, further shards are sequence.00001.bin, loss_mask.00001.bin,
sample_offsets.00001.bin, and so on; meta.json lists every shard. A sample is never split across shards.
storage_format "h5" writes data.h5 (data.00001.h5, ...) holding the same three arrays as datasets.
Every file is written under a temporary name, flushed to disk and renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

TOKEN_DTYPE = np.dtype("<i8")
MASK_DTYPE = np.dtype("<i8")
LOSS_MASK_MEANING = "1 = the token counts in the loss, 0 = it does not"
_MAX_NAME = 64
RESERVED_NAMES = {"manifest.json"}  # what a run writes beside its domain directories


def safe_dir_name(name: str) -> str:
    """A directory name for a domain value: no separators, no leading dots, bounded length.

    A name that had to change gets a short hash of the original, so different names stay different.
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:_MAX_NAME]
    if cleaned == name and cleaned and cleaned not in RESERVED_NAMES:
        return cleaned
    return f"{cleaned or 'domain'}-{hashlib.md5(name.encode('utf-8')).hexdigest()[:8]}"


def finish_file(tmp: Path, final: Path) -> None:
    """Make a fully written temporary file durable and give it its final name."""
    with open(tmp, "rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    finish_file(tmp, path)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def shard_cuts(xp: Any, lengths: Any, fill: int, cap: int) -> list[int]:
    """How many of the next samples go to the current shard, then to each new one.

    A shard takes samples while its token count stays within cap; a sample longer than cap gets a shard
    of its own. Works a shard at a time (not a sample at a time) on numpy or cupy.
    """
    cuts: list[int] = []
    running = xp.cumsum(lengths.astype(xp.int64))
    done, base = 0, 0
    while done < len(lengths):
        fits = int(xp.searchsorted(running[done:], base + cap - fill, side="right"))
        if fits == 0 and fill == 0:
            fits = 1
        cuts.append(fits)
        done += fits
        base = int(running[done - 1]) if done else 0
        fill = 0
    return cuts


def _suffix(index: int) -> str:
    return "" if index == 0 else f".{index:05d}"


class _BinShard:
    def __init__(self, directory: Path, index: int) -> None:
        self.names = {k: f"{k}{_suffix(index)}.bin" for k in ("sequence", "loss_mask", "sample_offsets")}
        self.paths = {k: directory / n for k, n in self.names.items()}
        self.tmp = {k: p.with_name(f".{p.name}.tmp") for k, p in self.paths.items()}
        self.handles = {k: open(p, "wb") for k, p in self.tmp.items()}
        self.digests = {k: hashlib.sha256() for k in self.paths}
        self._put("sample_offsets", np.zeros(1, TOKEN_DTYPE))

    def _put(self, key: str, array: np.ndarray) -> None:
        data = array.tobytes()
        self.handles[key].write(data)
        self.digests[key].update(data)

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, ends: np.ndarray) -> None:
        self._put("sequence", ids.astype(TOKEN_DTYPE, copy=False))
        self._put("loss_mask", loss_mask.astype(MASK_DTYPE, copy=False))
        self._put("sample_offsets", ends.astype(TOKEN_DTYPE, copy=False))

    def close(self) -> dict[str, Any]:
        for key, handle in self.handles.items():
            handle.close()
            finish_file(self.tmp[key], self.paths[key])
        return {"files": self.names, "sha256": {k: d.hexdigest() for k, d in self.digests.items()}}


class _H5Shard:
    def __init__(self, directory: Path, index: int) -> None:
        import h5py

        self.name = f"data{_suffix(index)}.h5"
        self.path = directory / self.name
        self.tmp = self.path.with_name(f".{self.name}.tmp")
        self.file = h5py.File(self.tmp, "w")
        for key in ("sequence", "loss_mask", "sample_offsets"):
            self.file.create_dataset(key, shape=(0,), maxshape=(None,), dtype=TOKEN_DTYPE, chunks=(1 << 16,))
        self._put("sample_offsets", np.zeros(1, TOKEN_DTYPE))
        self.file.attrs["loss_mask_meaning"] = LOSS_MASK_MEANING

    def _put(self, key: str, array: np.ndarray) -> None:
        dataset = self.file[key]
        start = dataset.shape[0]
        dataset.resize((start + len(array),))
        dataset[start:] = array

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, ends: np.ndarray) -> None:
        self._put("sequence", ids)
        self._put("loss_mask", loss_mask)
        self._put("sample_offsets", ends)

    def close(self) -> dict[str, Any]:
        self.file.close()
        finish_file(self.tmp, self.path)
        return {"files": {"h5": self.name}, "sha256": {"h5": sha256_file(self.path)}}


class DomainWriter:
    """Appends samples of one domain, opening a new shard whenever the current one is full."""

    def __init__(self, directory: Path, name: str, storage_format: str, max_tokens_per_shard: int) -> None:
        self.directory, self.name = directory, name
        self.storage_format, self.cap = storage_format, max_tokens_per_shard
        self.shards: list[dict[str, Any]] = []
        self.current: _BinShard | _H5Shard | None = None
        self.fill_tokens = self.fill_samples = self.fill_trained = 0

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        kind = _BinShard if self.storage_format == "bin" else _H5Shard
        self.current = kind(self.directory, len(self.shards))

    def _close_current(self) -> None:
        if self.current is not None:
            record = self.current.close()
            record.update(num_samples=self.fill_samples, num_tokens=self.fill_tokens,
                          num_trained_tokens=self.fill_trained)
            self.shards.append(record)
            self.current = None
            self.fill_tokens = self.fill_samples = self.fill_trained = 0

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray) -> None:
        lengths = np.diff(offsets)
        row = 0
        for k, count in enumerate(shard_cuts(np, lengths, self.fill_tokens, self.cap)):
            if k > 0:
                self._close_current()
            if count == 0:
                continue
            if self.current is None:
                self._open()
            lo, hi = int(offsets[row]), int(offsets[row + count])
            ends = self.fill_tokens + (offsets[row + 1:row + count + 1] - lo)
            self.current.append(ids[lo:hi], loss_mask[lo:hi], ends)
            self.fill_tokens += hi - lo
            self.fill_samples += count
            self.fill_trained += int(loss_mask[lo:hi].sum())
            row += count

    def finish(self) -> dict[str, Any]:
        self._close_current()
        tokens = sum(s["num_tokens"] for s in self.shards)
        meta = {
            "format": "gpu-prep", "format_version": 1, "storage_format": self.storage_format,
            "domain": self.name,
            "sequence": {"shape": [tokens], "dtype": TOKEN_DTYPE.name},
            "loss_mask": {"shape": [tokens], "dtype": MASK_DTYPE.name, "meaning": LOSS_MASK_MEANING},
            "sample_offsets": {"dtype": TOKEN_DTYPE.name, "meaning": "sample i is tokens [off[i], off[i+1]) of its shard"},
            "num_samples": sum(s["num_samples"] for s in self.shards),
            "num_tokens": tokens,
            "num_trained_tokens": sum(s["num_trained_tokens"] for s in self.shards),
            "shards": self.shards,
        }
        write_json_atomic(self.directory / "meta.json", meta)
        return meta


class DatasetWriter:
    """One DomainWriter per domain; domain values are made safe and kept distinct as directory names."""

    def __init__(self, out_dir: Path, storage_format: str, max_tokens_per_shard: int) -> None:
        self.out_dir = out_dir
        self.storage_format, self.cap = storage_format, max_tokens_per_shard
        self.domains: dict[str, DomainWriter] = {}
        self.taken: dict[str, str] = {}

    def _dir_for(self, name: str) -> str:
        candidate = base = safe_dir_name(name)
        n = 1
        while self.taken.get(candidate, name) != name:
            n += 1
            candidate = f"{base}-{n}"
        self.taken[candidate] = name
        return candidate

    def append(self, domain: str, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray) -> None:
        if domain not in self.domains:
            self.domains[domain] = DomainWriter(self.out_dir / self._dir_for(domain), domain,
                                                self.storage_format, self.cap)
        self.domains[domain].append(ids, loss_mask, offsets)

    def finish(self) -> dict[str, dict[str, Any]]:
        return {w.directory.name: w.finish() for w in self.domains.values()}
