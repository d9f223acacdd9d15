"""write: samples -> per-domain shards, atomically, with meta.json.

Layout of one domain (storage_format "bin"; the v1 seed layout plus sample offsets and shards):

    <out>/<domain>/meta.json
    <out>/<domain>/sequence.bin         token ids, raw little-endian int64
    <out>/<domain>/loss_mask.bin        raw int64, 1 = the token counts in the loss
    <out>/<domain>/sample_offsets.bin   raw int64, samples + 1 entries: sample i is [off[i], off[i+1])

When a domain passes max_tokens_per_shard, further shards are sequence.00001.bin, loss_mask.00001.bin,
sample_offsets.00001.bin, and so on; meta.json lists every shard. A sample is never split across shards.
output.token_dtype and output.loss_mask_dtype narrow the two arrays (meta.json names their types).
Packed shards (preprocessing.packing) add segment_offsets.bin: the samples' own boundaries inside the
packed sequences that sample_offsets delimits.

storage_format "h5" writes data.h5 (data.00001.h5, ...) holding the same arrays as datasets; "megatron"
Megatron's data.bin/data.idx with a data.loss_mask.bin sidecar; "parquet" data.parquet, a row per sample.
Every file is written under a temporary name, flushed to disk and renamed when complete.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep import pack
from gpu_prep.errors import ConfigError
from gpu_prep.failpoint import failpoint
from gpu_prep.mask import split_offsets
from gpu_prep.pack import Layout

TOKEN_DTYPE = np.dtype("<i8")
MASK_DTYPE = np.dtype("<i8")
OFFSET_DTYPE = np.dtype("<i8")
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
COPY_ITEMS = 1 << 22  # tokens handled at a time when a shard's final files are built from its temporaries
IGNORE_INDEX = -100  # parquet labels of tokens outside the loss


@dataclass(frozen=True)
class Storage:
    """How a run's shards are stored: the format, the arrays' types and the packing."""

    format: str = "bin"
    token_dtype: np.dtype = TOKEN_DTYPE
    mask_dtype: np.dtype = MASK_DTYPE
    packing: str = "none"
    seq_len: int | None = None  # the length packed sequences are filled to

    @classmethod
    def from_config(cls, config: Any, vocab_size: int) -> Storage:
        out = config.output
        token = np.dtype(out.token_type(vocab_size)).newbyteorder("<")
        if vocab_size - 1 > np.iinfo(token).max:
            raise ConfigError(f"output.token_dtype {token.name} cannot hold the vocabulary's ids (0 to {vocab_size - 1})")
        # megatron and parquet keep the mask as one byte a token (the sidecar; labels are made from it)
        mask = np.dtype("u1") if out.storage_format in ("megatron", "parquet") else np.dtype(out.loss_mask_dtype).newbyteorder("<")
        return cls(out.storage_format, token, mask, config.preprocessing.packing, config.preprocessing.max_seq_len)

    def dtype(self, array: str) -> np.dtype:
        return {"sequence": self.token_dtype, "loss_mask": self.mask_dtype}.get(array, OFFSET_DTYPE)


class _RawShard:
    """A shard's three arrays appended to temporary raw files, in their stored types. Their lengths are the
    shard's whole state, so a checkpoint can record them and a resumed run can cut the files back to them
    (resume). When the shard closes, its format turns them into its final files."""

    def __init__(self, directory: Path, index: int, storage: Storage, lengths: dict[str, int] | None = None) -> None:
        self.index, self.storage = index, storage
        self.tmp = {k: directory / raw_file_name(k, index, temporary=True) for k in ARRAYS}
        # Where the temporaries become the final files (unpacked bin), their sha256 is taken as they are written.
        self.digests = {k: hashlib.sha256() for k in ARRAYS} if self.final_as_written() else {}
        if lengths is None:
            self.handles = {k: open(p, "wb") for k, p in self.tmp.items()}  # noqa: SIM115  closed in close()
            self._put("sample_offsets", np.zeros(1, OFFSET_DTYPE))
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
        data = memoryview(np.ascontiguousarray(array.astype(self.storage.dtype(key), copy=False))).cast("B")
        self.handles[key].write(data)
        if self.digests:
            self.digests[key].update(data)

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, ends: np.ndarray) -> None:
        self._put("sequence", ids)
        failpoint("shard_append")  # one array of the shard written, the others not yet
        self._put("loss_mask", loss_mask)
        self._put("sample_offsets", ends)
        for handle in self.handles.values():
            handle.flush()
            start_writeback(handle.fileno())

    def lengths(self) -> dict[str, int]:
        """Flush to the OS (enough to survive the process being killed) and say how long each file is."""
        for handle in self.handles.values():
            handle.flush()
        return {k: h.tell() for k, h in self.handles.items()}

    def final_as_written(self) -> bool:
        return self.storage.format == "bin" and self.storage.packing == "none"

    def _close_handles(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def _raw(self, key: str) -> np.ndarray:
        path, dtype = self.tmp[key], self.storage.dtype(key)
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)

    def _layout(self) -> Layout:
        return pack.layout(self.storage.packing, np.fromfile(self.tmp["sample_offsets"], OFFSET_DTYPE),
                           self.storage.seq_len)

    def _blocks(self, layout: Layout) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """The shard's final tokens and mask in blocks of whole sequences (about COPY_ITEMS tokens each),
        with the block's sequence offsets and segment offsets, both from 0."""
        ids, mask = self._raw("sequence"), self._raw("loss_mask")
        segments = layout.segment_offsets
        sequences = segments[layout.groups]
        first = 0
        for count in shard_cuts(np, np.diff(sequences), 0, COPY_ITEMS):
            last = first + count
            s0, s1 = int(layout.groups[first]), int(layout.groups[last])
            lo, hi = int(segments[s0]), int(segments[s1])
            if layout.packed:  # gather the segments' tokens from wherever they are in the raw stream
                lengths = layout.lengths[s0:s1]
                gather = np.repeat(layout.starts[s0:s1] - segments[s0:s1], lengths) + np.arange(lo, hi)
                block_ids, block_mask = ids[gather], mask[gather]
            else:
                block_ids, block_mask = np.asarray(ids[lo:hi]), np.asarray(mask[lo:hi])
            yield block_ids, block_mask, sequences[first:last + 1] - lo, segments[s0:s1 + 1] - lo
            first = last

    def _packing_record(self, layout: Layout) -> dict[str, Any]:
        """What a shard's meta says of its packing: sequences, segments and the padding to seq_len."""
        if not layout.packed:
            return {}
        tokens, seq_len = int(layout.lengths.sum()), int(self.storage.seq_len or 0)
        padding = pack.padding_tokens(layout.num_sequences, tokens, seq_len)
        return {"num_samples": layout.num_sequences, "num_segments": len(layout.lengths),
                "padding_tokens": padding}


