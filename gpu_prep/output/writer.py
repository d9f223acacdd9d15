"""write: samples -> per-domain shards, atomically, with meta.json (the pipeline's last stage).

A domain's samples go to shard 0 until it passes max_tokens_per_shard, then to shard 1, and so on; a sample
is never split across shards. Each storage format is a shard class in a module of its own (SHARDS below is
where a new one plugs in); the layout of each is described there and in README.md's Output section.
Domain values are made safe as directory names and kept distinct.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.failpoint import failpoint
from gpu_prep.mask.project import split_offsets
from gpu_prep.output import pack
from gpu_prep.output.bin import BinShard
from gpu_prep.durable import write_json_atomic
from gpu_prep.output.h5 import H5Shard
from gpu_prep.output.megatron import MegatronShard
from gpu_prep.output.parquet import ParquetShard
from gpu_prep.output.shuffle import Scatter
from gpu_prep.output.shards import LABEL_DTYPE, LOSS_MASK_MEANING, OFFSET_DTYPE, RawShard, Storage, shard_cuts

_MAX_NAME = 64
RESERVED_NAMES = {"manifest.json", "tokenizer"}  # what a run writes beside its domain directories


def safe_dir_name(name: str) -> str:
    """A directory name for a domain value: no separators, no leading dots, bounded length.

    A name that had to change gets a short hash of the original, so different names stay different.
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".")[:_MAX_NAME]
    if cleaned == name and cleaned and cleaned not in RESERVED_NAMES:
        return cleaned
    return f"{cleaned or 'domain'}-{hashlib.md5(name.encode('utf-8')).hexdigest()[:8]}"

SHARDS: dict[str, type[RawShard]] = {"bin": BinShard, "h5": H5Shard, "megatron": MegatronShard, "parquet": ParquetShard}


def shard_arrays(storage: Storage, record: dict[str, Any]) -> dict[str, Any]:
    """Each array of one shard with its own shape and dtype, so a shard memory-maps from its own entry
    (np.memmap(path, dtype=..., shape=...)) as a one-shard domain does from meta.json's top level. Parquet
    shards carry their own schema; Megatron's .bin is the sequence and its sidecar the loss mask."""
    if storage.format == "parquet":
        return {}
    tokens = [record["num_tokens"]]
    arrays = {"sequence": {"shape": tokens, "dtype": storage.token_dtype.name},
              "loss_mask": {"shape": tokens, "dtype": storage.mask_dtype.name}}
    if storage.format in ("bin", "h5"):
        arrays["sample_offsets"] = {"shape": [record["num_samples"] + 1], "dtype": OFFSET_DTYPE.name}
        if "num_segments" in record:
            arrays["segment_offsets"] = {"shape": [record["num_segments"] + 1], "dtype": OFFSET_DTYPE.name}
    if storage.labels:
        arrays["sample_labels"] = {"shape": [record["num_samples"]], "dtype": LABEL_DTYPE.name}
    return arrays


