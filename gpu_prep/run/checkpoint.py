"""Checkpoints: what a killed run needs to carry on with --resume and finish byte for byte as if it had
never stopped.

After a chunk is written (and at most every `every_seconds`), once the chunk's shard data, rejects and
dedup digests have reached the OS, the run replaces OUT/.gpu-prep-checkpoint.json with:

- rows_done: input rows wholly accounted for (read past on resume);
- the accounting so far and the length of the rejects file's temporary;
- per domain, its closed shards and the lengths of the open shard's temporary files;
- how many digests of the dedup log (OUT/.gpu-prep-dedup.bin, 16 bytes each, append-only) are in force;
- the decisions taken on the first rows (tokenizer engine, Jinja-free rendering), which resume repeats
  rather than takes again on different rows;
- the run's identity (config, inputs by size and mtime, tokenizer files), which must match to resume.

Everything after the checkpoint is undone on resume: files are cut back to the recorded lengths, files
written since are removed, and a shard that was closed since is reopened from its final files.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpu_prep.errors import ConfigError
from gpu_prep.failpoint import failpoint
from gpu_prep.durable import create, remove_written, write_json_atomic, writing
from gpu_prep.output.shards import raw_file_name
from gpu_prep.output.shuffle import bucket_name

CHECKPOINT = ".gpu-prep-checkpoint.json"
DEDUP_LOG = ".gpu-prep-dedup.bin"
NEAR_LOG = ".gpu-prep-near.bin"  # preprocessing.fuzzy_dedup's band-key records (fuzzy.NearIndex), 16 bytes each
DIGEST_BYTES = 16
FORMAT = 2


def run_identity(config_sha256: str, files: list[Any], tokenizer: dict[str, Any]) -> dict[str, Any]:
    """What must be the same for a run to be resumed: the config (what of it can change the output:
    PipelineConfig.output_sha256), each input, the tokenizer's files."""
    # As the run found them (read.check_unchanged holds every read to it): a local file's size and modification
    # time, a URL's size, a hub dataset's version.
    inputs = [[f.path, f.size_bytes, f.version if f.mtime_ns is None else f.mtime_ns] for f in files]
    return {"format": FORMAT, "config": config_sha256, "inputs": inputs,
            "tokenizer": tokenizer["sha256"]}


def _kept_files(state: dict[str, Any]) -> set[str]:
    """Paths (relative to OUT) the checkpoint refers to."""
    kept = {CHECKPOINT, DEDUP_LOG, NEAR_LOG}
    for domain in state["writer"]:
        directory = domain["directory"]
        for shard in domain["shards"]:
            kept.update(f"{directory}/{name}" for name in shard["files"].values())
        if domain["open"] is not None:
            index = len(domain["shards"])
            kept.update(f"{directory}/{raw_file_name(k, index, temporary=True)}" for k in domain["open"])
        scatter = domain.get("scatter")  # output.shuffle's buckets
        kept.update(f"{directory}/{bucket_name(b)}" for b, n in enumerate(scatter["lengths"] if scatter else ()) if n)
    return kept


def _which_inputs(before: list[list[Any]], now: list[list[Any]]) -> str:
    """Which inputs a resume would read otherwise than the run it goes on with: added, gone, or changed (in
    size or modification time), the first few named."""
    old, new = {path: rest for path, *rest in before}, {path: rest for path, *rest in now}
    said = [f"{path!r} added" for path in new if path not in old] + [f"{path!r} gone" for path in old if path not in new]
    said += [f"{path!r} changed" for path in new if path in old and old[path] != new[path]]
    if not said and [p for p, *_ in before] != [p for p, *_ in now]:
        said = ["the same files in another order"]
    return f" ({', '.join(said[:3])}{' ...' if len(said) > 3 else ''})" if said else ""


def has_checkpoint(out_dir: Path) -> bool:
    """Whether --resume in out_dir goes on from a checkpoint (which names the rejects file its run began);
    without one it starts afresh, and a file at the rejects path is not the run's to replace."""
    return (out_dir / CHECKPOINT).is_file()


