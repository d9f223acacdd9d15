"""verify: re-read a run's output and check it against what its meta.json files and manifest promise.

For every shard, in any storage format (read with the reader's load_shard): the files exist with their
recorded sha256, sizes match dtypes and counts, sample offsets start at 0, never decrease and end at the
token count, every loss_mask value is 0 or 1 and the mask is as long as the sequence, every token id is
within the tokenizer's vocabulary (meta.json's vocab_size), and no sample is empty (the reader's own checks,
from gpu_prep/output/load.py); packed shards keep every sequence within seq_len and every sequence start
on a sample boundary; a Megatron .idx has version 1, byte pointers that follow its lengths and document
indices 0..S (the reader refuses it otherwise). gpu_prep.open(out, verify=True) runs this first.
For every domain and the whole run: the counts add up. The manifest itself: its checksum (over totals,
config, domains and file list) holds, and every file it lists is there with its size.
"""

from __future__ import annotations

import json
from pathlib import Path
from struct import error as struct_error
from typing import Any

import numpy as np

from gpu_prep.output.load import ShardArrays, load_shard, offsets_fault, shard_file, value_faults, vocab_size
from gpu_prep.durable import manifest_edited, sha256_file


def _check_shard(directory: Path, shard: dict[str, Any], meta: dict[str, Any], where: str) -> list[str]:
    """A shard's files against their recorded sha256, then its arrays, read as the reader reads them."""
    faults = []
    for key, name in shard["files"].items():
        path = directory / name
        if not path.is_file():
            return [f"{where}: {name} is missing"]
        if sha256_file(path) != shard["sha256"][key]:
            faults.append(f"{where}: {name} does not match its recorded sha256")
    try:
        arrays = load_shard(directory, shard, meta)
    except (OSError, ValueError, KeyError, StopIteration, struct_error) as exc:
        return faults + [f"{where}: its files cannot be read as {meta['storage_format']} ({exc})"]
    faults += _check_arrays(arrays, shard, where)
    # The reader's own checks, in its words, naming each file: the offsets (it checks them as it reads a
    # shard) and every value (it checks a sample's as it serves it; here, the whole shard's).
    found = value_faults(arrays, vocab_size(meta))
    fault = offsets_fault(np.asarray(arrays.offsets), shard["num_samples"], len(arrays.sequence))
    if fault:
        found["offsets"] = fault
    faults += [f"{where}: {shard_file(directory, shard, meta, array)}: {fault}" for array, fault in found.items()]
    if "packing" in meta:
        faults += _check_packing(arrays, shard, meta["packing"], where)
    return faults


def _check_packing(arrays: ShardArrays, shard: dict[str, Any], packing: dict[str, Any], where: str) -> list[str]:
    segments, offsets = arrays.segments, np.asarray(arrays.offsets)
    if segments is None:
        return [f"{where}: a packed shard without its samples' boundaries"]
    faults = []
    if len(segments) != shard["num_segments"] + 1 or segments[0] != 0 or segments[-1] != offsets[-1] \
            or np.any(np.diff(segments) <= 0):
        faults.append(f"{where}: segment offsets do not run strictly from 0 to the token count over "
                      f"{shard['num_segments']} segments")
    elif not np.isin(offsets, segments).all():
        faults.append(f"{where}: a sequence begins inside a segment")
    if len(offsets) > 1 and int(np.diff(offsets).max()) > packing["seq_len"]:
        faults.append(f"{where}: a packed sequence is longer than {packing['seq_len']} tokens")
    return faults


def _check_arrays(arrays: ShardArrays, shard: dict[str, Any], where: str) -> list[str]:
    faults = []
    ids = arrays.sequence
    loss_mask = np.asarray(arrays.loss_mask)  # read once (an h5 dataset reads from its file on every access)
    if len(ids) != shard["num_tokens"] or len(loss_mask) != len(ids):
        faults.append(f"{where}: {len(ids)} tokens and {len(loss_mask)} mask values, meta says {shard['num_tokens']}")
    trained = int(loss_mask.sum())
    if trained != shard["num_trained_tokens"]:
        faults.append(f"{where}: {trained} trained tokens, meta says {shard['num_trained_tokens']}")
    return faults


def _load_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as exc:
        return None, f"{path.name} cannot be read ({exc})"


def verify(out_dir: str | Path) -> list[str]:
    """Every fault found in a run's output; an empty list means it is sound."""
    out_dir = Path(out_dir)
    manifest_path = out_dir / "manifest.json"
    if not manifest_path.is_file():
        return [f"{out_dir}: no manifest.json (not a finished gpu-prep run)"]
    manifest, problem = _load_json(manifest_path)
    if problem is not None:
        return [f"{out_dir}: {problem}"]
    try:
        return _verify(out_dir, manifest)
    except (KeyError, TypeError, IndexError) as exc:
        return [f"{out_dir}: a manifest or meta.json lacks what a run writes ({type(exc).__name__}: {exc})"]


def _verify(out_dir: Path, manifest: dict[str, Any]) -> list[str]:
    faults: list[str] = []
    edited = manifest_edited(out_dir / "manifest.json", manifest)
    if edited:
        faults.append(edited)
    for name, size in manifest.get("files", {}).items():
        path = out_dir / name
        if not path.is_file():
            faults.append(f"{path}: listed in the manifest, missing")
        elif path.stat().st_size != size:
            faults.append(f"{path}: {path.stat().st_size:,} bytes, the manifest says {size:,}")
    for name, digest in manifest.get("tokenizer_files", {}).items():  # runs before this record have none
        path = out_dir / name
        if path.is_file() and path.stat().st_size == manifest["files"].get(name) and sha256_file(path) != digest:
            faults.append(f"{path}: does not match its recorded sha256 (the tokenizer trainers load was edited)")
    if manifest["totals"]["rows_written"] == 0:
        faults.append(f"{out_dir}: the run wrote no rows (of {manifest['totals']['rows_read']:,} read): nothing to train on")
    tokens = 0
    for name, recorded in manifest["domains"].items():
        directory = out_dir / name
        meta_path = directory / "meta.json"
        if not meta_path.is_file():
            faults.append(f"{name}: meta.json is missing")
            continue
        meta, problem = _load_json(meta_path)
        if problem is not None:
            faults.append(f"{name}: {problem}")
            continue
        if meta != recorded:
            faults.append(f"{name}: meta.json differs from the manifest's copy")
        for k, shard in enumerate(meta["shards"]):
            where = f"{name} shard {k}"
            faults += _check_shard(directory, shard, meta, where)
        tokens += meta["num_tokens"]
    totals = manifest["totals"]
    if tokens != totals["tokens"]:
        faults.append(f"the domains hold {tokens} tokens, the manifest says {totals['tokens']}")
    for entry in manifest["inputs"]:
        if entry["rows_read"] != entry["rows_written"] + sum(entry["rows_dropped"].values()):
            faults.append(f"{entry['path']}: rows read != rows written + rows dropped")
    return faults
