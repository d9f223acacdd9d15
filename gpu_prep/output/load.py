"""A shard read back (load_shard, in any storage format), and the checks the reader (output/dataset.py) and
`gpu-prep verify` share over its arrays: offsets, token ids against the vocabulary, mask values, and the
sizes raw array files must have."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.ragged import offsets_from_lengths, reorder

MASK_VALUES = (0, 1)  # what every format's loss mask holds (LOSS_MASK_MEANING; parquet's -100 labels read as 0)
SCAN_ITEMS = 1 << 24  # values a whole-shard check reads at a time: memory stays bounded over h5 and memmaps
# The file of a shard holding each array, by storage format (h5 and parquet hold them all in one file).
ARRAY_FILES = {"bin": {"sequence": "sequence", "loss_mask": "loss_mask", "offsets": "sample_offsets",
                       "segments": "segment_offsets"},
               "megatron": {"sequence": "bin", "loss_mask": "loss_mask", "offsets": "idx"},
               "h5": dict.fromkeys(("sequence", "loss_mask", "offsets", "segments"), "h5"),
               "parquet": dict.fromkeys(("sequence", "loss_mask", "offsets", "segments"), "parquet")}


def shard_file(directory: Path, record: dict[str, Any], meta: dict[str, Any], array: str) -> Path:
    """The file of a shard that holds one of its arrays: sequence, loss_mask, offsets or segments."""
    return directory / record["files"][ARRAY_FILES[meta["storage_format"]][array]]


def vocab_size(meta: dict[str, Any]) -> int | None:
    """The tokenizer's vocabulary size as meta.json records it (every id below it is valid); None: unknown."""
    return (meta.get("tokenizer") or {}).get("vocab_size") or None


def offsets_fault(offsets: np.ndarray, count: int, num_tokens: int, what: str = "sample") -> str | None:
    """What is wrong with a shard's offsets (None: nothing): count + 1 of them, from 0, strictly increasing
    (no empty or reversed sample), ending at the shard's token count."""
    if len(offsets) != count + 1:
        return f"{len(offsets):,} {what} offsets, where meta.json's {count:,} {what}s make {count + 1:,}"
    if offsets[0] != 0 or offsets[-1] != num_tokens:
        return (f"{what} offsets start at {int(offsets[0]):,} and end at {int(offsets[-1]):,}, where they run from 0 "
                f"to the shard's {num_tokens:,} tokens")
    wrong = np.flatnonzero(np.diff(offsets) <= 0)
    if not len(wrong):
        return None
    lo, hi = int(offsets[wrong[0]]), int(offsets[wrong[0] + 1])
    return (f"{what} offsets are not strictly increasing: {what} {int(wrong[0]):,} runs from {lo:,} "
            f"{'back to' if hi < lo else 'to'} {hi:,}")


def _top(values: np.ndarray) -> Any:
    """The largest value, a negative integer counted as larger than any (its bits read as unsigned): one pass
    checks both ends of a range from 0, which matters when every sample served is checked."""
    return (values.view(f"u{values.itemsize}") if values.dtype.kind == "i" else values).max()


def ids_fault(ids: np.ndarray, vocab: int | None) -> str | None:
    """The first token id outside the vocabulary (0 to vocab - 1), said as a fault; None: there is none."""
    if not vocab or not len(ids) or _top(ids) < vocab:
        return None
    return f"token id {ids[(ids < 0) | (ids >= vocab)][0].item()}, outside the vocabulary (0 to {vocab - 1})"


def mask_fault(mask: np.ndarray) -> str | None:
    """The first loss_mask value other than MASK_VALUES (0 and 1), said as a fault; None: there is none."""
    if not len(mask) or _top(mask) <= MASK_VALUES[-1]:
        return None
    bad = mask[(mask < MASK_VALUES[0]) | (mask > MASK_VALUES[-1])][0].item()
    return f"a loss_mask value of {bad}, other than 0 and 1 (1 = trained, 0 = not)"


def value_faults(arrays: ShardArrays, vocab: int | None) -> dict[str, str]:
    """ids_fault and mask_fault over a whole shard, SCAN_ITEMS values at a time, by array (sequence,
    loss_mask): every byte of the shard is read, so verify does it, not opening."""
    faults = {}
    checks = (("sequence", arrays.sequence, lambda v: ids_fault(v, vocab)), ("loss_mask", arrays.loss_mask, mask_fault))
    for array, values, check in checks:
        for lo in range(0, len(values), SCAN_ITEMS):
            fault = check(np.asarray(values[lo:lo + SCAN_ITEMS]))
            if fault:
                faults[array] = fault
                break
    return faults


def raw_arrays(record: dict[str, Any], meta: dict[str, Any]) -> dict[str, tuple[int, np.dtype, str]]:
    """A shard's files that are raw arrays, whose sizes follow from meta.json: by file key, (how many values,
    their dtype, what they are)."""
    fmt, samples, tokens = meta["storage_format"], record["num_samples"], record["num_tokens"]
    token, mask = (np.dtype(record.get(k, meta[k])["dtype"]) for k in ("sequence", "loss_mask"))
    offset = np.dtype("<i8")
    arrays = {"sample_labels": (samples, np.dtype("i1"), "labels")}
    if fmt == "bin":
        arrays |= {"sequence": (tokens, token, "tokens"), "loss_mask": (tokens, mask, "mask values"),
                   "sample_offsets": (samples + 1, offset, "sample offsets"),
                   "segment_offsets": (record.get("num_segments", 0) + 1, offset, "segment offsets")}
    elif fmt == "megatron":  # as load_shard reads them (the .idx is checked against its own header there)
        arrays |= {"bin": (tokens, token, "tokens"), "loss_mask": (tokens, np.dtype("u1"), "mask values")}
    return arrays


