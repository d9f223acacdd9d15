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
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.failpoint import failpoint
from gpu_prep.mask import split_offsets

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


def start_writeback(fd: int) -> None:
    """Have the OS start writing a file's new data to disk now, without waiting for it (Linux does so for
    POSIX_FADV_DONTNEED), so that the fsync when the shard closes has little left to wait for."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def temporary_name(name: str) -> str:
    """What a file is called until it is complete (hidden, and matched by cleanup's ".*.tmp")."""
    return f".{name}.tmp"


def temporary_path(path: Path) -> Path:
    return path.with_name(temporary_name(path.name))


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = temporary_path(path)
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


def raw_file_name(array: str, index: int, temporary: bool) -> str:
    """The name of one array of shard `index` as raw .bin: its final name, or the temporary one."""
    name = f"{array}{_suffix(index)}.bin"
    return temporary_name(name) if temporary else name


ARRAYS = ("sequence", "loss_mask", "sample_offsets")
H5_COPY_ITEMS = 1 << 22  # values copied at a time when a shard is built from its raw temporaries


def _raw_blocks(path: Path) -> Iterator[np.ndarray]:
    """A raw temporary's values in slices, so memory stays bounded whatever the shard."""
    with open(path, "rb") as raw:
        while block := raw.read(H5_COPY_ITEMS * TOKEN_DTYPE.itemsize):
            yield np.frombuffer(block, TOKEN_DTYPE)


class _RawShard:
    """A shard's three arrays appended to temporary raw files. Their lengths are the shard's whole state,
    so a checkpoint can record them and a resumed run can cut the files back to them (resume)."""

    hashes_arrays = True  # the arrays' sha256 go in meta.json (bin); an h5 shard hashes its one file instead

    def __init__(self, directory: Path, index: int, lengths: dict[str, int] | None = None) -> None:
        self.index = index
        self.tmp = {k: directory / raw_file_name(k, index, temporary=True) for k in ARRAYS}
        self.digests = {k: hashlib.sha256() for k in ARRAYS} if self.hashes_arrays else {}
        if lengths is None:
            self.handles = {k: open(p, "wb") for k, p in self.tmp.items()}  # noqa: SIM115  closed in close()
            self._put("sample_offsets", np.zeros(1, TOKEN_DTYPE))
            return
        self.handles = {}
        for k, path in self.tmp.items():
            handle = open(path, "r+b")  # noqa: SIM115  closed in close()
            if os.fstat(handle.fileno()).st_size < lengths[k]:
                handle.close()
                raise ValueError(f"{path} is shorter than the checkpoint says ({lengths[k]} bytes)")
            handle.truncate(lengths[k])
            if self.digests:  # what was written before the checkpoint counts in the digest
                for block in iter(lambda h=handle: h.read(1 << 20), b""):
                    self.digests[k].update(block)
            handle.seek(0, os.SEEK_END)
            self.handles[k] = handle

    def _put(self, key: str, array: np.ndarray) -> None:
        data = memoryview(np.ascontiguousarray(array)).cast("B")
        self.handles[key].write(data)
        if self.digests:
            self.digests[key].update(data)

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, ends: np.ndarray) -> None:
        self._put("sequence", ids.astype(TOKEN_DTYPE, copy=False))
        failpoint("shard_append")  # one array of the shard written, the others not yet
        self._put("loss_mask", loss_mask.astype(MASK_DTYPE, copy=False))
        self._put("sample_offsets", ends.astype(TOKEN_DTYPE, copy=False))
        for handle in self.handles.values():
            handle.flush()
            start_writeback(handle.fileno())

    def lengths(self) -> dict[str, int]:
        """Flush to the OS (enough to survive the process being killed) and say how long each file is."""
        for handle in self.handles.values():
            handle.flush()
        return {k: h.tell() for k, h in self.handles.items()}

    def _close_handles(self) -> None:
        for handle in self.handles.values():
            handle.close()


class _BinShard(_RawShard):
    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        names = {k: raw_file_name(k, self.index, temporary=False) for k in ARRAYS}
        for k in ARRAYS:
            finish_file(self.tmp[k], directory / names[k])
            failpoint("shard_close")  # some of the shard's files renamed, the others not yet
        return {"files": names, "sha256": {k: d.hexdigest() for k, d in self.digests.items()}}


