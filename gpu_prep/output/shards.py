"""A shard while it is written: its three arrays appended to temporary raw files in their stored types.

Their lengths are a shard's whole state, so a checkpoint records them and a resumed run cuts the files back
to them. When the shard closes, its storage format (bin.py, h5.py, megatron.py, parquet.py) builds its final
files from the temporaries, in blocks of whole sequences (packed by pack.py where asked), and they are
renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError
from gpu_prep.failpoint import failpoint
from gpu_prep.output import pack
from gpu_prep.durable import (claim, create, finish_file, sha256_file, start_writeback, temporary_name,
                                   temporary_path, writing)
from gpu_prep.output.pack import Layout

TOKEN_DTYPE = np.dtype("<i8")
MASK_DTYPE = np.dtype("<i8")
OFFSET_DTYPE = np.dtype("<i8")
LOSS_MASK_MEANING = "1 = the token counts in the loss, 0 = it does not"


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


def shard_suffix(index: int) -> str:
    return "" if index == 0 else f".{index:05d}"


def raw_file_name(array: str, index: int, temporary: bool) -> str:
    """The name of one array of shard `index` as raw .bin: its final name, or the temporary one."""
    name = f"{array}{shard_suffix(index)}.bin"
    return temporary_name(name) if temporary else name


ARRAYS = ("sequence", "loss_mask", "sample_offsets")
LABEL_DTYPE = np.dtype("i1")  # sample_labels: 1 desirable, 0 undesirable (input.type kto)
COPY_ITEMS = 1 << 22  # tokens handled at a time when a shard's final files are built from its temporaries


@dataclass(frozen=True)
class Storage:
    """How a run's shards are stored: the format, the arrays' types and the packing."""

    format: str = "bin"
    token_dtype: np.dtype = TOKEN_DTYPE
    mask_dtype: np.dtype = MASK_DTYPE
    packing: str = "none"
    seq_len: int | None = None  # the length packed sequences are filled to
    shuffle_seed: int | None = None  # output.shuffle: samples written in this seed's order (output/shuffle.py)
    group: int = 1  # samples that stay together in one shard and one place of a shuffle (a pair: 2)
    pairs: str | None = None  # preference pairs: output.preference_columns (the Parquet columns)
    labels: bool = False  # unpaired preference rows (input.type kto): each sample's label, a fourth raw array

    @classmethod
    def from_config(cls, config: Any, vocab_size: int) -> Storage:
        out = config.output
        token = np.dtype(out.token_type(vocab_size)).newbyteorder("<")
        if vocab_size - 1 > np.iinfo(token).max:
            raise ConfigError(f"output.token_dtype {token.name} cannot hold the vocabulary's ids (0 to {vocab_size - 1})")
        # megatron and parquet keep the mask as one byte a token (the sidecar; labels are made from it)
        mask = np.dtype("u1") if out.storage_format in ("megatron", "parquet") else np.dtype(config.mask_dtype()).newbyteorder("<")
        return cls(out.storage_format, token, mask, config.preprocessing.packing, config.preprocessing.max_seq_len,
                   out.shuffle_seed if out.shuffle else None, 2 if config.input.type == "preference" else 1,
                   out.preference_columns if config.input.type == "preference" else None, config.input.type == "kto")

    def dtype(self, array: str) -> np.dtype:
        return {"sequence": self.token_dtype, "loss_mask": self.mask_dtype, "sample_labels": LABEL_DTYPE}.get(
            array, OFFSET_DTYPE)

    def arrays(self) -> tuple[str, ...]:
        """The raw arrays a shard of this storage appends to."""
        return (*ARRAYS, "sample_labels") if self.labels else ARRAYS


class RawShard:
    """A shard's three arrays appended to temporary raw files, in their stored types. Their lengths are the
    shard's whole state, so a checkpoint can record them and a resumed run can cut the files back to them
    (resume). When the shard closes, its format turns them into its final files."""

    def __init__(self, directory: Path, index: int, storage: Storage, lengths: dict[str, int] | None = None) -> None:
        self.index, self.storage = index, storage
        self.tmp = {k: directory / raw_file_name(k, index, temporary=True) for k in storage.arrays()}
        # Where the temporaries become the final files (unpacked bin), their sha256 is taken as they are written.
        self.digests = {k: hashlib.sha256() for k in self.tmp} if self.final_as_written() else {}
        if lengths is None:
            self.handles = {k: create(p) for k, p in self.tmp.items()}  # closed in close()
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
        with writing(self.tmp[key]):
            self.handles[key].write(data)
        if self.digests:
            self.digests[key].update(data)

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, ends: np.ndarray, labels: np.ndarray | None = None) -> None:
        self._put("sequence", ids)
        failpoint("shard_append", self.tmp["loss_mask"])  # one array of the shard written, the others not yet
        self._put("loss_mask", loss_mask)
        self._put("sample_offsets", ends)
        if labels is not None:
            self._put("sample_labels", labels)
        for key, handle in self.handles.items():
            with writing(self.tmp[key]):
                handle.flush()
            start_writeback(handle.fileno())

    def lengths(self) -> dict[str, int]:
        """Flush to the OS (enough to survive the process being killed) and say how long each file is."""
        for key, handle in self.handles.items():
            with writing(self.tmp[key]):
                handle.flush()
        return {k: h.tell() for k, h in self.handles.items()}

    def final_as_written(self) -> bool:
        return self.storage.format == "bin" and self.storage.packing == "none"

    def _close_handles(self) -> None:
        for key, handle in self.handles.items():
            with writing(self.tmp[key]):  # what is still buffered is written now
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


def build_files(directory: Path, names: dict[str, str], parts: Iterator[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Raw files built block by block under temporary names and hashed as they are written, then made
    durable and renamed; the shard record's files and sha256."""
    paths = {k: directory / n for k, n in names.items()}
    tmps = {k: p.with_name(f".{p.name}.build.tmp") for k, p in paths.items()}
    digests = {k: hashlib.sha256() for k in names}
    handles = {k: create(t) for k, t in tmps.items()}  # closed below
    try:
        for part in parts:
            for key, values in part.items():
                data = memoryview(np.ascontiguousarray(values)).cast("B")
                with writing(tmps[key]):
                    handles[key].write(data)
                digests[key].update(data)
    finally:
        for key, handle in handles.items():
            with writing(tmps[key]):
                handle.close()
    failpoint("shard_close", next(iter(tmps.values())))  # the shard complete under temporary names
    for key in names:
        finish_file(tmps[key], paths[key])
    return {"files": names, "sha256": {k: d.hexdigest() for k, d in digests.items()}}