class DomainWriter:
    """Appends samples of one domain, opening a new shard whenever the current one is full."""

    def __init__(self, directory: Path, name: str, storage: Storage, max_tokens_per_shard: int,
                 about: dict[str, Any] | None = None) -> None:
        self.directory, self.name, self.about = directory, name, about or {}
        self.storage, self.cap = storage, max_tokens_per_shard
        self.shards: list[dict[str, Any]] = []
        self.current: RawShard | None = None
        # Temporaries of closed shards (built into other files): removed once a checkpoint no longer needs them.
        self.obsolete: list[Path] = []
        self.fill_tokens = self.fill_samples = self.fill_trained = 0
        # output.shuffle: samples go to bucket files as they come, to the shards in key order at finish.
        self.scatter = None if storage.shuffle_seed is None else Scatter(directory, storage.shuffle_seed, self._key(),
                                                                         group=storage.group, labels=storage.labels)

    def _key(self) -> str:
        return f"{self.about.get('split') or ''}/{self.name}"

    def _open(self, lengths: dict[str, int] | None = None) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.current = SHARDS[self.storage.format](self.directory, len(self.shards), self.storage, lengths)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of this domain: its closed shards and the open one's file lengths."""
        return {"name": self.name, "directory": self.directory.name, "shards": self.shards,
                "fill": [self.fill_tokens, self.fill_samples, self.fill_trained],
                "open": None if self.current is None else self.current.lengths(),
                **({"scatter": self.scatter.state()} if self.scatter is not None else {})}

    @classmethod
    def restore(cls, out_dir: Path, state: dict[str, Any], storage: Storage, cap: int,
                about: dict[str, Any] | None = None) -> DomainWriter:
        writer = cls(out_dir / state["directory"], state["name"], storage, cap, about)
        writer.shards = state["shards"]
        writer.fill_tokens, writer.fill_samples, writer.fill_trained = state["fill"]
        if state["open"] is not None:
            writer._open(state["open"])
        if writer.scatter is not None:
            writer.scatter = Scatter(writer.directory, storage.shuffle_seed, writer._key(), state.get("scatter"),
                                     group=storage.group, labels=storage.labels)
        return writer

    def _close_current(self) -> None:
        if self.current is not None:
            record = {"num_samples": self.fill_samples, **self.current.close(self.directory)}
            self.obsolete.extend(p for p in self.current.tmp.values() if p.exists())
            record.update(num_tokens=self.fill_tokens, num_trained_tokens=self.fill_trained)
            record.update(shard_arrays(self.storage, record))
            self.shards.append(record)
            self.current = None
            self.fill_tokens = self.fill_samples = self.fill_trained = 0

    def append(self, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray, labels: np.ndarray | None = None) -> None:
        """Samples ids[offsets[k]:offsets[k + 1]]; labels: each sample's (input.type kto), else None."""
        if self.scatter is not None:
            self.scatter.add(ids, loss_mask, offsets, labels)
        else:
            self._write(ids, loss_mask, offsets, labels)

    def _write(self, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray, labels: np.ndarray | None = None) -> None:
        lengths = np.diff(offsets)
        row = 0
        group = self.storage.group  # a pair's two samples go to one shard: cut between groups only
        grouped = lengths.reshape(-1, group).sum(axis=1) if group > 1 else lengths
        for k, count in enumerate(c * group for c in shard_cuts(np, grouped, self.fill_tokens, self.cap)):
            if k > 0:
                self._close_current()
            if count == 0:
                continue
            if self.current is None:
                self._open()
            lo, hi = int(offsets[row]), int(offsets[row + count])
            ends = self.fill_tokens + (offsets[row + 1:row + count + 1] - lo)
            self.current.append(ids[lo:hi], loss_mask[lo:hi], ends, None if labels is None else labels[row:row + count])
            self.fill_tokens += hi - lo
            self.fill_samples += count
            self.fill_trained += int(loss_mask[lo:hi].sum())
            row += count

    def remove_obsolete(self) -> None:
        for path in self.obsolete:
            path.unlink(missing_ok=True)
        self.obsolete.clear()

    def finish(self) -> dict[str, Any]:
        if self.scatter is not None:  # the shuffle's second pass: bucket by bucket, in key order
            for ids, loss_mask, offsets, labels in self.scatter.gather():
                self._write(ids, loss_mask, offsets, labels)
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
            **self.about,
            "shards": self.shards,
        }
        failpoint("meta", self.directory / "meta.json")
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
                 window: int | None = None, about: dict[str, Any] | None = None, not_domains: tuple[str, ...] = ()) -> None:
        """window: samples longer than this many tokens are cut into samples of that many (and a last one);
        about: more that every domain's meta.json says (the tokenizer that made the shards); not_domains:
        names in out_dir no domain's folder may take (a rejects file written there)."""
        self.out_dir, self.window, self.about = out_dir, window, about or {}
        self.storage = Storage(storage) if isinstance(storage, str) else storage
        self.cap = max_tokens_per_shard
        # By (split or None, domain name); a split's domains live in OUT/<split>/ (output.splits).
        self.domains: dict[tuple[str | None, str], DomainWriter] = {}
        # Directories (relative to out_dir) given out, by their lower-case spelling: "A" and "a" would be one
        # directory on a file system that ignores case (macOS, Windows), so the later one is "a-2".
        # A name no domain may take is held by a key no domain has (no split is named "").
        self.taken: dict[str, tuple[str | None, str]] = {name.lower(): ("", name) for name in not_domains}

    def _dir_for(self, key: tuple[str | None, str]) -> str:
        split, name = key
        candidate = base = f"{split}/{safe_dir_name(name)}" if split is not None else safe_dir_name(name)
        n = 1
        while self.taken.get(candidate.lower(), key) != key:
            n += 1
            candidate = f"{base}-{n}"
        self.taken[candidate.lower()] = key
        return candidate

    def append(self, domain: str, ids: np.ndarray, loss_mask: np.ndarray, offsets: np.ndarray,
               split: str | None = None, labels: np.ndarray | None = None) -> None:
        if self.window is not None:
            offsets = split_offsets(np, offsets, self.window)
        key = (split, domain)
        if key not in self.domains:
            about = self.about if split is None else {**self.about, "split": split}
            self.domains[key] = DomainWriter(self.out_dir / self._dir_for(key), domain, self.storage, self.cap, about)
        self.domains[key].append(ids, loss_mask, offsets, labels)

    def _relative(self, writer: DomainWriter) -> str:
        return writer.directory.relative_to(self.out_dir).as_posix()

    def state(self) -> list[dict[str, Any]]:
        return [{**w.state(), "directory": self._relative(w), "split": split}
                for (split, _), w in self.domains.items()]

    def restore(self, state: list[dict[str, Any]]) -> None:
        for domain in state:
            key = (domain.get("split"), domain["name"])
            about = self.about if key[0] is None else {**self.about, "split": key[0]}
            self.domains[key] = DomainWriter.restore(self.out_dir, domain, self.storage, self.cap, about)
            self.taken[domain["directory"].lower()] = key

    def remove_obsolete(self) -> None:
        for writer in self.domains.values():
            writer.remove_obsolete()

    def finish(self) -> dict[str, dict[str, Any]]:
        """Each domain's meta.json, by its directory relative to out_dir (<split>/<domain> with splits)."""
        return {self._relative(w): w.finish() for w in self.domains.values()}

    def leftovers(self) -> list[Path]:
        """Temporaries a resumed run would still need until the output is complete (the shuffle's buckets)."""
        return [path for w in self.domains.values() if w.scatter is not None for path in w.scatter.files()]