def _build_files(directory: Path, names: dict[str, str], parts: Iterator[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Raw files built block by block under temporary names and hashed as they are written, then made
    durable and renamed; the shard record's files and sha256."""
    paths = {k: directory / n for k, n in names.items()}
    tmps = {k: p.with_name(f".{p.name}.build.tmp") for k, p in paths.items()}
    digests = {k: hashlib.sha256() for k in names}
    handles = {k: open(t, "wb") for k, t in tmps.items()}  # noqa: SIM115  closed below
    try:
        for part in parts:
            for key, values in part.items():
                data = memoryview(np.ascontiguousarray(values)).cast("B")
                handles[key].write(data)
                digests[key].update(data)
    finally:
        for handle in handles.values():
            handle.close()
    failpoint("shard_close")  # the shard complete under temporary names
    for key in names:
        finish_file(tmps[key], paths[key])
    return {"files": names, "sha256": {k: d.hexdigest() for k, d in digests.items()}}


def _chained_offsets(blocks: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Blocks as the raw arrays of a packed bin shard: offsets carried on from block to block."""
    base = 0
    yield {"sample_offsets": np.zeros(1, OFFSET_DTYPE), "segment_offsets": np.zeros(1, OFFSET_DTYPE)}
    for ids, mask, sequences, segments in blocks:
        yield {"sequence": ids, "loss_mask": mask,
               "sample_offsets": (sequences[1:] + base).astype(OFFSET_DTYPE),
               "segment_offsets": (segments[1:] + base).astype(OFFSET_DTYPE)}
        base += len(ids)


class _BinShard(_RawShard):
    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        if self.final_as_written():
            names = {k: raw_file_name(k, self.index, temporary=False) for k in ARRAYS}
            for k in ARRAYS:
                finish_file(self.tmp[k], directory / names[k])
                failpoint("shard_close")  # some of the shard's files renamed, the others not yet
            return {"files": names, "sha256": {k: d.hexdigest() for k, d in self.digests.items()}}
        layout = self._layout()
        names = {k: raw_file_name(k, self.index, temporary=False) for k in (*ARRAYS, "segment_offsets")}
        return {**_build_files(directory, names, _chained_offsets(self._blocks(layout))), **self._packing_record(layout)}


class _OneFileShard(_RawShard):
    """A shard whose final form is one file (data.h5, data.parquet, ...), built from the temporaries when
    the shard is complete; the file's sha256 goes in meta.json."""

    extension = ""

    def _build(self, tmp: Path, layout: Layout) -> None:
        raise NotImplementedError

    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        layout = self._layout()
        name = f"data{_suffix(self.index)}.{self.extension}"
        path = directory / name
        self._build(temporary_path(path), layout)
        failpoint("shard_close")  # the file complete under its temporary name
        finish_file(temporary_path(path), path)
        return {"files": {self.extension: name}, "sha256": {self.extension: sha256_file(path)},
                **self._packing_record(layout)}


class _H5Shard(_OneFileShard):
    """The shard's final arrays as datasets of one HDF5 file."""

    extension = "h5"

    def _build(self, tmp: Path, layout: Layout) -> None:
        import h5py

        total = int(layout.lengths.sum())
        arrays = {"sequence": (total, self.storage.token_dtype), "loss_mask": (total, self.storage.mask_dtype),
                  "sample_offsets": (layout.num_sequences + 1, OFFSET_DTYPE)}
        if layout.packed:
            arrays["segment_offsets"] = (len(layout.lengths) + 1, OFFSET_DTYPE)
        with h5py.File(tmp, "w") as h5:
            h5.attrs["loss_mask_meaning"] = LOSS_MASK_MEANING
            sets = {k: h5.create_dataset(k, shape=(n,), maxshape=(None,), dtype=t, chunks=(min(1 << 16, max(n, 1)),))
                    for k, (n, t) in arrays.items()}
            filled = dict.fromkeys(sets, 0)
            for part in _chained_offsets(self._blocks(layout)):
                for key, values in part.items():
                    if key in sets:
                        sets[key][filled[key]:filled[key] + len(values)] = values
                        filled[key] += len(values)


# Megatron's indexed dataset (megatron/core/datasets/indexed_dataset.py): a .bin of raw tokens and an .idx.
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
    """(token dtype, sample offsets) of a Megatron .idx written with one sequence per document."""
    data = path.read_bytes()
    if not data.startswith(MEGATRON_MAGIC):
        raise ValueError(f"{path} is not a Megatron index")
    version, code, count, _ = struct.unpack_from("<QBQQ", data, len(MEGATRON_MAGIC))
    dtype = next(t for t, c in MEGATRON_CODES.items() if c == code)
    lengths = np.frombuffer(data, dtype="<i4", count=count, offset=34)
    return dtype, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])


class _MegatronShard(_RawShard):
    """The temporaries (tokens already in the .bin's type, the mask as uint8) copied, when the shard is
    complete, into Megatron's .bin and a loss-mask sidecar of one uint8 per token in the .bin's order, and
    the .idx made from the sample offsets."""


    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        stem = f"data{_suffix(self.index)}"
        names = {"bin": f"{stem}.bin", "idx": f"{stem}.idx", "loss_mask": f"{stem}.loss_mask.bin"}
        layout = self._layout()
        idx = {"idx": np.frombuffer(megatron_index(layout.lengths, self.storage.token_dtype), np.uint8)}
        parts = ({"bin": ids, "loss_mask": mask} for ids, mask, _, _ in self._blocks(layout))
        return _build_files(directory, names, itertools.chain([idx], parts))


class _ParquetShard(_OneFileShard):
    """One Parquet file per shard, a row per sequence: input_ids, attention_mask (all 1: no padding is
    stored) and labels (the token where the loss mask is 1, else -100), as Hugging Face trainers take
    pre-tokenized data; packed shards add position_ids, starting from 0 at every segment, from which
    flash-attention kernels and padding-free collators find the boundaries. A row group per block."""

    extension = "parquet"

    def _build(self, tmp: Path, layout: Layout) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        fields = [("input_ids", pa.list_(pa.from_numpy_dtype(self.storage.token_dtype))),
                  ("attention_mask", pa.list_(pa.int8())), ("labels", pa.list_(pa.int64()))]
        if layout.packed:
            fields.append(("position_ids", pa.list_(pa.int64())))
        schema = pa.schema(fields, metadata={"gpu-prep": json.dumps({"loss_mask_meaning": LOSS_MASK_MEANING,
                                                                     "ignore_index": IGNORE_INDEX})})
        with pq.ParquetWriter(tmp, schema, compression="zstd") as out:
            for ids, mask, sequences, segments in self._blocks(layout):
                offsets = pa.array(sequences.astype(np.int32))
                columns = [ids, np.ones(len(ids), np.int8), np.where(mask.astype(bool), ids.astype(np.int64), IGNORE_INDEX)]
                if layout.packed:
                    columns.append(np.arange(len(ids), dtype=np.int64) - np.repeat(segments[:-1], np.diff(segments)))
                out.write_table(pa.Table.from_arrays([pa.ListArray.from_arrays(offsets, pa.array(c)) for c in columns],
                                                     schema=schema))


SHARDS: dict[str, type[_RawShard]] = {"bin": _BinShard, "h5": _H5Shard, "megatron": _MegatronShard,
                                      "parquet": _ParquetShard}


class DomainWriter:
    """Appends samples of one domain, opening a new shard whenever the current one is full."""

    def __init__(self, directory: Path, name: str, storage: Storage, max_tokens_per_shard: int) -> None:
        self.directory, self.name = directory, name
        self.storage, self.cap = storage, max_tokens_per_shard
        self.shards: list[dict[str, Any]] = []
        self.current: _RawShard | None = None
        # Temporaries of closed shards (built into other files): removed once a checkpoint no longer needs them.
        self.obsolete: list[Path] = []
        self.fill_tokens = self.fill_samples = self.fill_trained = 0

    def _open(self, lengths: dict[str, int] | None = None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = SHARDS[self.storage.format](self.directory, len(self.shards), self.storage, lengths)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this domain: its closed shards and the open one's file lengths."""
        return {"name": self.name, "directory": self.directory.name, "shards": self.shards,
                "fill": [self.fill_tokens, self.fill_samples, self.fill_trained],
                "open": None if self.current is None else self.current.lengths()}

    @classmethod
    def restore(cls, out_dir: Path, state: dict[str, Any], storage: Storage, cap: int) -> DomainWriter:
        writer = cls(out_dir / state["directory"], state["name"], storage, cap)
        writer.shards = state["shards"]
        writer.fill_tokens, writer.fill_samples, writer.fill_trained = state["fill"]
        if state["open"] is not None:
            writer._open(state["open"])
        return writer

    def _close_current(self) -> None:
        if self.current is not None:
            record = {"num_samples": self.fill_samples, **self.current.close(self.directory)}
            self.obsolete.extend(p for p in self.current.tmp.values() if p.exists())
            record.update(num_tokens=self.fill_tokens, num_trained_tokens=self.fill_trained)
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
        storage = self.storage
        meta = {
            "format": "gpu-prep", "format_version": 1, "storage_format": storage.format,
            "domain": self.name,
            "sequence": {"shape": [tokens], "dtype": storage.token_dtype.name},
            "loss_mask": {"shape": [tokens], "dtype": storage.mask_dtype.name, "meaning": LOSS_MASK_MEANING},
            "sample_offsets": {"dtype": OFFSET_DTYPE.name, "meaning": "sample i is tokens [off[i], off[i+1]) of its shard"},
            "num_samples": sum(s["num_samples"] for s in self.shards),
            "num_tokens": tokens,
            "num_trained_tokens": sum(s["num_trained_tokens"] for s in self.shards),
            **self._packing_meta(),
            "shards": self.shards,
        }
        failpoint("meta")
        write_json_atomic(self.directory / "meta.json", meta)
        return meta

    def _packing_meta(self) -> dict[str, Any]:
        if self.storage.packing == "none":
            return {}
        totals = pack.summary(self.shards, int(self.storage.seq_len or 0))
        del totals["num_samples"]  # the domain's own num_samples
        return {"packing": {
            "strategy": self.storage.packing, "seq_len": self.storage.seq_len, **totals,
            "meaning": "a sample holds the segments [seg[j], seg[j+1]) between its offsets; "
                       "position ids start from 0 at every segment"}}


class DatasetWriter:
    """One DomainWriter per domain; domain values are made safe and kept distinct as directory names."""

    def __init__(self, out_dir: Path, storage: Storage | str, max_tokens_per_shard: int,
                 window: int | None = None) -> None:
        """window: samples longer than this many tokens are cut into samples of that many (and a last one)."""
        self.out_dir, self.window = out_dir, window
        self.storage = Storage(storage) if isinstance(storage, str) else storage
        self.cap = max_tokens_per_shard
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
            self.domains[domain] = DomainWriter(self.out_dir / self._dir_for(domain), domain, self.storage, self.cap)
        self.domains[domain].append(ids, loss_mask, offsets)

    def state(self) -> list[dict[str, Any]]:
        return [w.state() for w in self.domains.values()]

    def restore(self, state: list[dict[str, Any]]) -> None:
        for domain in state:
            self.domains[domain["name"]] = DomainWriter.restore(self.out_dir, domain, self.storage, self.cap)
            self.taken[domain["directory"]] = domain["name"]

    def remove_obsolete(self) -> None:
        for writer in self.domains.values():
            writer.remove_obsolete()

    def finish(self) -> dict[str, dict[str, Any]]:
        return {w.directory.name: w.finish() for w in self.domains.values()}
