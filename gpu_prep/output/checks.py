"""The checks the reader (output/dataset.py) and `gpu-prep verify` share over a shard's arrays: offsets,
token ids against the vocabulary, mask values, and the sizes raw array files must have."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from pathlib import Path

    from gpu_prep.output.dataset import ShardArrays

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
