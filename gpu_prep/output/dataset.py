"""Read a run's output back, whatever its storage format (bin, h5, megatron, parquet).

    ds = gpu_prep.open("out/")                  # verify=True: `gpu-prep verify` first (reads every byte)
    ids, loss_mask = ds["__default__"][0]       # sequence 0 of a domain
    ds["__default__"].position_ids(0)           # restarting at every sample packed into it
    for ids, loss_mask in ds["__default__"].samples(): ...   # the samples themselves, packed or not
    ds.totals()                                 # samples, tokens, trained tokens (and packing)

bin and megatron arrays are memory-mapped; h5 datasets are read as sliced; a parquet shard is read whole.
`gpu-prep verify`, `inspect` and `stats` all read through load_shard, so every format is checked the same.

What is served is what the run wrote, checked where it costs no more than what is read anyway:
- opening reads only JSON and stats files: the manifest's checksum; each meta.json against the manifest's copy
  of it and its shard entries against its totals; the files its shards name against the files the manifest
  lists, and each file's size against the manifest's record and (for raw arrays) the counts and dtypes;
- a shard's sample (and segment) offsets are read whole the first time one of its samples is asked for, and
  checked then: from 0, strictly increasing, ending at its token count;
- every sample served has its ids checked against the tokenizer's vocabulary and its mask against 0 and 1
  (a max over each, of what the caller reads anyway). Doing that for every value at open would read every
  byte of the output, like the checksums: open(out, verify=True) does both by running `gpu-prep verify`
  (gpu_prep/output/verify.py; both use the checks in output/load.py) before anything is served.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.mask.pairs import prompt_end

from gpu_prep.output.load import (ShardArrays, ids_fault, load_shard, mask_fault, offsets_fault, raw_arrays,
                                   sample_labels, shard_file, vocab_size)
from gpu_prep.durable import manifest_edited

TOTALS = ("num_samples", "num_tokens", "num_trained_tokens")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:  # not JSON, or not UTF-8
        raise ValueError(f"{path}: cannot be read as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object, where a run writes one")
    return data


class Domain:
    """The sequences of one domain directory, across its shards."""

    def __init__(self, directory: str | Path, recorded: dict[str, Any] | None = None,
                 listed: dict[str, int] | None = None) -> None:
        """recorded, listed: what the run's manifest says of the domain, its copy of meta.json and the sizes
        of the files in the domain's directory by name (Dataset passes them; a Domain opened by itself is held
        to its meta.json alone). Raises ValueError (FileNotFoundError for a missing file) naming the file and
        what disagrees: the checks are in the module's docstring."""
        self.directory = Path(directory)
        meta_path = self.directory / "meta.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: missing (the domain's description)")
        self.meta = _read_json(meta_path)
        try:
            self._check_meta(recorded, listed)
            for k, record in enumerate(self.meta["shards"]):
                self._check_files(k, record, listed)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{meta_path}: lacks what a run writes ({type(exc).__name__}: {exc})") from None
        self.vocab_size = vocab_size(self.meta)
        self._starts = np.cumsum([0] + [rec["num_samples"] for rec in self.meta["shards"]])
        self._open: tuple[int, ShardArrays] | None = None  # the shard last read (a parquet shard is read whole)

    def _check_meta(self, recorded: dict[str, Any] | None, listed: dict[str, int] | None) -> None:
        """meta.json's shard entries against its totals, and against what the manifest records."""
        meta_path, shards = self.directory / "meta.json", self.meta["shards"]
        for key in TOTALS:
            held = sum(int(record[key]) for record in shards)
            if held != self.meta[key]:
                raise ValueError(f"{meta_path}: its {len(shards)} shard entries hold {held:,} "
                                 f"{key[4:].replace('_', ' ')}, where its {key} says {self.meta[key]:,} (edited)")
        if recorded is not None and self.meta != recorded:
            differ = [k for k in {**recorded, **self.meta} if self.meta.get(k) != recorded.get(k)]
            theirs = len(recorded.get("shards") or ())
            if "shards" in differ and len(shards) != theirs:
                differ[differ.index("shards")] = f"shards ({len(shards)} entries, the manifest's {theirs})"
            raise ValueError(f"{meta_path}: differs from the manifest's copy of it in {', '.join(differ)} "
                             "(edited after the run)")
        if listed is None:
            return
        named = {name: k for k, record in enumerate(shards) for name in record["files"].values()}
        unnamed = sorted(set(listed) - set(named) - {"meta.json"})
        if unnamed:
            raise ValueError(f"{self.directory / unnamed[0]}: listed in the manifest, but no shard entry of "
                             f"{meta_path} names it ({len(unnamed)} such file(s): a shard's entry was removed)")
        unlisted = sorted(set(named) - set(listed))
        if unlisted:
            raise ValueError(f"{self.directory / unlisted[0]}: named by shard {named[unlisted[0]]} of {meta_path}, "
                             "but not listed in the manifest")

    def _check_files(self, k: int, record: dict[str, Any], listed: dict[str, int] | None) -> None:
        """Shard k's files: each there, of the size meta.json's counts and dtypes make (raw arrays) and of the
        size the manifest records (every file: an h5, parquet or Megatron index file too). Stats, no reads."""
        raw = raw_arrays(record, self.meta)
        for key, name in record["files"].items():
            path = self.directory / name
            if not path.is_file():
                raise FileNotFoundError(f"{path}: missing, where shard {k} of {self.directory / 'meta.json'} names it")
            size = expected = path.stat().st_size
            said = ""
            if key in raw:
                count, dtype, what = raw[key]
                expected = count * dtype.itemsize
                said = (f"{size:,} bytes ({size // dtype.itemsize:,} {what} of {dtype.name}), where meta.json records "
                        f"{count:,} {what} ({expected:,} bytes)")
            if size == expected and listed is not None and listed.get(name, size) != size:
                expected = listed[name]
                said = f"{size:,} bytes, where the manifest records {expected:,}"
            if size != expected:
                raise ValueError(f"{path}: {said}: the file is "
                                 f"{'cut short or damaged' if size < expected else 'damaged (longer than written)'}")

    def _file(self, k: int, array: str) -> Path:
        return shard_file(self.directory, self.meta["shards"][k], self.meta, array)

    def shard(self, k: int) -> ShardArrays:
        """Shard k's arrays, read when first asked for and checked against their record (lengths and offsets,
        not checksums or values: verify does those); one shard is kept open at a time."""
        if self._open is None or self._open[0] != k:
            record = self.meta["shards"][k]
            arrays = load_shard(self.directory, record, self.meta)
            if not (len(arrays.sequence) == len(arrays.loss_mask) == record["num_tokens"]
                    and len(arrays.offsets) == record["num_samples"] + 1):
                names = ", ".join(str(self.directory / n) for n in record["files"].values())
                raise ValueError(f"{names}: {len(arrays.sequence):,} tokens, {len(arrays.loss_mask):,} mask values and "
                                 f"{len(arrays.offsets) - 1:,} samples, where meta.json records {record['num_tokens']:,} "
                                 f"tokens and {record['num_samples']:,} samples (damaged; gpu-prep verify says more)")
            fault = offsets_fault(arrays.offsets, record["num_samples"], record["num_tokens"])
            if fault:
                raise ValueError(f"{self._file(k, 'offsets')}: {fault}")
            if arrays.segments is not None and "num_segments" in record:
                fault = offsets_fault(arrays.segments, record["num_segments"], record["num_tokens"], "segment")
                if fault:
                    raise ValueError(f"{self._file(k, 'segments')}: {fault}")
            self._open = (k, arrays)
        return self._open[1]

    @property
    def num_shards(self) -> int:
        return len(self.meta["shards"])

    @property
    def name(self) -> str:
        return self.meta["domain"]

    @property
    def packed(self) -> bool:
        return "packing" in self.meta

    def totals(self) -> dict[str, Any]:
        return {k: self.meta[k] for k in TOTALS} | ({"packing": self.meta["packing"]} if self.packed else {})

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _locate(self, i: int) -> tuple[int, ShardArrays, int, int]:
        """Sample i's shard, that shard's arrays, and where in them the sample begins and ends."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        i %= len(self)
        shard = int(np.searchsorted(self._starts, i, side="right")) - 1
        arrays = self.shard(shard)
        local = i - int(self._starts[shard])
        return shard, arrays, int(arrays.offsets[local]), int(arrays.offsets[local + 1])

    def __getitem__(self, i: int | slice) -> Any:
        """Sample i as (ids, loss_mask); a slice gives a list of them. An id outside the vocabulary or a mask
        value other than 0 and 1 is refused, naming its file, never served."""
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        k, arrays, lo, hi = self._locate(i)
        ids, mask = np.asarray(arrays.sequence[lo:hi]), np.asarray(arrays.loss_mask[lo:hi])
        fault, array = ids_fault(ids, self.vocab_size), "sequence"
        if fault is None:
            fault, array = mask_fault(mask), "loss_mask"
        if fault:
            raise ValueError(f"{self._file(k, array)}: sample {i} (tokens {lo:,} to {hi:,} of shard {k}) holds {fault}")
        return ids, mask

    def __repr__(self) -> str:
        m = self.meta
        return (f"Domain({self.name!r}: {len(self):,} samples, {m['num_tokens']:,} tokens, "
                f"{m['num_trained_tokens']:,} trained, {self.num_shards} {m['storage_format']} shard(s))")

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(len(self)):
            yield self[i]

    def pairs(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Preference pairs (input.type preference) as (prompt, chosen, rejected) token ids: pair p is samples
        2p and 2p + 1, the prompt the tokens before the first trained one."""
        if "preference" not in self.meta:
            raise ValueError(f"{self.directory}: not preference pairs (meta.json has no 'preference')")
        for p in range(0, len(self), 2):
            (chosen, mask), (rejected, _) = self[p], self[p + 1]
            n = prompt_end(mask)
            yield chosen[:n], chosen[n:], rejected[n:]

    def unpaired(self) -> Iterator[tuple[np.ndarray, np.ndarray, bool]]:
        """Unpaired preference rows (input.type kto) as (prompt, completion, label): the prompt is the tokens
        before the first trained one."""
        if "unpaired" not in self.meta.get("preference", {}):
            raise ValueError(f"{self.directory}: not unpaired preference rows (input.type kto)")
        for k, record in enumerate(self.meta["shards"]):
            labels = sample_labels(self.directory, record, self.meta)
            for i in range(record["num_samples"]):
                ids, mask = self[int(self._starts[k]) + i]
                n = prompt_end(mask)
                yield ids[:n], ids[n:], bool(labels[i])

    def segments(self, i: int) -> np.ndarray:
        """Where the samples packed into sequence i begin and end, from 0 to its length."""
        _, arrays, lo, hi = self._locate(i)
        if arrays.segments is None:
            return np.array([0, hi - lo], dtype=np.int64)
        inside = arrays.segments[np.searchsorted(arrays.segments, lo):np.searchsorted(arrays.segments, hi, "right")]
        return inside - lo

    def position_ids(self, i: int) -> np.ndarray:
        """Each token's position within its own sample: 0 at every sample packed into sequence i."""
        bounds = self.segments(i)
        return np.arange(bounds[-1], dtype=np.int64) - np.repeat(bounds[:-1], np.diff(bounds))

    def samples(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The samples as written before packing (a wrapped sample cut at a sequence's end comes as its
        pieces); for unpacked output, the same as iterating the domain."""
        for i in range(len(self)):
            ids, mask = self[i]
            bounds = self.segments(i)
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                yield ids[lo:hi], mask[lo:hi]


class Dataset:
    """All domains of a run's output directory, by directory name."""

    def __init__(self, out_dir: str | Path, verify: bool = False) -> None:
        """verify: run `gpu-prep verify` first (every file's checksum, every value of every shard: a read of
        the whole output) and refuse the output, with every fault it finds, unless it is sound."""
        self.out_dir = Path(out_dir)
        if not self.out_dir.is_dir():
            raise FileNotFoundError(f"{self.out_dir}: no such output directory")
        path = self.out_dir / "manifest.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing, so {self.out_dir} is not a finished run (one that was stopped "
                                    "is finished by running it again with --resume)")
        if verify:
            from gpu_prep.output.verify import verify as verify_output  # verify reads shards through this module

            faults = verify_output(self.out_dir)
            if faults:
                more = f"; and {len(faults) - 5} more (gpu-prep verify lists them all)" if len(faults) > 5 else ""
                raise ValueError(f"{self.out_dir}: gpu-prep verify finds {len(faults)} fault(s): "
                                 f"{'; '.join(faults[:5])}{more}")
        manifest = _read_json(path)
        edited = manifest_edited(path, manifest)
        if edited:
            raise ValueError(edited)
        self.manifest = manifest
        files = manifest.get("files")
        self.domains = {name: Domain(self.out_dir / name, manifest["domains"][name],
                                     None if files is None else _in_directory(files, name))
                        for name in sorted(manifest["domains"])}

    def __getitem__(self, name: str) -> Domain:
        if name not in self.domains:
            raise KeyError(f"no domain {name!r} in {self.out_dir}; domains: {', '.join(self.domains) or 'none'}")
        return self.domains[name]

    def __repr__(self) -> str:
        t = self.totals()
        return (f"Dataset({str(self.out_dir)!r}: {len(self)} domain(s) {list(self.domains)}, "
                f"{t['num_samples']:,} samples, {t['num_tokens']:,} tokens)")

    def __iter__(self) -> Iterator[str]:
        return iter(self.domains)

    def __len__(self) -> int:
        return len(self.domains)

    def totals(self) -> dict[str, int]:
        """Samples, tokens and trained tokens over every domain."""
        return {k: sum(d.meta[k] for d in self.domains.values()) for k in TOTALS}


def _in_directory(files: dict[str, int], directory: str) -> dict[str, int]:
    """The manifest's files directly in one directory of the output, by name."""
    prefix = f"{directory}/"
    return {name[len(prefix):]: size for name, size in files.items()
            if name.startswith(prefix) and "/" not in name[len(prefix):]}


def open_dataset(out_dir: str | Path, verify: bool = False) -> Dataset:
    """A run's output, checked as the module's docstring says; verify=True: `gpu-prep verify` first."""
    return Dataset(out_dir, verify)