def chained_offsets(blocks: Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
    """Blocks as the raw arrays of a packed bin shard: offsets carried on from block to block."""
    base = 0
    yield {"sample_offsets": np.zeros(1, OFFSET_DTYPE), "segment_offsets": np.zeros(1, OFFSET_DTYPE)}
    for ids, mask, sequences, segments in blocks:
        yield {"sequence": ids, "loss_mask": mask,
               "sample_offsets": (sequences[1:] + base).astype(OFFSET_DTYPE),
               "segment_offsets": (segments[1:] + base).astype(OFFSET_DTYPE)}
        base += len(ids)


class OneFileShard(RawShard):
    """A shard whose final form is one file (data.h5, data.parquet, ...), built from the temporaries when
    the shard is complete; the file's sha256 goes in meta.json."""

    extension = ""

    def _build(self, tmp: Path, layout: Layout) -> None:
        raise NotImplementedError

    def close(self, directory: Path) -> dict[str, Any]:
        self._close_handles()
        layout = self._layout()
        name = f"data{shard_suffix(self.index)}.{self.extension}"
        path = directory / name
        claim(temporary_path(path))
        with writing(temporary_path(path)):
            self._build(temporary_path(path), layout)
        failpoint("shard_close", path)  # the file complete under its temporary name
        finish_file(temporary_path(path), path)
        return {"files": {self.extension: name}, "sha256": {self.extension: sha256_file(path)},
                **self._packing_record(layout)}