def _memmap(path: Path, dtype: np.dtype) -> np.ndarray:
    """A raw array file, memory-mapped (numpy says so when its size is not a whole number of values)."""
    return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)


@dataclass
class ShardArrays:
    sequence: Any  # token ids (a memmap, an h5py dataset or an array)
    loss_mask: Any  # 1 = the token counts in the loss
    offsets: np.ndarray  # sequence i is tokens [offsets[i], offsets[i + 1])
    segments: np.ndarray | None  # packed: every sample's boundaries inside the sequences; None: unpacked


def _parquet(path: Path) -> ShardArrays:
    import pyarrow.parquet as pq

    table = pq.read_table(path, memory_map=True)
    if "chosen_ids" in table.column_names or "chosen_input_ids" in table.column_names or "label" in table.column_names:
        return _pair_parquet(table)
    parts: dict[str, list[np.ndarray]] = {}
    lengths = []
    for name in table.column_names:  # chunk by chunk: a whole column may pass int32 list offsets
        for chunk in table.column(name).chunks:
            parts.setdefault(name, []).append(chunk.flatten().to_numpy())
            if name == "input_ids":
                lengths.append(chunk.value_lengths().to_numpy())
    values = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    ids, labels = values["input_ids"], values["labels"]
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths) if lengths else [], dtype=np.int64)])
    segments = None
    if "position_ids" in values:
        segments = np.concatenate([np.flatnonzero(values["position_ids"] == 0), [len(ids)]]).astype(np.int64)
    return ShardArrays(ids, (labels != -100).astype(np.uint8), offsets, segments)


def _pair_parquet(table: Any) -> ShardArrays:
    """Preference rows (a row each, TRL's columns) as the samples they are, without a Python object per
    token: prompt + chosen and prompt + rejected (dpo), the whole sequences (reward), prompt + completion
    (kto); the loss mask 0 on each sample's first prompt_length tokens."""
    names = table.column_names
    prompt_length = table.column("prompt_length").to_numpy().astype(np.int64)
    columns = [table.column(n).combine_chunks() for n in names if n.endswith("ids")]
    rows = len(prompt_length)
    # Every column's lists as rows of one ragged array: column c's row p is row c * rows + p.
    values = np.concatenate([np.asarray(c.flatten()) for c in columns]) if columns else np.zeros(0, np.int64)
    lengths = np.concatenate([np.asarray(c.value_lengths()) for c in columns]).astype(np.int64)
    p = np.arange(rows)
    if len(columns) == 3:  # dpo: sample 2p is prompt p then chosen p, sample 2p + 1 prompt p then rejected p
        parts = np.stack([p, rows + p, p, 2 * rows + p], axis=1).reshape(-1)
        per_sample = 2
    elif "label" in names:  # kto: prompt p then completion p
        parts, per_sample = np.stack([p, rows + p], axis=1).reshape(-1), 2
    else:  # reward: the whole sequences, chosen p then rejected p
        parts, per_sample = np.stack([p, rows + p], axis=1).reshape(-1), 1
    gather, part_offsets = reorder(np, offsets_from_lengths(np, lengths), parts)
    offsets = part_offsets[::per_sample].astype(np.int64)
    sample_lengths = np.diff(offsets)
    position = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], sample_lengths)
    pair_of_sample = np.arange(len(sample_lengths)) // (len(sample_lengths) // rows if rows else 1)
    loss_mask = (position >= np.repeat(prompt_length[pair_of_sample], sample_lengths)).astype(np.uint8)
    return ShardArrays(values[gather].astype(np.int64), loss_mask, offsets, None)


def sample_labels(directory: Path, record: dict[str, Any], meta: dict[str, Any]) -> np.ndarray:
    """A shard's sample labels (input.type kto): bin's sample_labels file, or parquet's label column."""
    if meta["storage_format"] == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(directory / record["files"]["parquet"], columns=["label"]).column("label").to_numpy(
            zero_copy_only=False)
    return np.fromfile(directory / record["files"]["sample_labels"], np.int8)


def load_shard(directory: Path, record: dict[str, Any], meta: dict[str, Any]) -> ShardArrays:
    """One shard's arrays, as its domain's meta.json describes them. Raises OSError, ValueError or KeyError
    on files that are not what they claim to be."""
    files, fmt = record["files"], meta["storage_format"]
    if fmt == "bin":
        segments = files.get("segment_offsets")
        own = {k: record.get(k, meta[k])["dtype"] for k in ("sequence", "loss_mask")}  # the shard's entry, where it has one
        return ShardArrays(_memmap(directory / files["sequence"], np.dtype(own["sequence"]).newbyteorder("<")),
                           _memmap(directory / files["loss_mask"], np.dtype(own["loss_mask"]).newbyteorder("<")),
                           np.array(_memmap(directory / files["sample_offsets"], np.dtype("<i8"))),
                           None if segments is None else np.array(_memmap(directory / segments, np.dtype("<i8"))))
    if fmt == "megatron":
        from gpu_prep.output.megatron import read_megatron_index

        token_dtype, offsets = read_megatron_index(directory / files["idx"])
        return ShardArrays(_memmap(directory / files["bin"], token_dtype),
                           _memmap(directory / files["loss_mask"], np.dtype("u1")), offsets, None)
    if fmt == "h5":
        import h5py

        handle = h5py.File(directory / files["h5"], "r")
        segments = handle["segment_offsets"][:] if "segment_offsets" in handle else None
        return ShardArrays(handle["sequence"], handle["loss_mask"], handle["sample_offsets"][:], segments)
    if fmt == "parquet":
        return _parquet(directory / files["parquet"])
    raise ValueError(f"storage_format {fmt!r} is not one gpu-prep writes")