class _H5Shard(_RawShard):
    """The same raw temporary files, turned into one HDF5 file when the shard is complete."""

    hashes_arrays = False

    def close(self, directory: Path) -> dict[str, Any]:
        import h5py

        self._close_handles()
        name = f"data{_suffix(self.index)}.h5"
        path = directory / name
        tmp = temporary_path(path)
        with h5py.File(tmp, "w") as h5:
            h5.attrs["loss_mask_meaning"] = LOSS_MASK_MEANING
            for k in ARRAYS:
                count = self.tmp[k].stat().st_size // TOKEN_DTYPE.itemsize
                dataset = h5.create_dataset(k, shape=(count,), maxshape=(None,), dtype=TOKEN_DTYPE,
                                            chunks=(min(1 << 16, max(count, 1)),))
                start = 0
                for block in _raw_blocks(self.tmp[k]):
                    dataset[start:start + len(block)] = block
                    start += len(block)
        failpoint("shard_close")  # the HDF5 file complete under its temporary name
        finish_file(tmp, path)
        return {"files": {"h5": name}, "sha256": {"h5": sha256_file(path)}}


# Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py): a .bin of raw tokens and an .idx.
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_CODES = {np.dtype(t): code for t, code in (("u1", 1), ("i1", 2), ("<i2", 3), ("<i4", 4), ("<i8", 5),
                                                    ("<f8", 6), ("<f4", 7), ("<u2", 8))}


def megatron_dtype(vocab_size: int) -> np.dtype:
    """The token type Megatron's preprocessing picks for a vocabulary: uint16 below 65500 ids, else int32."""
    return np.dtype("<u2") if vocab_size < 65500 else np.dtype("<i4")


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
    """(token dtype, sample offsets) of a Megatron .idx written with one sequence per document."""
    data = path.read_bytes()
    if not data.startswith(MEGATRON_MAGIC):
        raise ValueError(f"{path} is not a Megatron index")
    version, code, count, _ = struct.unpack_from("<QBQQ", data, len(MEGATRON_MAGIC))
    dtype = next(t for t, c in MEGATRON_CODES.items() if c == code)
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=34)
    return dtype, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


class _MegatronShard(_RawShard):
    """The raw temporary files turned, when the shard is complete, into Megatron's .bin/.idx pair (tokens
    in the vocabulary's type) and a loss-mask sidecar of one uint8 per token in the .bin's order."""

    hashes_arrays = False
    token_dtype = np.dtype("<i4")

    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        stem = f"data{_suffix(self.index)}"
        names = {"bin": f"{stem}.bin", "idx": f"{stem}.idx", "loss_mask": f"{stem}.loss_mask.bin"}
        done = []
        for key, source, dtype in (("bin", "sequence", self.token_dtype), ("loss_mask", "loss_mask", np.dtype("u1"))):
            tmp = temporary_path(directory / names[key])
            with open(tmp, "wb") as out:
                for block in _raw_blocks(self.tmp[source]):
                    out.write(block.astype(dtype).tobytes())
            done.append((tmp, directory / names[key]))
        tmp = temporary_path(directory / names["idx"])
        tmp.write_bytes(megatron_index(np.diff(np.fromfile(self.tmp["sample_offsets"], TOKEN_DTYPE)), self.token_dtype))
        done.append((tmp, directory / names["idx"]))
        failpoint("shard_close")  # the shard complete under temporary names
        for tmp, final in done:
            finish_file(tmp, final)
        return {"files": names, "sha256": {k: sha256_file(directory / n) for k, n in names.items()}}


SHARDS: dict[str, type[_RawShard]] = {"bin": _BinShard, "h5": _H5Shard, "megatron": _MegatronShard}


