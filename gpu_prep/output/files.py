"""Durable files: written under a temporary name, flushed to disk, renamed once complete; checksums.

Every file a run leaves (shards, meta.json, the manifest, the rejects file, checkpoints) goes through
these, so a run killed at any moment leaves no file under a final name that is not complete. Temporary
names are hidden and end in .tmp, which is what cleanup after a failed run removes.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


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


def sha256_file(path: Path | str) -> str | None:
    """The file's sha256 (None for what is not a local file, a URL or a hub dataset: hashing it would read
    it all a second time)."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
