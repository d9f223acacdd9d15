"""verify: re-read a run's output and check it against what its meta.json files and manifest promise.

For every shard: the files exist with their recorded sha256, sizes match dtypes and counts, sample offsets
start at 0, never decrease and end at the token count, every loss_mask value is 0 or 1 and the mask is as
long as the sequence, and no sample is empty. For every domain and the whole run: the counts add up.
"""

from __future__ import annotations

import json
from pathlib import Path
from struct import error as struct_error
from typing import Any

import numpy as np

from gpu_prep.write import sha256_file


def _check_bin(directory: Path, shard: dict[str, Any], meta: dict[str, Any], where: str) -> list[str]:
    faults: list[str] = []
    arrays = {}
    dtypes = {"sequence": meta["sequence"]["dtype"], "loss_mask": meta["loss_mask"]["dtype"], "sample_offsets": "int64"}
    for key, name in shard["files"].items():
        path = directory / name
        if not path.is_file():
            faults.append(f"{where}: {name} is missing")
            continue
        if sha256_file(path) != shard["sha256"][key]:
            faults.append(f"{where}: {name} does not match its recorded sha256")
        itemsize = np.dtype(dtypes[key]).itemsize
        if path.stat().st_size % itemsize:
            faults.append(f"{where}: {name} is not a whole number of {dtypes[key]} values")
            continue
        dtype = np.dtype(dtypes[key]).newbyteorder("<")
        arrays[key] = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)
    if len(arrays) == 3:
        faults += _check_arrays(arrays["sequence"], arrays["loss_mask"], arrays["sample_offsets"], shard, where)
    return faults


def _check_megatron(directory: Path, shard: dict[str, Any], where: str) -> list[str]:
    from gpu_prep.write import read_megatron_index

    faults = []
    for key, name in shard["files"].items():
        path = directory / name
        if not path.is_file():
            return [f"{where}: {name} is missing"]
        if sha256_file(path) != shard["sha256"][key]:
            faults.append(f"{where}: {name} does not match its recorded sha256")
    try:
        dtype, offsets = read_megatron_index(directory / shard["files"]["idx"])
    except (ValueError, StopIteration, struct_error) as exc:
        return faults + [f"{where}: {shard['files']['idx']} is not a Megatron index ({exc})"]
    sizes = {k: (directory / shard["files"][k]).stat().st_size for k in ("bin", "loss_mask")}
    if sizes["bin"] != int(offsets[-1]) * dtype.itemsize or sizes["loss_mask"] != int(offsets[-1]):
        return faults + [f"{where}: the .bin or its loss-mask sidecar does not hold the tokens the .idx counts"]
    sequence, loss_mask = (np.memmap(directory / shard["files"][k], dtype=t, mode="r") if sizes[k] else np.zeros(0, t)
                           for k, t in (("bin", dtype), ("loss_mask", np.dtype("u1"))))
    return faults + _check_arrays(sequence, loss_mask, offsets, shard, where)


def _check_h5(directory: Path, shard: dict[str, Any], where: str) -> list[str]:
    import h5py

    path = directory / shard["files"]["h5"]
    if not path.is_file():
        return [f"{where}: {path.name} is missing"]
    faults = [] if sha256_file(path) == shard["sha256"]["h5"] else [f"{where}: {path.name} does not match its sha256"]
    try:
        with h5py.File(path, "r") as handle:
            arrays = [handle[key][:] for key in ("sequence", "loss_mask", "sample_offsets")]
    except (OSError, KeyError) as exc:
        return faults + [f"{where}: {path.name} cannot be read as HDF5 ({exc})"]
    return faults + _check_arrays(*arrays, shard, where)


def _check_arrays(ids: Any, loss_mask: Any, offsets: Any, shard: dict[str, Any], where: str) -> list[str]:
    faults = []
    if len(ids) != shard["num_tokens"] or len(loss_mask) != len(ids):
        faults.append(f"{where}: {len(ids)} tokens and {len(loss_mask)} mask values, meta says {shard['num_tokens']}")
    if len(offsets) != shard["num_samples"] + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
        faults.append(f"{where}: sample offsets do not run from 0 to the token count over {shard['num_samples']} samples")
    elif np.any(np.diff(offsets) <= 0):
        faults.append(f"{where}: sample offsets are not strictly increasing (an empty or reversed sample)")
    if len(loss_mask) and not np.isin(np.unique(np.asarray(loss_mask)), (0, 1)).all():
        faults.append(f"{where}: loss_mask holds values other than 0 and 1")
    if int(np.asarray(loss_mask).sum()) != shard["num_trained_tokens"]:
        faults.append(f"{where}: {int(np.asarray(loss_mask).sum())} trained tokens, meta says {shard['num_trained_tokens']}")
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
            fmt = meta["storage_format"]
            faults += _check_bin(directory, shard, meta, where) if fmt == "bin" \
                else _check_megatron(directory, shard, where) if fmt == "megatron" else _check_h5(directory, shard, where)
        tokens += meta["num_tokens"]
    totals = manifest["totals"]
    if tokens != totals["tokens"]:
        faults.append(f"the domains hold {tokens} tokens, the manifest says {totals['tokens']}")
    for entry in manifest["inputs"]:
        if entry["rows_read"] != entry["rows_written"] + sum(entry["rows_dropped"].values()):
            faults.append(f"{entry['path']}: rows read != rows written + rows dropped")
    return faults