class DomainWriter:
    """Appends samples of one domain, opening a new shard whenever the current one is full."""

    def __init__(self, directory: Path, name: str, storage_format: str, max_tokens_per_shard: int,
                 token_dtype: np.dtype | None = None) -> None:
        self.directory, self.name = directory, name
        self.storage_format, self.cap = storage_format, max_tokens_per_shard
        self.token_dtype = token_dtype  # megatron: the .bin's token type
        self.shards: list[dict[str, Any]] = []
        self.current: _RawShard | None = None
        # Temporaries of closed shards (h5's raw arrays): removed once a checkpoint no longer needs them.
        self.obsolete: list[Path] = []
        self.fill_tokens = self.fill_samples = self.fill_trained = 0

    def _open(self, lengths: dict[str, int] | None = None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = SHARDS[self.storage_format](self.directory, len(self.shards), lengths)
        if self.token_dtype is not None:
            self.current.token_dtype = self.token_dtype

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this domain: its closed shards and the open one's file lengths."""
        return {"name": self.name, "directory": self.directory.name, "shards": self.shards,
                "fill": [self.fill_tokens, self.fill_samples, self.fill_trained],
                "open": None if self.current is None else self.current.lengths()}

    @classmethod
    def restore(cls, out_dir: Path, state: dict[str, Any], storage_format: str, cap: int,
                token_dtype: np.dtype | None = None) -> DomainWriter:
        writer = cls(out_dir / state["directory"], state["name"], storage_format, cap, token_dtype)
        writer.shards = state["shards"]
        writer.fill_tokens, writer.fill_samples, writer.fill_trained = state["fill"]
        if state["open"] is not None:
            writer._open(state["open"])
        return writer

    def _close_current(self) -> None:
        if self.current is not None:
            record = self.current.close(self.directory)
            self.obsolete.extend(p for p in self.current.tmp.values() if p.exists())
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

    def remove_obsolete(self) -> None:
        for path in self.obsolete:
            path.unlink(missing_ok=True)
        self.obsolete.clear()

    def finish(self) -> dict[str, Any]:
        self._close_current()
        self.remove_obsolete()
        tokens = sum(s["num_tokens"] for s in self.shards)
        meta = {
            "format": "gpu-prep", "format_version": 1, "storage_format": self.storage_format,
            "domain": self.name,
            "sequence": {"shape": [tokens], "dtype": (self.token_dtype or TOKEN_DTYPE).name},
            "loss_mask": {"shape": [tokens], "dtype": "uint8" if self.storage_format == "megatron" else MASK_DTYPE.name,
                          "meaning": LOSS_MASK_MEANING},
            "sample_offsets": {"dtype": TOKEN_DTYPE.name, "meaning": "sample i is tokens [off[i], off[i+1]) of its shard"},
            "num_samples": sum(s["num_samples"] for s in self.shards),
            "num_tokens": tokens,
            "num_trained_tokens": sum(s["num_trained_tokens"] for s in self.shards),
            "shards": self.shards,
        }
        failpoint("meta")
        write_json_atomic(self.directory / "meta.json", meta)
        return meta


class DatasetWriter:
    """One DomainWriter per domain; domain values are made safe and kept distinct as directory names."""

    def __init__(self, out_dir: Path, storage_format: str, max_tokens_per_shard: int,
                 window: int | None = None, token_dtype: np.dtype | None = None) -> None:
        """window: samples longer than this many tokens are cut into samples of that many (and a last one);
        token_dtype: the token type of megatron shards."""
        self.out_dir, self.window, self.token_dtype = out_dir, window, token_dtype
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
        if self.window is not None:
            offsets = split_offsets(np, offsets, self.window)
        if domain not in self.domains:
            self.domains[domain] = DomainWriter(self.out_dir / self._dir_for(domain), domain,
                                                self.storage_format, self.cap, self.token_dtype)
        self.domains[domain].append(ids, loss_mask, offsets)

    def state(self) -> list[dict[str, Any]]:
        return [w.state() for w in self.domains.values()]

    def restore(self, state: list[dict[str, Any]]) -> None:
        for domain in state:
            self.domains[domain["name"]] = DomainWriter.restore(self.out_dir, domain, self.storage_format, self.cap,
                                                                self.token_dtype)
            self.taken[domain["directory"]] = domain["name"]

    def remove_obsolete(self) -> None:
        for writer in self.domains.values():
            writer.remove_obsolete()

    def finish(self) -> dict[str, dict[str, Any]]:
        return {w.directory.name: w.finish() for w in self.domains.values()}