def load_for_resume(out_dir: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint to resume from, with OUT put back as it was when it was written (every file the run
    wrote since is removed); None, with what the run wrote removed, when it stopped before its first
    checkpoint."""
    path = out_dir / CHECKPOINT
    state = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    if state is not None and state["identity"] != identity:
        changed = [k for k in identity if state["identity"].get(k) != identity[k]]
        raise ConfigError(f"cannot resume {str(out_dir)!r}: the {', '.join(changed)} changed since it was "
                          f"started{_which_inputs(state['identity'].get('inputs') or [], identity['inputs'])}; run "
                          "with --overwrite to start again")
    # A shard closed after the checkpoint is open again: its final .bin files go back to being temporaries.
    for domain in state["writer"] if state is not None else []:
        if domain["open"] is not None:
            directory, index = out_dir / domain["directory"], len(domain["shards"])
            for array in domain["open"]:  # the open shard's arrays, as the checkpoint lists their lengths
                reopen(directory / raw_file_name(array, index, temporary=False),
                       directory / raw_file_name(array, index, temporary=True))
    remove_written(out_dir, keep=_kept_files(state) if state is not None else set())
    return state


def reopen(final: Path, tmp: Path) -> None:
    """A file finished after the checkpoint becomes the temporary it was (to be cut back to the checkpoint)."""
    if not tmp.exists() and final.exists():
        os.replace(final, tmp)


class Checkpointer:
    """Logs dedup digests as chunks finish and writes a checkpoint at most every `every_seconds`."""

    def __init__(self, out_dir: Path, identity: dict[str, Any], every_seconds: float,
                 state: dict[str, Any] | None = None) -> None:
        self.out_dir, self.identity, self.every = out_dir, identity, every_seconds
        self.rows_done = 0 if state is None else state["rows_done"]
        # The rows the last checkpoint holds (None: none was written yet, nothing to resume from).
        self.rows_saved: int | None = None if state is None else self.rows_done
        self.digests = 0 if state is None else state["dedup_digests"]
        self.near_records = 0 if state is None else state.get("near_records", 0)
        self.log = _log(out_dir / DEDUP_LOG, None if state is None else self.digests * DIGEST_BYTES)
        self.near_log = _log(out_dir / NEAR_LOG, None if state is None else self.near_records * DIGEST_BYTES)
        self.last = time.monotonic()

    def seen(self) -> np.ndarray:
        """The digests in force at the checkpoint, as 16-byte items (filter.DigestSet takes them)."""
        return self._mapped(self.log, DEDUP_LOG, self.digests)

    def near_seen(self) -> np.ndarray:
        """The fuzzy_dedup records in force at the checkpoint (fuzzy.NearIndex takes them)."""
        return self._mapped(self.near_log, NEAR_LOG, self.near_records)

    def _mapped(self, log: Any, name: str, items: int) -> np.ndarray:
        log.flush()
        if not items:
            return np.zeros(0, dtype=f"V{DIGEST_BYTES}")
        # Mapped, not read: a set is built from it a slice at a time (a long run's log can pass the budget).
        return np.memmap(self.out_dir / name, dtype=f"V{DIGEST_BYTES}", mode="r", shape=(items,))

    def chunk_done(self, rows: int, digests: list[bytes], state: Any, near: list[bytes] = ()) -> bool:
        """A chunk is accounted for and written; state() gives the rest of the checkpoint when one is due.
        near: the fuzzy_dedup records it added. True when a checkpoint was written."""
        with writing(self.out_dir / DEDUP_LOG):
            self.log.write(b"".join(digests))
        if near:
            with writing(self.out_dir / NEAR_LOG):
                self.near_log.write(b"".join(near))
            self.near_records += sum(len(n) for n in near) // DIGEST_BYTES
        self.digests += len(digests)
        self.rows_done += rows
        if time.monotonic() - self.last < self.every:
            return False
        self.save(state())
        return True

    def save(self, state: dict[str, Any]) -> None:
        with writing(self.out_dir / DEDUP_LOG):
            self.log.flush()
        with writing(self.out_dir / NEAR_LOG):
            self.near_log.flush()
        failpoint("checkpoint", self.out_dir / CHECKPOINT)
        write_json_atomic(self.out_dir / CHECKPOINT, {"identity": self.identity, "rows_done": self.rows_done,
                                                      "dedup_digests": self.digests,
                                                      "near_records": self.near_records, **state})
        self.rows_saved = self.rows_done
        failpoint("checkpoint_written")
        self.last = time.monotonic()

    def close(self, failed: bool = False) -> None:
        """Close the logs. failed: the run stopped on an error, which is the one to tell; a full disk fails
        the logs' last flush too, and what a log holds past the checkpoint is cut off by --resume anyway."""
        for name, log in ((DEDUP_LOG, self.log), (NEAR_LOG, self.near_log)):
            with contextlib.suppress(OSError) if failed else writing(self.out_dir / name):
                log.close()

    def finish(self) -> None:
        """The run is complete (manifest written): the checkpoint and the dedup logs are no longer needed."""
        self.close(failed=True)  # what they still buffer is not needed either
        for name in (CHECKPOINT, DEDUP_LOG, NEAR_LOG):
            (self.out_dir / name).unlink(missing_ok=True)


def _log(path: Path, length: int | None) -> Any:
    """An append-only log: new (length None), or the one a checkpoint refers to, cut back to its length."""
    if length is None or (not length and not path.exists()):
        return create(path)  # closed in Checkpointer.close()
    handle = open(path, "r+b")  # noqa: SIM115
    handle.truncate(length)
    handle.seek(0, 2)
    return handle
